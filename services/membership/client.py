"""Clients of the node's membership agent, for the edge and the partition service.

`ViewWatcher` keeps the newest agreed view, reconnects with backoff when the agent is away (a
dead agent never makes a service hang: the last view stays in force), and calls a listener on
every newer view; the partition service passes its incarnation and what it speaks of the
inter-node protocol, which the agent registers for as long as the watch is open.
`MembershipClient` asks for view changes (Propose) and follows the node's liveness lease
(Lease), its stream reconnecting on its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.node_protocol import Support
from hexmq.service import cancel_and_wait

log = logging.getLogger(__name__)

ViewListener = Callable[[pb.View], Awaitable[None]]
LeaseListener = Callable[[pb.LeaseState], None]

_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 2.0


class ViewWatcher:
    def __init__(
        self,
        target: str,
        listener: ViewListener,
        incarnation: int = 0,
        protocol: Support | None = None,
    ) -> None:
        self._target = target
        self._listener = listener
        self._incarnation = incarnation
        self._protocol = protocol
        self.view: pb.View | None = None
        self._have_view = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="view-watcher")

    async def wait_ready(self) -> pb.View:
        """The first view (callers bound the wait with asyncio.timeout)."""
        await self._have_view.wait()
        assert self.view is not None
        return self.view

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        backoff = _FIRST_BACKOFF_S
        while True:
            try:
                async with grpc.aio.insecure_channel(self._target) as channel:
                    stub = pb_grpc.MembershipServiceStub(channel)
                    after = self.view.epoch if self.view is not None else 0
                    request = pb.WatchRequest(
                        after_epoch=after,
                        incarnation=self._incarnation,
                        protocol=self._protocol.to_proto() if self._protocol else None,
                    )
                    async for view in stub.Watch(request):
                        backoff = _FIRST_BACKOFF_S
                        if self.view is None or view.epoch > self.view.epoch:
                            self.view = view
                            await self._tell(view)
                            self._have_view.set()
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    # The agent refuses this process (no protocol version in common): say why.
                    log.error("membership %s refuses the watch: %s", self._target, exc.details())
                else:
                    log.warning(
                        "membership %s unreachable (%s); keeping view epoch %s",
                        self._target,
                        exc.code().name,
                        self.view.epoch if self.view else None,
                    )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _tell(self, view: pb.View) -> None:
        # A listener's bug must not stop the views that follow: later views may fix what this
        # one could not apply, and a service stuck on an old view is worse than a logged error.
        try:
            await self._listener(view)
        except Exception:
            log.exception("the view listener failed on view epoch %d; watching on", view.epoch)


class MembershipClient:
    """Propose and Lease for the node's partition service."""

    def __init__(self, target: str, incarnation: int) -> None:
        self._target = target
        self._incarnation = incarnation
        self._channel: grpc.aio.Channel | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self.lease: pb.LeaseState | None = None

    def _stub(self) -> pb_grpc.MembershipServiceStub:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._target)
        return pb_grpc.MembershipServiceStub(self._channel)

    async def propose(
        self,
        in_sync: Sequence[pb.InSyncChange] = (),
        handovers: Sequence[pb.Handover] = (),
        *,
        deadline_s: float = 10.0,
    ) -> pb.ProposeReply:
        """Ask for view changes; the reply names the view epoch in which they hold (or the
        current one, if they are not agreed within the agent's bound). Raises
        grpc.aio.AioRpcError (UNAVAILABLE: no view yet or no agent; FAILED_PRECONDITION: a stale
        incarnation; INVALID_ARGUMENT: a malformed change)."""
        request = pb.ProposeRequest(
            incarnation=self._incarnation, in_sync=list(in_sync), handovers=list(handovers)
        )
        reply: pb.ProposeReply = await self._stub().Propose(request, timeout=deadline_s)
        return reply

    def follow_lease(self, listener: LeaseListener) -> None:
        """Call `listener` with every LeaseState, reconnecting while the agent is away (then
        the last state stands; its valid_for_ms tells how long it can be trusted)."""
        self._lease_task = asyncio.create_task(self._follow(listener), name="lease")

    async def _follow(self, listener: LeaseListener) -> None:
        backoff = _FIRST_BACKOFF_S
        while True:
            try:
                async for state in self._stub().Lease(pb.LeaseRequest()):
                    backoff = _FIRST_BACKOFF_S
                    self.lease = state
                    try:
                        listener(state)
                    except Exception:
                        log.exception("the lease listener failed; following on")
            except grpc.aio.AioRpcError as exc:
                log.warning("lease stream to %s broke (%s)", self._target, exc.code().name)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def close(self) -> None:
        await cancel_and_wait(self._lease_task)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
