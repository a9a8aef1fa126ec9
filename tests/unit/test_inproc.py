"""hexmq/inproc.py: in-process calls behave as grpc.aio calls do. Each scenario runs twice over
one small servicer: through a real grpc.aio server on loopback and through a LocalServer, and
must see the same responses, status codes and cancellations on both sides."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import wrappers_pb2

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.inproc import LocalServer, auth_context_of
from hexmq.trust import certs
from hexmq.trust.grpc_tls import ClusterTLS, TLSFiles
from hexmq.trust.guard import Guard
from hexmq.trust.identity import EDGE, PARTITION, Identity, from_auth_context
from tests.support.eventually import eventually

Text = wrappers_pb2.StringValue
SERVICE = "hexmq.test.Talk"


class Talk:
    """The small servicer: what each method does depends on the request's text."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.seen: list[Any] = []
        self.ended = asyncio.Event()

    async def echo(self, request: Text, context: grpc.aio.ServicerContext) -> Text:
        self.seen.append(request)
        if request.value == "abort":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing")
        if request.value == "boom":
            raise ValueError("boom")
        if request.value == "slow":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.append("echo")
                raise
        if request.value == "whoami":
            caller = from_auth_context(context.auth_context())
            return Text(value=str(caller))
        return request if request.value == "same" else Text(value=request.value.upper())

    async def count(self, request: Text, context: grpc.aio.ServicerContext) -> AsyncIterator[Text]:
        try:
            for i in range(int(request.value.split()[0])):
                if request.value.endswith("abort") and i == 2:
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "enough")
                yield Text(value=str(i))
            if request.value.endswith("hang"):
                await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.append("count")
            raise
        finally:
            self.ended.set()

    async def chat(
        self, requests: AsyncIterator[Text], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Text]:
        try:
            async for request in requests:
                if request.value == "bye":
                    return
                if request.value == "fail":
                    raise RuntimeError("chat failed")
                yield Text(value=request.value.upper())
            yield Text(value="done")
        except asyncio.CancelledError:
            self.cancelled.append("chat")
            raise
        finally:
            self.ended.set()

    async def total(self, requests: AsyncIterator[Text], context: grpc.aio.ServicerContext) -> Text:
        return Text(value="+".join([r.value async for r in requests]))

    def handler(self) -> grpc.GenericRpcHandler:
        ser, de = Text.SerializeToString, Text.FromString
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Echo": grpc.unary_unary_rpc_method_handler(self.echo, de, ser),
                "Count": grpc.unary_stream_rpc_method_handler(self.count, de, ser),
                "Chat": grpc.stream_stream_rpc_method_handler(self.chat, de, ser),
                "Total": grpc.stream_unary_rpc_method_handler(self.total, de, ser),
            },
        )


class Served:
    """The servicer behind one transport, and stubs to it."""

    def __init__(self, kind: str, talk: Talk) -> None:
        self.kind = kind
        self.talk = talk
        self.server: Any = None
        self.channel: Any = None

    async def start(self) -> None:
        if self.kind == "grpc":
            self.server = grpc.aio.server()
            self.server.add_generic_rpc_handlers((self.talk.handler(),))
            port = self.server.add_insecure_port("127.0.0.1:0")
            await self.server.start()
            self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        else:
            self.server = LocalServer("talk")
            self.server.add_generic_rpc_handlers((self.talk.handler(),))
            await self.server.start()
            self.channel = self.server.channel(Identity(EDGE, "n1"))

    def method(self, kind: str, name: str) -> Any:
        ser, de = Text.SerializeToString, Text.FromString
        factory = getattr(self.channel, kind)
        return factory(f"/{SERVICE}/{name}", request_serializer=ser, response_deserializer=de)

    def echo(self, text: str, **kw: Any) -> Any:
        return self.method("unary_unary", "Echo")(Text(value=text), **kw)

    def count(self, text: str, **kw: Any) -> Any:
        return self.method("unary_stream", "Count")(Text(value=text), **kw)

    def chat(self, requests: Any = None, **kw: Any) -> Any:
        return self.method("stream_stream", "Chat")(requests, **kw)

    def total(self, requests: Any = None, **kw: Any) -> Any:
        return self.method("stream_unary", "Total")(requests, **kw)

    async def close(self) -> None:
        await self.channel.close()
        await self.server.stop(None)


@pytest.fixture(params=["grpc", "inproc"])
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    s = Served(request.param, Talk())
    await s.start()
    yield s
    await s.close()


