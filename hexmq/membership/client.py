"""Clients of the node's membership agent, for the edge and the partition service.

`ViewWatcher` keeps the newest agreed view, reconnects with backoff when the agent is away (a
dead agent never makes a service hang: the last view stays in force), and calls a listener on
every newer view; the partition service passes its incarnation and what it speaks of the
inter-node protocol, which the agent registers for as long as the watch is open.
`leave_cluster` asks the agent to take the node out. (The partition service's Propose and
Lease calls are services/partition/agreement.py.)

Each takes a `dial` that makes a channel to the agent (hexmq.trust.grpc_tls: mutual TLS as
the node's own certificate, or plain text with --insecure-cluster).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.node_protocol import Support
from hexmq.service import cancel_and_wait
from hexmq.streams import CONNECT_TIMEOUT, Dial, channel_ready, stop_if_cancelled
from hexmq.trust.grpc_tls import PeerRefused

log = logging.getLogger(__name__)

ViewListener = Callable[[pb.View], Awaitable[None]]

_FIRST_BACKOFF_S = 0.05
_MAX_BACKOFF_S = 2.0


class ViewWatcher:
    def __init__(
        self,
        target: str,
        listener: ViewListener,
        incarnation: int = 0,
        protocol: Support | None = None,
        *,
        dial: Dial,
        node_id: str = "",
    ) -> None:
        self._target = target
        self._dial = dial
        # The node whose agent this is: hexmq_links_down{link="membership", peer=node_id}
        # shows whether the watch is connected ("": not shown).
        self._node_id = node_id
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

    def _show(self, down: bool) -> None:
        if self._node_id:
            telemetry.METRICS.links_down.labels("membership", self._node_id).set(int(down))

    async def _run(self) -> None:
        backoff = _FIRST_BACKOFF_S
        self._show(down=True)
        while True:
            try:
                async with self._dial() as channel:
                    # Connected first (a watch may bring nothing for long): the metric says so.
                    await channel_ready(channel)
                    self._show(down=False)
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
            except PeerRefused as exc:
                log.error("not watching membership %s: %s", self._target, exc)
            except TimeoutError:
                log.warning(
                    "membership %s unreachable (no connection within %g s); keeping view epoch %s",
                    self._target,
                    CONNECT_TIMEOUT,
                    self.view.epoch if self.view else None,
                )
            self._show(down=True)
            stop_if_cancelled()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    async def _tell(self, view: pb.View) -> None:
        # A listener's bug must not stop the views that follow: later views may fix what this
        # one could not apply, and a service stuck on an old view is worse than a logged error.
        try:
            await self._listener(view)
        except Exception:
            log.exception("the view listener failed on view epoch %d; watching on", view.epoch)


# A leave that cannot reach the agent (restarting?) retries this often, this many times.
_LEAVE_RETRY_S = 0.5
_LEAVE_TRIES = 4


async def leave_cluster(
    target: str, dial: Dial, timeout_s: float, cut_short: asyncio.Event | None = None
) -> pb.LeaveReply | None:
    """Ask the node's agent at `target` (a channel from `dial`) to take the node out of the
    cluster and wait until it has (the reply says `left`), cannot (`nobody_stays`: the whole
    cluster stops), `timeout_s` has passed, or
    `cut_short` is set (a plain stop signal came). None if the agent could not be asked at
    all: the caller stops anyway, and the node's partitions fail over as after any stop
    (docs/operations.md, "Leaving")."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    reply: pb.LeaveReply | None = None
    failures = 0
    try:
        channel = dial()
    except PeerRefused as exc:
        log.error("leave: not dialling membership %s: %s", target, exc)
        return None
    async with channel:
        stub = pb_grpc.MembershipServiceStub(channel)
        while (left_s := deadline - loop.time()) > 0:
            call = stub.Leave(pb.LeaveRequest(wait_ms=int(left_s * 1000)), timeout=left_s + 1.0)
            waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(call)}
            stopper = None
            if cut_short is not None:
                stopper = asyncio.ensure_future(cut_short.wait())
                waits.add(stopper)
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if stopper is not None and stopper in done:
                call.cancel()
                log.warning("leave cut short by a plain stop")
                return reply
            if stopper is not None:
                stopper.cancel()
            try:
                reply = await call
            except grpc.aio.AioRpcError as exc:
                log.warning("leave: membership %s: %s", target, exc.code().name)
                failures += 1
                if exc.code() != grpc.StatusCode.UNAVAILABLE or failures >= _LEAVE_TRIES:
                    return reply
                await asyncio.sleep(min(_LEAVE_RETRY_S, max(0.0, deadline - loop.time())))
                continue
            if reply.left or reply.nobody_stays:
                return reply
    return reply


DEFAULT_LEAVE_TIMEOUT_S = 60.0


def add_leave_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--leave-timeout",
        type=float,
        default=DEFAULT_LEAVE_TIMEOUT_S,
        metavar="S",
        help="on SIGTERM, how long to wait for the node to leave the cluster (master roles "
        "handed over, RF restored elsewhere) before stopping anyway; SIGINT stops at once "
        f"(default {DEFAULT_LEAVE_TIMEOUT_S:.0f})",
    )


def check_leave_timeout(seconds: float) -> None:
    if not seconds >= 0:
        raise ValueError(f"--leave-timeout must be 0 or more seconds, got {seconds}")


def describe_leave(reply: pb.LeaveReply | None, timeout_s: float) -> str:
    """The log line a service writes when its leave ends, one way or another."""
    if reply is None:
        return "leave: the membership agent could not be asked; stopping without a leave"
    if reply.left:
        return f"left the cluster in view {reply.view_epoch}; stopping"
    if reply.nobody_stays:
        return (
            f"leave: every other member of view {reply.view_epoch} is leaving or gone, nobody "
            f"can take the {reply.partitions_held} partitions held here; stopping without it"
        )
    return (
        f"leave not finished within {timeout_s:.0f}s (view {reply.view_epoch}, "
        f"{reply.partitions_held} partitions still have a replica here); stopping anyway"
    )
