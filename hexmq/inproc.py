"""In-process gRPC: the services of a co-located node (`hexmq node`) calling each other inside
one process, on one event loop, through the very servicer methods their gRPC servers serve.

    local = LocalServer("partition")                 # beside the service's grpc.aio server
    pb_grpc.add_PartitionServiceServicer_to_server(servicer, local)
    await local.start()
    channel = local.channel(Identity(EDGE, "n1"), trust_domain)   # a grpc.aio.Channel
    stub = pb_grpc.PartitionServiceStub(channel)     # the stubs the clients already use
    await local.stop(grace)                          # calls end UNAVAILABLE after the grace

A call hands the request and response messages themselves to the other side (no
serialisation, no socket, no TLS, no second loop): each call's handler runs in a task of its
own, as gRPC runs it, and streams go through bounded pipes (a window of messages, as HTTP/2's
flow control bounds a stream), so a slow reader holds its writer back. What the clients see
is what grpc.aio shows them: `grpc.aio.AioRpcError` with the status the handler ended with
(`context.abort`, UNKNOWN for an exception, DEADLINE_EXCEEDED past a timeout, UNAVAILABLE
while the service is not serving or is stopping), asyncio.CancelledError after their own
`cancel()`; the handler sees its task cancelled when the caller cancels or goes.

The caller's identity is the channel's: `context.auth_context()` says what a verified client
certificate naming it would say (hexmq.trust.identity.from_auth_context), so a servicer's
Guard admits exactly the calls it would admit from that service over mutual TLS. Only code
in the process can make such a channel; remote callers still meet the gRPC servers and their
TLS.

The messages are shared, not copied: neither side may change a message once it has handed it
over (the services build a new message per frame).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, Generic, NoReturn, TypeVar

import grpc
from grpc.aio import Metadata

from hexmq.trust.identity import DEFAULT_TRUST_DOMAIN, Identity

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Resp = TypeVar("Resp")

# Messages a stream buffers each way before its writer waits for the reader.
WINDOW = 16

LOCAL_CANCELLATION = "Locally cancelled by application!"


class _End:
    """What a pipe's reader gets once the pipe is closed and empty."""

    __slots__ = ()


END = _End()


class _Pipe:
    """One direction of a stream: a bounded buffer with one reader. `close` wakes both sides;
    the reader still gets what was buffered, then END."""

    __slots__ = ("_closed", "_getter", "_items", "_putters", "_window")

    def __init__(self, window: int = WINDOW) -> None:
        self._items: deque[Any] = deque()
        self._window = window
        self._closed = False
        self._getter: asyncio.Future[None] | None = None
        self._putters: deque[asyncio.Future[None]] = deque()

    @property
    def closed(self) -> bool:
        return self._closed

    async def put(self, item: Any) -> bool:
        """Buffer `item`, waiting while the window is full; False once the pipe is closed."""
        while len(self._items) >= self._window and not self._closed:
            waiter = asyncio.get_running_loop().create_future()
            self._putters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._putters:
                    self._putters.remove(waiter)
        if self._closed:
            return False
        self._items.append(item)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)
        return True

    async def get(self) -> Any:
        while not self._items:
            if self._closed:
                return END
            waiter = asyncio.get_running_loop().create_future()
            self._getter = waiter
            try:
                await waiter
            finally:
                self._getter = None
        item = self._items.popleft()
        if self._putters:
            putter = self._putters.popleft()
            if not putter.done():
                putter.set_result(None)
        return item

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)
        for putter in self._putters:
            if not putter.done():
                putter.set_result(None)


class _Aborted(Exception):
    """Raised by `LocalContext.abort` (grpc.aio raises its own AbortError there)."""


def auth_context_of(identity: Identity, trust_domain: str) -> dict[str, list[bytes]]:
    """What `context.auth_context()` holds for a caller whose verified certificate names
    `identity` (the keys hexmq.trust.identity.from_auth_context reads)."""
    return {
        "transport_security_type": [b"ssl"],
        "x509_subject_alternative_name": [identity.uri(trust_domain).encode()],
    }