async def _texts(*values: str, then: asyncio.Event | None = None) -> AsyncIterator[Text]:
    for value in values:
        yield Text(value=value)
    if then is not None:
        await then.wait()


async def _code(call: Any) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


# --- unary ----------------------------------------------------------------------------------


async def test_unary_answers_and_fails_with_the_handlers_status(served: Served) -> None:
    assert (await served.echo("hi")).value == "HI"
    with pytest.raises(grpc.aio.AioRpcError) as aborted:
        await served.echo("abort")
    assert (aborted.value.code(), aborted.value.details()) == (
        grpc.StatusCode.NOT_FOUND,
        "no such thing",
    )
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await served.echo("boom")
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    assert "boom" in (failed.value.details() or "")


async def test_a_call_can_be_awaited_again_once_done(served: Served) -> None:
    call = served.echo("twice")
    first = await asyncio.ensure_future(call)
    assert (await call).value == first.value == "TWICE"
    assert call.done()
    assert await call.code() == grpc.StatusCode.OK


async def test_past_its_timeout_a_call_ends_deadline_exceeded_and_the_handler_is_cancelled(
    served: Served,
) -> None:
    assert await _code(served.echo("slow", timeout=0.2)) == grpc.StatusCode.DEADLINE_EXCEEDED
    await eventually(lambda: served.talk.cancelled == ["echo"], timeout=5)


async def test_a_caller_that_cancels_sees_cancelled_error_and_the_handler_is_cancelled(
    served: Served,
) -> None:
    call = served.echo("slow")
    await eventually(lambda: len(served.talk.seen) == 1, timeout=5)
    assert call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert call.cancelled()
    assert await call.code() == grpc.StatusCode.CANCELLED
    await eventually(lambda: served.talk.cancelled == ["echo"], timeout=5)


async def test_cancelling_the_awaiting_task_cancels_the_call(served: Served) -> None:
    call = served.echo("slow")
    waiting = asyncio.ensure_future(call)
    await eventually(lambda: len(served.talk.seen) == 1, timeout=5)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await eventually(lambda: served.talk.cancelled == ["echo"], timeout=5)


# --- streams ---------------------------------------------------------------------------------


async def test_server_streaming_brings_every_message_then_the_status(served: Served) -> None:
    assert [m.value async for m in served.count("4")] == ["0", "1", "2", "3"]
    aborting = served.count("5 abort")
    assert [(await aborting.read()).value, (await aborting.read()).value] == ["0", "1"]
    with pytest.raises(grpc.aio.AioRpcError) as aborted:
        await aborting.read()
    assert aborted.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    call = served.count("2")
    assert [(await call.read()).value, (await call.read()).value] == ["0", "1"]
    assert await call.read() is grpc.aio.EOF


async def test_a_server_stream_cancelled_by_its_reader_ends_the_handler(served: Served) -> None:
    call = served.count("1 hang")
    assert (await call.read()).value == "0"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call.read()
    await eventually(lambda: served.talk.cancelled == ["count"], timeout=5)
    await asyncio.wait_for(served.talk.ended.wait(), 5)


async def test_bidi_with_a_request_iterator(served: Served) -> None:
    assert [m.value async for m in served.chat(_texts("a", "b"))] == ["A", "B", "done"]
    # The handler ends the stream while the caller would still send: the caller sees the end.
    more = asyncio.Event()
    assert [m.value async for m in served.chat(_texts("x", "bye", then=more))] == ["X"]


async def test_bidi_with_write_read_and_done_writing(served: Served) -> None:
    call = served.chat()
    await call.write(Text(value="one"))
    assert (await call.read()).value == "ONE"
    await call.write(Text(value="two"))
    await call.done_writing()
    assert [(await call.read()).value, (await call.read()).value] == ["TWO", "done"]
    assert await call.read() is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    total = served.total()
    for value in ("1", "2", "3"):
        await total.write(Text(value=value))
    await total.done_writing()
    assert (await total).value == "1+2+3"
    assert (await served.total(_texts("a", "b"))).value == "a+b"


async def test_a_bidi_handler_that_raises_ends_the_call_unknown(served: Served) -> None:
    call = served.chat(_texts("ok", "fail", then=asyncio.Event()))
    assert (await call.read()).value == "OK"
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await call.read()
    assert failed.value.code() == grpc.StatusCode.UNKNOWN


async def test_a_bidi_call_cancelled_by_the_caller_ends_the_handler(served: Served) -> None:
    call = served.chat(_texts("a", then=asyncio.Event()))
    assert (await call.read()).value == "A"
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call.read()
    assert call.cancelled()
    # gRPC ends the handler's request iterator and closes its generator; in process its task
    # is cancelled: either way the handler ends and its `finally` runs.
    await asyncio.wait_for(served.talk.ended.wait(), 5)


