"""The follower side of replication's streams: one `MasterLink` per node that masters
partitions this node follows, which reconnects with backoff and sends the hello with this
node's joins on every new stream (later joins travel in ordinary frames), and hands the
master's items to the state machine; `MasterLinks` keeps exactly one link per master the
state machine follows, dialled as the view says each serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import grpc

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.grpc_options import LINK_OPTIONS, RECONNECT
from hexmq.node_protocol import THIS_RELEASE
from hexmq.pacing import FlushPacer
from hexmq.service import cancel_and_wait
from hexmq.streams import Backoff, keep_streaming
from hexmq.trust.grpc_tls import ClusterTLS
from hexmq.trust.identity import PARTITION, Identity
from services.partition.replica_writer import MAX_OPS_PER_WRITE
from services.partition.replication import Replicator
from services.partition.replication_feeds import SNAPSHOT_CHUNK_OPS
from services.partition.snapshot_codec import SnapshotChunkError

# The replication I/O's log lines keep the name they had when it was one module.
log = logging.getLogger("services.partition.peers")

PEER_OPTIONS = [*LINK_OPTIONS, *RECONNECT]


class MasterLink:
    """This node's stream to one master node, as its follower."""

    def __init__(
        self,
        core: Replicator,
        master: str,
        target: str,
        *,
        dial: Callable[[str, str], grpc.aio.Channel],
        incarnation: int,
        process: Callable[[], None],
    ) -> None:
        self._core = core
        self._dial = dial
        self._incarnation = incarnation
        self._process = process
        self.master = master
        self.target = target
        self.frames: list[pb.FollowerFrame] = []
        self._wake = asyncio.Event()
        self._pacer = FlushPacer()
        self._linger = telemetry.METRICS.linger("replication_acks")
        self._generation = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._show(down=True)
        self._task = asyncio.create_task(self._run(), name=f"replica-link-{self.master}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        with contextlib.suppress(KeyError):  # (no longer followed: no series)
            telemetry.METRICS.links_down.remove("replication", self.master)

    def _show(self, down: bool) -> None:
        telemetry.METRICS.links_down.labels("replication", self.master).set(int(down))

    def push(self, frame: pb.FollowerFrame) -> None:
        self.frames.append(frame)
        self._wake.set()

    async def _outgoing(
        self, generation: int, hello: pb.FollowerHello
    ) -> AsyncIterator[pb.FollowerFrame]:
        yield pb.FollowerFrame(hello=hello)
        loop = asyncio.get_running_loop()
        pacer = self._pacer
        while True:
            while not self.frames or generation != self._generation:
                if generation != self._generation:
                    return
                self._wake.clear()
                await self._wake.wait()
            # Acknowledgements of writes made durable meanwhile join these (hexmq/pacing.py).
            delay = pacer.delay(loop.time(), 0)
            if delay:
                await asyncio.sleep(delay)
                if generation != self._generation:
                    return
            pacer.sent(loop.time())
            self._linger.record(len(self.frames), delay)
            frames, self.frames = self.frames, []
            merged = pb.FollowerFrame()
            for frame in frames:
                merged.joins.extend(frame.joins)
                merged.acks.extend(frame.acks)
                merged.needs.extend(frame.needs)
            yield merged

    async def _run(self) -> None:
        await keep_streaming(
            lambda: self._dial(self.master, self.target),
            self._stream,
            refused=self._refused,
            closed=self._closed,
        )

    async def _stream(self, channel: grpc.aio.Channel, backoff: Backoff) -> str:
        """One stream: open, hello with this node's joins, and the master's items until it
        ends (or brings a snapshot chunk this node cannot read)."""
        core = self._core
        stub = pb_grpc.PartitionServiceStub(channel)
        self._generation += 1
        self.frames = []
        hello = pb.FollowerHello(
            node_id=core.node_id,
            positions=core.link_open(self.master),
            incarnation=self._incarnation,
            protocol=THIS_RELEASE.to_proto(),
        )
        self._process()
        call = stub.Replicate(self._outgoing(self._generation, hello))
        log.info("replicating from %s (%s)", self.master, self.target)
        self._show(down=False)
        try:
            async for frame in call:
                # Back to a short backoff only once the master has sent something: a stream it
                # ends at once (a failing join) is retried at most once a second, not 10-20
                # times a second as when any connect reset it.
                backoff.reset()
                for items in item_slices(frame.items, MAX_OPS_PER_WRITE):
                    core.step_items(self.master, items)
                    self._process()
                    await asyncio.sleep(0)
        except SnapshotChunkError as exc:
            # Never from a master of a release this one reads: end the stream, join again.
            log.error("replication stream from %s: %s", self.master, exc)
            return str(exc)
        return "stream ended"

    def _refused(self, _why: str, details: str | None) -> None:
        log.error("master %s refuses this follower: %s", self.master, details)

    def _closed(self, why: str) -> None:
        self._show(down=True)
        core = self._core
        if self.master in core.links:
            log.warning("replication stream from %s lost (%s)", self.master, why)
        core.link_closed(self.master)
        self._process()
        self._generation += 1
        self._wake.set()


def item_slices(
    items: Sequence[pb.ReplicationItem], max_ops: int
) -> Iterator[Sequence[pb.ReplicationItem]]:
    """A frame's items in runs of about `max_ops` storage ops (at least one item each)."""
    start = ops = 0
    for i, item in enumerate(items):
        kind = item.WhichOneof("item")
        if kind == "entry":
            size = len(item.entry.ops)
        elif kind == "snapshot":
            size = len(item.snapshot.ops) if not item.snapshot.packed_ops else SNAPSHOT_CHUNK_OPS
        else:
            size = 0
        if ops + size > max_ops and i > start:
            yield items[start:i]
            start, ops = i, 0
        ops += size
    if start < len(items):
        yield items[start:]


class MasterLinks:
    """This node's links to the masters of the partitions it follows, over the state machine
    `core`; `process` carries out what the core decided (ReplicationDriver.process)."""

    def __init__(
        self,
        core: Replicator,
        *,
        tls: ClusterTLS,
        incarnation: int,
        process: Callable[[], None],
        spawn: Callable[[object, str], None],
    ) -> None:
        self._core = core
        # How this node dials its masters (hexmq.trust.grpc_tls: as each serves, TLS or not).
        self._tls = tls
        self._incarnation = incarnation
        self._process = process
        # Runs a link's stop without waiting for it (the driver's background asks).
        self._spawn = spawn
        # The view's members: node -> (partition service address, whether it serves TLS).
        self._peers: dict[str, tuple[str, bool]] = {}
        self._links: dict[str, MasterLink] = {}

    def set_peers(self, peers: dict[str, tuple[str, bool]]) -> None:
        """The view's members: node -> (partition service address, whether it serves TLS)."""
        self._peers = peers

    def members(self) -> set[str]:
        """The node ids of the view's members (who may follow this node's partitions)."""
        return set(self._peers)

    def push(self, master: str, frame: pb.FollowerFrame) -> None:
        """A frame for `master`'s stream, if this node links to it."""
        link = self._links.get(master)
        if link is not None:
            link.push(frame)

    async def stop(self) -> None:
        for link in self._links.values():
            await link.stop()

    def dial(self, master: str, target: str) -> grpc.aio.Channel:
        """A channel to `master`'s partition service at `target`, with TLS as the view says it
        serves (PeerRefused when this node may not dial it)."""
        peer = self._peers.get(master)
        return self._tls.channel(
            target,
            peer=Identity(PARTITION, master),
            peer_tls=peer[1] if peer is not None else None,
            options=PEER_OPTIONS,
        )

    def relink(self) -> None:
        """Replication streams to exactly the masters this node follows."""
        core = self._core
        wanted = core.masters_followed()
        for master in sorted(wanted - set(self._links)):
            peer = self._peers.get(master)
            if peer is None:
                log.warning("no address for master %s: not in the view's members", master)
                continue
            link = MasterLink(
                core,
                master,
                peer[0],
                dial=self.dial,
                incarnation=self._incarnation,
                process=self._process,
            )
            self._links[master] = link
            link.start()
        for master in sorted(set(self._links) - wanted):
            link = self._links.pop(master)
            core.link_closed(master)
            self._spawn(link.stop(), "replica-link-stop")