class LocalContext(grpc.aio.ServicerContext[Req, Resp]):  # type: ignore[misc]
    """The ServicerContext a handler gets for an in-process call."""

    def __init__(self, call: _Call[Req, Resp]) -> None:
        self._call = call
        self.code: grpc.StatusCode | None = None
        self.details: str | None = None
        self._callbacks: list[Callable[[Any], None]] = []
        self._trailing: Any = ()

    # --- what the servicers use --------------------------------------------------------------

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Any = (),
    ) -> NoReturn:
        if code == grpc.StatusCode.OK:
            # As grpc.aio: an abort with OK is a servicer's bug, reported as UNKNOWN.
            log.error("abort() called with StatusCode.OK; returning UNKNOWN")
            code, details = grpc.StatusCode.UNKNOWN, ""
        self.code, self.details = code, details
        self._trailing = trailing_metadata
        raise _Aborted(details)

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def invocation_metadata(self) -> Any:
        return self._call.metadata

    def peer(self) -> str:
        return f"inproc:{self._call.caller}"

    def peer_identities(self) -> Iterable[bytes] | None:
        return [self._call.caller.uri(self._call.trust_domain).encode()]

    def peer_identity_key(self) -> str | None:
        return "x509_subject_alternative_name"

    def auth_context(self) -> Mapping[str, Iterable[bytes]]:
        return auth_context_of(self._call.caller, self._call.trust_domain)

    def cancelled(self) -> bool:
        return self._call.code is grpc.StatusCode.CANCELLED

    def done(self) -> bool:
        return self._call.finished.done()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._call.finished.done():
            callback(self)
        else:
            self._callbacks.append(callback)

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    # --- the reader/writer style of a handler --------------------------------------------------

    async def read(self) -> Any:
        return await self._call.server_read()

    async def write(self, message: Any) -> None:
        await self._call.server_write(message)

    async def send_initial_metadata(self, initial_metadata: Any) -> None:
        pass

    def set_trailing_metadata(self, trailing_metadata: Any) -> None:
        self._trailing = trailing_metadata

    def trailing_metadata(self) -> Any:
        return self._trailing

    def code_and_details(self) -> tuple[grpc.StatusCode | None, str | None]:
        return self.code, self.details

    def set_compression(self, compression: grpc.Compression) -> None:
        pass

    def disable_next_message_compression(self) -> None:
        pass

    def run_callbacks(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("a done callback of an in-process call failed")


class _Call(Generic[Req, Resp]):
    """One in-process call, both sides: the handler's task, the pipes, the final status."""

    def __init__(
        self,
        server: LocalServer,
        method: str,
        handler: grpc.RpcMethodHandler,
        caller: Identity,
        trust_domain: str,
        timeout: float | None,
        metadata: Any,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.server = server
        self.method = method
        self.handler = handler
        self.caller = caller
        self.trust_domain = trust_domain
        self.metadata = Metadata(*metadata) if metadata else Metadata()
        self.code: grpc.StatusCode | None = None
        self.details: str = ""
        self.finished: asyncio.Future[None] = loop.create_future()
        self.locally_cancelled = False
        self.response: Any = None
        self.context: LocalContext[Req, Resp] = LocalContext(self)
        self.requests: _Pipe | None = _Pipe() if handler.request_streaming else None
        self.responses: _Pipe | None = _Pipe() if handler.response_streaming else None
        self._feeder: asyncio.Task[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._deadline: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        if timeout is not None:
            self._deadline = loop.time() + timeout
            self._timer = loop.call_later(
                timeout, self.finish, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
            )

    def begin(self, request: Any) -> None:
        """Start the handler with the request (unary) or the request iterator (streaming;
        None: the caller writes with `write`)."""
        if not self.server.serving:
            self.finish(grpc.StatusCode.UNAVAILABLE, f"{self.server.name}: not serving")
            return
        self.server.calls.add(self)
        if self.requests is not None:
            if request is not None:
                self._feeder = asyncio.create_task(self._feed(request), name="inproc-requests")
            argument: Any = self._server_requests()
        else:
            argument = request
        self._task = asyncio.create_task(self._serve(argument), name=f"inproc{self.method}")

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - asyncio.get_running_loop().time())

    # --- the handler's side -----------------------------------------------------------------

    async def _serve(self, argument: Any) -> None:
        handler, context = self.handler, self.context
        try:
            if handler.unary_unary is not None:
                self.response = await handler.unary_unary(argument, context)
            elif handler.stream_unary is not None:
                self.response = await handler.stream_unary(argument, context)
            else:
                behaviour = handler.unary_stream or handler.stream_stream
                assert behaviour is not None
                produced = behaviour(argument, context)
                if isinstance(produced, AsyncGenerator):
                    try:
                        async for message in produced:
                            await self.server_write(message)
                    finally:
                        # Its `finally` runs now, whatever ended the call (as the handler's
                        # would when gRPC cancels it while it waits).
                        await produced.aclose()
                else:
                    # A handler that writes with context.write and returns.
                    await produced
        except _Aborted:
            pass
        except asyncio.CancelledError:
            if self.code is None:
                self.finish(grpc.StatusCode.CANCELLED, "handler cancelled")
            return
        except Exception as exc:
            # As grpc.aio reports a handler's exception (and logs it).
            log.exception("in-process handler %s failed", self.method)
            if self.code is None:
                self.finish(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
            return
        code = context.code or grpc.StatusCode.OK
        self.finish(code, context.details or "")

    async def _server_requests(self) -> AsyncIterator[Any]:
        while True:
            message = await self.server_read()
            if message is grpc.aio.EOF:
                return
            yield message

    async def server_read(self) -> Any:
        assert self.requests is not None
        message = await self.requests.get()
        return grpc.aio.EOF if message is END else message

    async def server_write(self, message: Any) -> None:
        assert self.responses is not None
        if not await self.responses.put(message):
            # The call ended (the caller cancelled or went): the handler stops here.
            raise asyncio.CancelledError

    # --- the caller's side ------------------------------------------------------------------

    async def _feed(self, requests: AsyncIterable[Any] | Iterable[Any]) -> None:
        pipe = self.requests
        assert pipe is not None
        try:
            if isinstance(requests, AsyncIterable):
                async for message in requests:
                    if not await pipe.put(message):
                        return
            else:
                for message in requests:
                    if not await pipe.put(message):
                        return
            pipe.close()
        except asyncio.CancelledError:
            raise
        except Exception:
            # As grpc.aio: a request iterator that raises cancels the call.
            log.debug("in-process %s: the request iterator raised", self.method, exc_info=True)
            self.cancel()
        finally:
            if isinstance(requests, AsyncGenerator):
                await requests.aclose()

    def cancel(self) -> bool:
        if self.code is not None:
            return False
        self.locally_cancelled = True
        self.finish(grpc.StatusCode.CANCELLED, LOCAL_CANCELLATION)
        return True

    def finish(self, code: grpc.StatusCode, details: str) -> None:
        """End the call with this status (the first status wins): both pipes close, the
        handler's task and the request feeder are cancelled, done callbacks run."""
        if self.code is not None:
            return
        self.code, self.details = code, details
        if self._timer is not None:
            self._timer.cancel()
        for pipe in (self.requests, self.responses):
            if pipe is not None:
                pipe.close()
        current = asyncio.current_task()
        for task in (self._task, self._feeder):
            if task is not None and task is not current and not task.done():
                task.cancel()
        self.server.calls.discard(self)
        self.finished.set_result(None)
        self.context.run_callbacks()

    def error(self) -> BaseException:
        """What the caller is raised once the call failed."""
        if self.locally_cancelled:
            return asyncio.CancelledError()
        assert self.code is not None
        error: BaseException = grpc.aio.AioRpcError(
            self.code, Metadata(), Metadata(), details=self.details, debug_error_string=None
        )
        return error

    async def wait(self) -> None:
        """Until the call ends; a cancelled waiter cancels the call (as grpc.aio does)."""
        try:
            await asyncio.shield(self.finished)
        except asyncio.CancelledError:
            self.cancel()
            raise

    async def client_read(self) -> Any:
        pipe = self.responses
        assert pipe is not None
        try:
            message = await pipe.get()
        except asyncio.CancelledError:
            self.cancel()
            raise
        if message is not END:
            return message
        # A pipe closes only as the call ends: the status is there.
        if self.code == grpc.StatusCode.OK:
            return grpc.aio.EOF
        raise self.error()

    async def client_write(self, message: Any) -> None:
        pipe = self.requests
        assert pipe is not None
        if pipe.closed or not await pipe.put(message):
            await self._raise_status("write after done_writing or the end of the call")

    async def client_done_writing(self) -> None:
        if self.requests is not None:
            self.requests.close()

    async def _raise_status(self, what: str) -> None:
        if self.code is None:
            raise asyncio.InvalidStateError(what)
        if self.code == grpc.StatusCode.OK:
            raise asyncio.InvalidStateError(f"the call already ended: {what}")
        raise self.error()


class _CallView(Generic[Req, Resp]):
    """The caller's handle on a call: what grpc.aio's call objects offer."""

    def __init__(self, call: _Call[Req, Resp]) -> None:
        self._call = call

    def cancelled(self) -> bool:
        return self._call.code is grpc.StatusCode.CANCELLED

    def done(self) -> bool:
        return self._call.finished.done()

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    def cancel(self) -> bool:
        return self._call.cancel()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._call.finished.add_done_callback(lambda _f: callback(self))

    async def initial_metadata(self) -> Metadata:
        return Metadata()

    async def trailing_metadata(self) -> Metadata:
        await self._call.wait()
        return Metadata()

    async def code(self) -> grpc.StatusCode:
        await self._call.wait()
        assert self._call.code is not None
        return self._call.code

    async def details(self) -> str:
        await self._call.wait()
        return self._call.details

    async def wait_for_connection(self) -> None:
        if self._call.code not in (None, grpc.StatusCode.OK):
            raise self._call.error()


class LocalUnaryResponseCall(_CallView[Req, Resp]):
    """A unary-unary or stream-unary call: awaitable, as often as wanted, for the response."""

    def __await__(self) -> Any:
        return self._response().__await__()

    async def _response(self) -> Resp:
        call = self._call
        await call.wait()
        if call.code != grpc.StatusCode.OK:
            raise call.error()
        response: Resp = call.response
        return response

    async def write(self, request: Req) -> None:
        await self._call.client_write(request)

    async def done_writing(self) -> None:
        await self._call.client_done_writing()


class LocalStreamResponseCall(_CallView[Req, Resp]):
    """A unary-stream or stream-stream call: async iteration or `read()`."""

    def __aiter__(self) -> AsyncIterator[Resp]:
        return self._messages()

    async def _messages(self) -> AsyncIterator[Resp]:
        while True:
            message = await self._call.client_read()
            if message is grpc.aio.EOF:
                return
            yield message

    async def read(self) -> Any:
        return await self._call.client_read()

    async def write(self, request: Req) -> None:
        await self._call.client_write(request)

    async def done_writing(self) -> None:
        await self._call.client_done_writing()


class _MultiCallable:
    """One method of a LocalChannel (what a stub's attribute is)."""

    def __init__(self, channel: LocalChannel, method: str, *, request_streaming: bool) -> None:
        self._channel = channel
        self._method = method
        self._request_streaming = request_streaming

    def __call__(
        self,
        request: Any = None,
        *,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self._channel.start_call(self._method, request, timeout, metadata)


class LocalChannel(grpc.aio.Channel):  # type: ignore[misc]
    """A grpc.aio.Channel to one LocalServer, calling as `caller`. Ready while the server
    serves (`channel_ready` waits for it, as a channel waits for its server to listen)."""

    def __init__(self, server: LocalServer, caller: Identity, trust_domain: str) -> None:
        self._server = server
        self._caller = caller
        self._trust_domain = trust_domain
        self._closed = False
        self._calls: set[_Call[Any, Any]] = set()

    async def __aenter__(self) -> LocalChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, grace: float | None = None) -> None:
        """As grpc.aio's close: the calls still running on the channel are cancelled."""
        self._closed = True
        for call in list(self._calls):
            call.finish(grpc.StatusCode.CANCELLED, "Channel closed!")

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        if self._closed:
            return grpc.ChannelConnectivity.SHUTDOWN
        if self._server.serving:
            return grpc.ChannelConnectivity.READY
        return grpc.ChannelConnectivity.CONNECTING

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        if self.get_state() == last_observed_state:
            await self._server.next_change()

    async def channel_ready(self) -> None:
        await self._server.wait_serving()

    def start_call(
        self, method: str, request: Any, timeout: float | None, metadata: Any
    ) -> _CallView[Any, Any]:
        handler = self._server.handler(method)
        if handler is None:
            raise ValueError(f"in-process channel: no handler for {method}")
        call: _Call[Any, Any] = _Call(
            self._server, method, handler, self._caller, self._trust_domain, timeout, metadata
        )
        view: _CallView[Any, Any] = (
            LocalStreamResponseCall(call)
            if handler.response_streaming
            else LocalUnaryResponseCall(call)
        )
        if self._closed:
            call.finish(grpc.StatusCode.CANCELLED, "Channel closed!")
            return view
        self._calls.add(call)
        call.finished.add_done_callback(lambda _f: self._calls.discard(call))
        call.begin(request)
        return view

    def unary_unary(self, method: str, *_args: Any, **_kwargs: Any) -> Any:
        return _MultiCallable(self, method, request_streaming=False)

    def unary_stream(self, method: str, *_args: Any, **_kwargs: Any) -> Any:
        return _MultiCallable(self, method, request_streaming=False)

    def stream_unary(self, method: str, *_args: Any, **_kwargs: Any) -> Any:
        return _MultiCallable(self, method, request_streaming=True)

    def stream_stream(self, method: str, *_args: Any, **_kwargs: Any) -> Any:
        return _MultiCallable(self, method, request_streaming=True)


class LocalServer(grpc.aio.Server):  # type: ignore[misc]
    """A service's servicers, served to the rest of its process. Filled by the generated
    `add_*Servicer_to_server(servicer, local)` beside the gRPC server, started and stopped
    with it; it listens on nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []
        self.serving = False
        self._serving = asyncio.Event()
        self._change = asyncio.Event()
        self.calls: set[_Call[Any, Any]] = set()

    def channel(self, caller: Identity, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> LocalChannel:
        """A channel to this server, its calls made as `caller`."""
        return LocalChannel(self, caller, trust_domain)

    def handler(self, method: str) -> grpc.RpcMethodHandler | None:
        found = self._handlers.get(method)
        if found is not None:
            return found
        details = _HandlerCallDetails(method, ())
        for generic in self._generic:
            found = generic.service(details)
            if found is not None:
                return found
        return None

    # --- grpc.aio.Server ------------------------------------------------------------------------

    def add_generic_rpc_handlers(
        self, generic_rpc_handlers: Sequence[grpc.GenericRpcHandler]
    ) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in method_handlers.items():
            self._handlers[f"/{service_name}/{name}"] = handler

    def add_insecure_port(self, address: str) -> int:
        raise NotImplementedError("an in-process server listens on nothing")

    def add_secure_port(self, address: str, server_credentials: grpc.ServerCredentials) -> int:
        raise NotImplementedError("an in-process server listens on nothing")

    async def start(self) -> None:
        self.serving = True
        self._serving.set()
        self._changed()

    def _changed(self) -> None:
        self._change.set()
        self._change = asyncio.Event()

    async def next_change(self) -> None:
        """Until the server starts or stops."""
        await self._change.wait()

    async def wait_serving(self) -> None:
        await self._serving.wait()

    async def stop(self, grace: float | None) -> None:
        """As grpc.aio's: no new call from now on (UNAVAILABLE), the calls under way have
        `grace` seconds to end, then end UNAVAILABLE."""
        self.serving = False
        self._serving.clear()
        self._changed()
        if grace and self.calls:
            await asyncio.wait([c.finished for c in self.calls], timeout=grace)
        for call in list(self.calls):
            call.finish(grpc.StatusCode.UNAVAILABLE, f"{self.name}: the service is stopping")

    async def wait_for_termination(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109 (grpc.aio.Server's signature)
        """True once the server is not serving, False if `timeout` passed first."""
        try:
            async with asyncio.timeout(timeout):
                while self.serving:
                    await self.next_change()
        except TimeoutError:
            return False
        return True


class _HandlerCallDetails(grpc.HandlerCallDetails):  # type: ignore[misc]
    def __init__(self, method: str, invocation_metadata: Any) -> None:
        self.method = method
        self.invocation_metadata = invocation_metadata


class NodeServers:
    """A co-located node's in-process servers (`hexmq node`): its membership agent's and its
    partition service's, which the node's other services call instead of dialling them. Each
    service registers its servicer here beside its gRPC server, which still serves the other
    nodes."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.membership = LocalServer("membership")
        self.partition = LocalServer("partition")

    def to_membership(self, caller_role: str, trust_domain: str) -> LocalChannel:
        """A channel to the node's agent, calling as the node's service `caller_role`."""
        return self.membership.channel(Identity(caller_role, self.node_id), trust_domain)

    def to_partition(self, caller_role: str, trust_domain: str) -> LocalChannel:
        return self.partition.channel(Identity(caller_role, self.node_id), trust_domain)


async def stop_servers(grace: float, server: grpc.aio.Server, local: LocalServer | None) -> None:
    """Stop a service's gRPC server and, in a co-located node, its in-process twin, together
    (the same grace for the calls of both)."""
    if local is None:
        await server.stop(grace=grace)
    else:
        await asyncio.gather(server.stop(grace=grace), local.stop(grace))
