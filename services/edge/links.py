"""PartitionLink: the edge's long-lived, batched gRPC stream to one partition node.

Commands queue up while a frame is on the wire, and for at most one pacing interval after the
last frame (hexmq/pacing.py), and leave together in the next one, so a burst of publishes, or a
steady few thousand a second, costs one gRPC frame per interval, not one each. Results come
back matched by request id and are handed to plain callbacks (no coroutine or future per
message).

The link knows nothing of partitions: the edge's partition commands go through
services/edge/dispatch.py, which sends them only while the link is up and holds them again when
it breaks (`track`). Node-wide queries (`request`) fail at once with STATUS_CODE_UNAVAILABLE
while the stream is down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.grpc_options import LINK_OPTIONS, RECONNECT
from hexmq.pacing import FlushPacer, lazy_linger, wait_for_company
from hexmq.service import cancel_and_wait
from hexmq.streams import Backoff, Dial, keep_streaming

log = logging.getLogger(__name__)

ResultCallback = Callable[[pb.Result], None]

MAX_COMMANDS_PER_FRAME = 2048
MAX_FRAME_BYTES = 1 << 20
# Backpressure: past HIGH_WATER queued commands the link is congested and connections stop
# reading their sockets; they resume once the queue is under LOW_WATER (or the link fails).
HIGH_WATER = 8 * MAX_COMMANDS_PER_FRAME
LOW_WATER = 2 * MAX_COMMANDS_PER_FRAME
# Unanswered expendable requests kept per link (see `track`).
EXPENDABLE_LIMIT = 4096

GRPC_OPTIONS = [
    *LINK_OPTIONS,
    # Reconnect fast after a partition restart or a heal: the edge holds work until the link
    # is back (hexmq/grpc_options.py, RECONNECT).
    *RECONNECT,
]


class LinkListener(Protocol):
    """What a link tells the edge about (implemented by the edge server)."""

    def on_link_up(self, link: PartitionLink) -> None: ...
    def on_link_down(self, link: PartitionLink) -> None: ...
    def on_delivery(self, link: PartitionLink, delivery: pb.Delivery) -> None: ...
    def on_kick(self, link: PartitionLink, kick: pb.Kick) -> None: ...
    def on_index_update(self, link: PartitionLink, update: pb.IndexUpdate) -> None: ...
    def on_publish_will(self, will: pb.PublishWill) -> None: ...
    def on_shared_handoff(self, handoff: pb.SharedHandoff) -> None: ...
    def batched(
        self, handle: Callable[[pb.PartitionFrame], None], frame: pb.PartitionFrame
    ) -> None: ...


# Shared by every plain OK answer; callbacks only read it.
OK_RESULT = pb.Result(status=pb.StatusCode.STATUS_CODE_OK)


def unavailable(node_id: str, why: str = "link down") -> pb.Result:
    return pb.Result(
        status=pb.StatusCode.STATUS_CODE_UNAVAILABLE,
        message=f"partition node {node_id} unavailable: {why}",
    )


class PartitionLink:
    def __init__(
        self,
        node_id: str,
        target: str,
        hello: pb.Hello,
        listener: LinkListener,
        dial: Dial,
    ) -> None:
        self.node_id = node_id
        self.target = target
        # Each attempt's channel (TLS or plain text as the node serves, hexmq.trust.grpc_tls).
        self._dial = dial
        self._hello = hello
        self._listener = listener
        self._next_id = 1
        # request id -> (callback, whether it hears of a broken link: `request` yes, `track` no).
        self._pending: dict[int, tuple[ResultCallback, bool]] = {}
        # Tracked requests whose answer may never come (delivery acknowledgements, which a
        # partition service of an older version does not answer): the newest only.
        self._expendable: OrderedDict[int, ResultCallback] = OrderedDict()
        self._outgoing: list[pb.EdgeCommand] = []
        # Sent ahead of _outgoing: acknowledgements that free a subscriber's delivery window
        # must not wait behind a backlog of publishes.
        self._urgent: list[pb.EdgeCommand] = []
        self._drain_waiters: list[Callable[[], None]] = []
        # One request per frame is timed until its result comes back (gRPC round trip plus the
        # partition's work): request id -> perf_counter at send.
        self._probes: dict[int, float] = {}
        self._latency = telemetry.METRICS.grpc_latency.labels(
            "hexmq.api.partition.v1.PartitionService/Link", "client"
        )
        self._wake = asyncio.Event()
        # Set while a queued command is one someone waits on: commands queued `lazy` alone
        # wait for one, up to the lazy linger (hexmq/pacing.py).
        self._company = asyncio.Event()
        self._pacer = FlushPacer(full=MAX_COMMANDS_PER_FRAME)
        self._linger = telemetry.METRICS.linger("edge_link")
        self._task: asyncio.Task[None] | None = None
        # Bumped per stream: the request generator of a dead stream may still be waiting, and
        # must not take commands meant for its successor.
        self._generation = 0
        # True from the moment the stream is open until it breaks.
        self.connected = False
        # True once the node's subscription index snapshot has arrived on this stream.
        self.ready = False
        # Bumped each time the link becomes ready: the partition behind it may have restarted,
        # so the edge's connections attached through an earlier session re-attach.
        self.session = 0

    def __repr__(self) -> str:
        return f"PartitionLink({self.node_id}@{self.target})"

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"link-{self.node_id}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    def request(self, cmd: pb.EdgeCommand, callback: ResultCallback) -> None:
        """Send a node-wide query; `callback(result)` runs exactly once (UNAVAILABLE if the
        link fails)."""
        if not self.connected:
            callback(unavailable(self.node_id))
            return
        request_id = self._next_id
        self._next_id += 1
        cmd.request_id = request_id
        self._pending[request_id] = (callback, True)
        self._outgoing.append(cmd)
        self._company.set()
        self._wake.set()

    def track(
        self,
        cmd: pb.EdgeCommand,
        callback: ResultCallback,
        *,
        urgent: bool = False,
        expendable: bool = False,
        lazy: bool = False,
    ) -> bool:
        """Send `cmd` with a request id; `callback(result)` runs when its answer comes, and
        never if the link breaks first (the caller learns of that from on_link_down). False if
        the link is down. `expendable`: forgotten, unanswered, once EXPENDABLE_LIMIT newer ones
        wait. `urgent`: as for `send`. `lazy`: nobody waits on it, so it may wait up to the
        lazy linger for a command that goes anyway (hexmq/pacing.py)."""
        if not self.connected:
            return False
        request_id = self._next_id
        self._next_id += 1
        cmd.request_id = request_id
        if expendable:
            waiting = self._expendable
            waiting[request_id] = callback
            if len(waiting) > EXPENDABLE_LIMIT:
                waiting.popitem(last=False)
        else:
            self._pending[request_id] = (callback, False)
        (self._urgent if urgent else self._outgoing).append(cmd)
        if not lazy:
            self._company.set()
        self._wake.set()
        return True

    def send(self, cmd: pb.EdgeCommand, *, urgent: bool = False) -> bool:
        """Send `cmd` without wanting a result; False if the link is down. An urgent command
        goes ahead of queued ones: only for commands whose order against them does not matter
        (delivery acknowledgements)."""
        if not self.connected:
            return False
        (self._urgent if urgent else self._outgoing).append(cmd)
        self._company.set()
        self._wake.set()
        return True

    @property
    def backlog(self) -> int:
        """Commands queued and not yet in a frame."""
        return len(self._outgoing) + len(self._urgent)

    @property
    def congested(self) -> bool:
        return len(self._outgoing) >= HIGH_WATER

    def when_drained(self, resume: Callable[[], None]) -> None:
        """Call `resume()` once the queue is back under LOW_WATER (or the link fails)."""
        self._drain_waiters.append(resume)

    def _release_waiters(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for resume in waiters:
            resume()

    async def _frames(self, generation: int) -> AsyncIterator[pb.EdgeFrame]:
        yield pb.EdgeFrame(hello=self._hello)
        loop = asyncio.get_running_loop()
        pacer, linger = self._pacer, self._linger
        while True:
            while not (self._outgoing or self._urgent) or generation != self._generation:
                if generation != self._generation:
                    return
                self._wake.clear()
                await self._wake.wait()
            # Lazy commands alone (acknowledgements) wait for company, up to the lazy linger.
            waited = await wait_for_company(self._company, lazy_linger())
            if generation != self._generation:
                return
            # At most one frame per pacing interval (hexmq/pacing.py): what arrives while it
            # waits joins the frame; a lone command after a quiet spell goes at once.
            delay = pacer.delay(loop.time(), len(self._outgoing) + len(self._urgent))
            if delay:
                await asyncio.sleep(delay)
                if generation != self._generation:
                    return
            batch, self._urgent = self._urgent, []
            room = max(MAX_COMMANDS_PER_FRAME - len(batch), 0)
            if len(self._outgoing) <= room:
                batch += self._outgoing
                self._outgoing = []
            else:
                batch += self._outgoing[:room]
                self._outgoing = self._outgoing[room:]
            if not self._outgoing:
                self._company.clear()
            if self._drain_waiters and len(self._outgoing) < LOW_WATER:
                self._release_waiters()
            for cmd in batch:
                if cmd.request_id:
                    self._probes[cmd.request_id] = time.perf_counter()
                    break
            pacer.sent(loop.time())
            linger.record(len(batch), waited + delay)
            frame = pb.EdgeFrame(commands=batch)
            if frame.ByteSize() > MAX_FRAME_BYTES and len(batch) > 1:
                # Split big frames so one large payload does not hold up the rest for long.
                half = len(batch) // 2
                yield pb.EdgeFrame(commands=batch[:half])
                yield pb.EdgeFrame(commands=batch[half:])
            else:
                yield frame

    async def _run(self) -> None:
        await keep_streaming(self._dial, self._stream, refused=self._refused, closed=self._fail)

    async def _stream(self, channel: grpc.aio.Channel, backoff: Backoff) -> str:
        """One stream: open, hello (the first frame of `_frames`), and results and events until
        it ends. The short backoff is back once the stream is open."""
        stub = pb_grpc.PartitionServiceStub(channel)
        self._generation += 1
        call = stub.Link(self._frames(self._generation))
        self.connected = True
        log.info("link to %s (%s) open", self.node_id, self.target)
        backoff.reset()
        async for frame in call:
            self._listener.batched(self._dispatch, frame)
        return "stream ended"

    def _refused(self, why: str, _details: str | None) -> None:
        # Refused (no inter-node protocol version in common): say why every time.
        log.error("partition node %s refuses this edge's link: %s", self.node_id, why)

    def _fail(self, why: str) -> None:
        was_up = self.connected
        self.connected = False
        self._generation += 1
        self._wake.set()  # let the dead stream's generator see it is stale and end
        self.ready = False
        self._outgoing = []
        self._urgent = []
        pending, self._pending = self._pending, {}
        self._expendable.clear()
        self._probes.clear()
        if was_up:
            log.warning(
                "link to %s lost (%s); %d requests were waiting", self.node_id, why, len(pending)
            )
            self._listener.on_link_down(self)
        result = unavailable(self.node_id, why)
        for callback, told in pending.values():
            if told:
                callback(result)
        self._release_waiters()

    def _observe(self, request_id: int) -> None:
        sent = self._probes.pop(request_id, None)
        if sent is not None:
            self._latency.observe(time.perf_counter() - sent)

    def _dispatch(self, frame: pb.PartitionFrame) -> None:
        listener = self._listener
        pending = self._pending
        for event in frame.events:
            kind = event.WhichOneof("event")
            if kind == "result":
                if self._probes:
                    self._observe(event.result.request_id)
                result = event.result
                entry = pending.pop(result.request_id, None)
                if entry is not None:
                    entry[0](result)
                elif self._expendable:
                    callback = self._expendable.pop(result.request_id, None)
                    if callback is not None:
                        callback(result)
            elif kind == "delivery":
                listener.on_delivery(self, event.delivery)
            elif kind == "kick":
                listener.on_kick(self, event.kick)
            elif kind == "publish_will":
                listener.on_publish_will(event.publish_will)
            elif kind == "shared_handoff":
                listener.on_shared_handoff(event.shared_handoff)
            elif kind == "index_update":
                update = event.index_update
                listener.on_index_update(self, update)
                if update.snapshot_done and not self.ready:
                    self.ready = True
                    self.session += 1
                    listener.on_link_up(self)
        if frame.ok_request_ids:
            ok = OK_RESULT
            for request_id in frame.ok_request_ids:
                if self._probes:
                    self._observe(request_id)
                entry = pending.pop(request_id, None)
                if entry is not None:
                    entry[0](ok)
                elif self._expendable:
                    callback = self._expendable.pop(request_id, None)
                    if callback is not None:
                        callback(ok)
