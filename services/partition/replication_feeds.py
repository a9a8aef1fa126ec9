"""The master side of replication's I/O: each follower node opens one Replicate stream to this
node (`FollowerFeeds.serve`); this node pushes log entries and snapshot chunks down it,
batched per frame (`Outbox`), and takes the follower's joins, acknowledgements and gap
requests from it into the state machine. Snapshots are read from this node's Redis in
chunks, one chunk in flight per stream at a time, at most SNAPSHOT_READS_AT_ONCE at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
import redis.asyncio as redis

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.pacing import FlushPacer, lazy_linger, wait_for_company
from services.partition.commit_queue import StorageFailed
from services.partition.hello import refuse_hello
from services.partition.replication import Replicator, SnapshotRead
from services.partition.snapshot_codec import ChunkSent
from services.partition.store import RedisStore

# The replication I/O's log lines keep the name they had when it was one module.
log = logging.getLogger("services.partition.peers")

MAX_ITEMS_PER_FRAME = 1024
# Snapshot chunks are read this many storage ops at a time; the next is read once the stream
# has taken the previous one.
SNAPSHOT_CHUNK_OPS = 512
# Snapshots read from Redis at once: a join or a follower far behind can ask for every
# partition together, and unbounded reads exhausted redis-py's pool (100 connections: "Too many
# connections"), which stops the service. The rest wait their turn.
SNAPSHOT_READS_AT_ONCE = 8
# Stop reading a snapshot ahead while the stream to that follower holds this many items.
SNAPSHOT_BACKLOG = 4 * MAX_ITEMS_PER_FRAME


class Outbox:
    """Items waiting to go down one stream, handed out in frames."""

    def __init__(self, pacer: FlushPacer | None = None) -> None:
        self.items: list[pb.ReplicationItem] = []
        self.closed = False
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        # Set while an item waiting is not lazy (hexmq/pacing.py).
        self._company = asyncio.Event()
        # When frames may go (default: the process's pacing interval).
        self._pacer = pacer if pacer is not None else FlushPacer(full=MAX_ITEMS_PER_FRAME)
        self._linger = telemetry.METRICS.linger("replication_feed")

    def push(self, items: list[pb.ReplicationItem], *, lazy: bool = False) -> None:
        """Queue `items` for the follower; `lazy`: entries of a lazy batch, which may wait up to
        the lazy linger to go with others."""
        self.items.extend(items)
        if not lazy:
            self._company.set()
        self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._company.set()
        self._wake.set()
        self._drained.set()

    async def below(self, backlog: int) -> None:
        while len(self.items) >= backlog and not self.closed:
            self._drained.clear()
            await self._drained.wait()

    async def frames(self) -> AsyncIterator[pb.MasterFrame]:
        loop = asyncio.get_running_loop()
        pacer = self._pacer
        while True:
            while not self.items:
                if self.closed:
                    return
                self._wake.clear()
                await self._wake.wait()
            # Lazy entries alone wait for company, up to the lazy linger.
            waited = await wait_for_company(self._company, lazy_linger())
            # At most one frame per pacing interval (hexmq/pacing.py): entries made durable
            # meanwhile join it.
            delay = pacer.delay(loop.time(), len(self.items))
            if delay:
                await asyncio.sleep(delay)
            if self.closed:
                return
            pacer.sent(loop.time())
            self._linger.record(min(len(self.items), MAX_ITEMS_PER_FRAME), waited + delay)
            batch = self.items[:MAX_ITEMS_PER_FRAME]
            del self.items[:MAX_ITEMS_PER_FRAME]
            if not self.items:
                self._company.clear()
            self._drained.set()
            yield pb.MasterFrame(items=batch)


def _encoding_summary(chunks: list[ChunkSent]) -> str:
    """'zlib, 412 KB as 61 KB' or 'plain, 412 KB' (mixed: the view changed meanwhile)."""
    raw = sum(c.raw_bytes for c in chunks)
    wire = sum(c.wire_bytes for c in chunks)
    packed = sum(1 for c in chunks if c.packed)
    if packed == 0:
        return f"plain, {raw / 1024:.0f} KB"
    how = "zlib" if packed == len(chunks) else f"zlib for {packed} of {len(chunks)} chunks"
    return f"{how}, {raw / 1024:.0f} KB as {wire / 1024:.0f} KB"


class FollowerFeeds:
    """The streams this node feeds as master, one per follower node, over the state machine
    `core`; `process` carries out what the core decided (ReplicationDriver.process), and
    `on_failure` hears a failed Redis read (the service stops)."""

    def __init__(
        self,
        core: Replicator,
        store: RedisStore,
        process: Callable[[], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        self._core = core
        self._store = store
        self._process = process
        self._on_failure = on_failure
        self._feeds: dict[str, Outbox] = {}
        self._reads: set[asyncio.Task[None]] = set()
        self._snapshot_slots = asyncio.Semaphore(SNAPSHOT_READS_AT_ONCE)
        self.snapshots_sent = 0

    def push(self, follower: str, items: list[pb.ReplicationItem], *, lazy: bool) -> None:
        """Items for `follower`'s stream, if it has one open."""
        outbox = self._feeds.get(follower)
        if outbox is not None:
            outbox.push(items, lazy=lazy)

    def start_read(self, read: SnapshotRead) -> None:
        task = asyncio.create_task(self.read_snapshot(read), name="snapshot-read")
        self._reads.add(task)
        task.add_done_callback(self._reads.discard)

    def close(self) -> list[asyncio.Task[None]]:
        """Close every stream; the snapshot reads under way, for the caller to cancel."""
        for outbox in self._feeds.values():
            outbox.close()
        return list(self._reads)

    async def serve(
        self,
        first: pb.FollowerFrame,
        requests: AsyncIterator[pb.FollowerFrame],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.MasterFrame]:
        """Feed the follower whose hello is `first` (checked by the servicer) until it goes."""
        follower = first.hello.node_id
        peer = f"follower {follower}"
        if await refuse_hello(context, peer, first.hello.protocol, "the replication stream", log):
            return
        core = self._core
        old = self._feeds.pop(follower, None)
        if old is not None:
            old.close()
            core.feed_closed(follower)
        outbox = Outbox()
        self._feeds[follower] = outbox
        core.feed_open(follower, first.hello.positions, first.hello.incarnation)
        log.info("follower %s connected", follower)
        self._process()
        reader = asyncio.create_task(self._read_feed(follower, outbox, requests))
        try:
            async for frame in outbox.frames():
                yield frame
        finally:
            reader.cancel()
            outbox.close()
            if self._feeds.get(follower) is outbox:
                del self._feeds[follower]
                core.feed_closed(follower)
                log.warning("follower %s disconnected", follower)
                self._process()

    async def _read_feed(
        self, follower: str, outbox: Outbox, requests: AsyncIterator[pb.FollowerFrame]
    ) -> None:
        core = self._core
        try:
            async for frame in requests:
                if outbox.closed:
                    break
                if frame.joins:
                    core.step_joins(follower, frame.joins)
                if frame.acks:
                    core.step_acks(follower, frame.acks)
                if frame.needs:
                    core.step_needs(follower, frame.needs)
                self._process()
        except grpc.aio.AioRpcError:
            pass
        except Exception:
            log.exception("follower %s: replication stream failed", follower)
        finally:
            outbox.close()

    async def read_snapshot(self, read: SnapshotRead) -> None:
        """Read the snapshot `read` names from Redis and send it in chunks, once one of
        SNAPSHOT_READS_AT_ONCE slots is free."""
        async with self._snapshot_slots:
            await self._read_snapshot_now(read)

    async def _read_snapshot_now(self, read: SnapshotRead) -> None:
        sent = 0
        chunks: list[ChunkSent] = []
        try:
            previous: list[tuple[int, str, bytes, bytes]] | None = None
            async for chunk in self._store.snapshot_chunks(read.partition, SNAPSHOT_CHUNK_OPS):
                if previous is not None:
                    if not await self._send_chunk(read, previous, chunks, last=False):
                        return
                    sent += len(previous)
                previous = chunk
            if not await self._send_chunk(read, previous or [], chunks, last=True):
                return
            sent += len(previous or [])
            self.snapshots_sent += 1
            log.info(
                "snapshot of partition %d at %s sent to %s (%d writes, %s)",
                read.partition,
                read.at,
                read.follower,
                sent,
                _encoding_summary(chunks),
            )
        except (redis.RedisError, OSError) as exc:
            self._on_failure(StorageFailed(f"redis read for a snapshot failed: {exc}"))
        except Exception:
            # A bug, not storage: the follower's repeated joins no longer restart a snapshot
            # under way, so start it again here rather than leave it waiting for good.
            log.exception("snapshot of partition %d for %s failed", read.partition, read.follower)
            self._core.snapshot_lost(read)
            self._process()

    async def _send_chunk(
        self,
        read: SnapshotRead,
        ops: list[tuple[int, str, bytes, bytes]],
        chunks: list[ChunkSent],
        *,
        last: bool,
    ) -> bool:
        outbox = self._feeds.get(read.follower)
        if outbox is None:
            return False
        await outbox.below(SNAPSHOT_BACKLOG)
        sent = self._core.snapshot_chunk(read, ops, last)
        if sent is None:
            return False
        chunks.append(sent)
        encoding = "zlib" if sent.packed else "plain"
        telemetry.METRICS.snapshot_bytes.labels(encoding).inc(sent.wire_bytes)
        self._process()
        return True