async def test_a_request_iterator_that_raises_cancels_the_call(served: Served) -> None:
    async def broken() -> AsyncIterator[Text]:
        yield Text(value="a")
        await asyncio.sleep(0.05)
        raise OSError("the caller's iterator broke")

    call = served.chat(broken())
    assert (await call.read()).value == "A"
    with pytest.raises(asyncio.CancelledError):
        await call.read()
    await asyncio.wait_for(served.talk.ended.wait(), 5)


async def test_a_stopping_server_refuses_new_calls_and_ends_running_ones_after_the_grace(
    served: Served,
) -> None:
    call = served.chat(_texts("a", then=asyncio.Event()))
    assert (await call.read()).value == "A"
    await served.server.stop(0.1)
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await call.read()
    assert ended.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
    if served.kind == "inproc":
        # What the clients' failover logic takes for a peer that went (hexmq.streams).
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert await _code(served.echo("late", timeout=2)) == grpc.StatusCode.UNAVAILABLE


# --- in-process only ----------------------------------------------------------------------------


async def test_in_process_calls_hand_over_the_message_objects_themselves() -> None:
    talk = Talk()
    local = LocalServer("talk")
    local.add_generic_rpc_handlers((talk.handler(),))
    await local.start()
    channel = local.channel(Identity(EDGE, "n1"))
    request = Text(value="same")
    echo = channel.unary_unary(f"/{SERVICE}/Echo")
    assert await echo(request) is request
    assert talk.seen == [request]
    assert talk.seen[0] is request


async def test_a_channel_is_ready_once_its_server_serves() -> None:
    local = LocalServer("talk")
    local.add_generic_rpc_handlers((Talk().handler(),))
    channel = local.channel(Identity(EDGE, "n1"))
    assert channel.get_state() == grpc.ChannelConnectivity.CONNECTING
    ready = asyncio.ensure_future(channel.channel_ready())
    await asyncio.sleep(0.05)
    assert not ready.done()
    assert await _code(channel.unary_unary(f"/{SERVICE}/Echo")(Text(value="x"))) == (
        grpc.StatusCode.UNAVAILABLE
    )
    await local.start()
    await asyncio.wait_for(ready, 1)
    assert channel.get_state() == grpc.ChannelConnectivity.READY
    await channel.close()
    assert await _code(channel.unary_unary(f"/{SERVICE}/Echo")(Text(value="x"))) == (
        grpc.StatusCode.CANCELLED
    )


async def test_the_caller_is_the_channels_identity() -> None:
    local = LocalServer("talk")
    local.add_generic_rpc_handlers((Talk().handler(),))
    await local.start()
    echo = local.channel(Identity(PARTITION, "n2"), "prod").unary_unary(f"/{SERVICE}/Echo")
    reply = await echo(Text(value="whoami"))
    assert reply.value == "None"  # the servicer reads the default trust domain: not this one
    auth = auth_context_of(Identity(PARTITION, "n2"), "prod")
    assert from_auth_context(auth, "prod") == Identity(PARTITION, "n2")
    default = local.channel(Identity(PARTITION, "n2")).unary_unary(f"/{SERVICE}/Echo")
    assert (await default(Text(value="whoami"))).value == "partition n2"


class _LinkOnly(pb_grpc.PartitionServiceServicer):
    """A partition service whose Status admits edges of any node only (its Guard decides)."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusReply:
        await self._guard.admit(context, "Status", roles={EDGE})
        return pb.StatusReply(node_id="n1")


async def test_a_servicers_guard_checks_in_process_callers_as_it_checks_tls_ones(
    tmp_path: Path,
) -> None:
    certs.make_ca(tmp_path)
    me = Identity(PARTITION, "n1")
    pair = certs.issue(tmp_path, me)
    tls = ClusterTLS(me, TLSFiles(tmp_path / "ca.crt", pair.cert, pair.key))
    local = LocalServer("partition")
    pb_grpc.add_PartitionServiceServicer_to_server(_LinkOnly(Guard(tls, "partition")), local)
    await local.start()
    edge = pb_grpc.PartitionServiceStub(local.channel(Identity(EDGE, "n1")))
    assert (await edge.Status(pb.StatusRequest())).node_id == "n1"
    other = pb_grpc.PartitionServiceStub(local.channel(Identity(PARTITION, "n1")))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await other.Status(pb.StatusRequest())
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
