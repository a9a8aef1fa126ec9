"""ReplicationDriver: the I/O around the Replicator state machine (partition/replication.py).

- Master side: each follower node opens one Replicate stream to this node (`serve_feed`); this
  node pushes log entries and snapshot chunks down it, batched per frame, and takes the
  follower's acknowledgements and gap requests from it. Snapshots are read from this node's
  Redis in chunks, one chunk in flight per stream at a time.
- Follower side: one MasterLink per node that masters partitions this node follows; it
  reconnects with backoff and sends the hello with this node's joins on every new stream
  (later joins travel in ordinary frames). Entries are written to this node's Redis by one
  writer task, many frames per MULTI/EXEC.
- Agreement: in-sync changes and handovers the state machine asks for go to the node's
  membership agent (services/partition/agreement.py), and its answers come back in; the
  agent's liveness lease is fed in as it changes.
- Roles: partitions this node starts or stops mastering are handed to the partition node
  (`RoleListener`), which loads or drops their memory state.
- Time: the state machine ticks every `tick_s` (lag detection, gap and join retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Protocol

import grpc
import redis.asyncio as redis

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.grpc_options import LINK_OPTIONS, RECONNECT
from hexmq.node_protocol import THIS_RELEASE, ClusterProtocol
from hexmq.pacing import FlushPacer, lazy_linger, wait_for_company
from hexmq.ranges import ranges
from hexmq.service import cancel_and_wait
from hexmq.streams import Backoff, keep_streaming
from hexmq.trust.grpc_tls import ClusterTLS
from hexmq.trust.identity import PARTITION, Identity
from services.partition.agreement import AgreementClient
from services.partition.commit_queue import StorageFailed
from services.partition.hello import refuse_hello
from services.partition.redis_tx import TransactionClient, timed_execute
from services.partition.replication import (
    Assignment,
    Entry,
    HandoverReady,
    InSyncChange,
    Persist,
    Replicator,
    SnapshotRead,
)
from services.partition.snapshot_codec import ChunkSent, SnapshotChunkError
from services.partition.store import RedisStore
from services.partition.write_batch import apply_ops, put_position

log = logging.getLogger(__name__)

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

# Replication frames' writes that make a follower's MULTI/EXEC worth sending without waiting out
# the pacing interval.
FULL_PERSIST = 64
# A follower writes at most about this many storage ops in one MULTI/EXEC (whole Persists:
# each is one transaction) and hands the state machine a frame's items in slices of about as
# many. redis-py packs a transaction's commands and reads its replies without yielding to the
# event loop: a node joining a loaded cluster, catching up on a hundred partitions at once, put
# every pending frame's writes in one transaction and stalled its loop for about a second, long
# enough for every agent's health probe to time out, and was removed as silent right after its
# admission.
MAX_OPS_PER_WRITE = 4096

# How long to wait before asking the agent again after it could not be reached.
AGENT_RETRY_S = 0.5

PEER_OPTIONS = [*LINK_OPTIONS, *RECONNECT]


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


class MasterLink:
    """This node's stream to one master node, as its follower."""

    def __init__(self, driver: ReplicationDriver, master: str, target: str) -> None:
        self.driver = driver
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
            lambda: self.driver.dial(self.master, self.target),
            self._stream,
            refused=self._refused,
            closed=self._closed,
        )

    async def _stream(self, channel: grpc.aio.Channel, backoff: Backoff) -> str:
        """One stream: open, hello with this node's joins, and the master's items until it
        ends (or brings a snapshot chunk this node cannot read)."""
        core = self.driver.core
        stub = pb_grpc.PartitionServiceStub(channel)
        self._generation += 1
        self.frames = []
        hello = pb.FollowerHello(
            node_id=core.node_id,
            positions=core.link_open(self.master),
            incarnation=self.driver.incarnation,
            protocol=THIS_RELEASE.to_proto(),
        )
        self.driver.process()
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
                    self.driver.process()
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
        core = self.driver.core
        if self.master in core.links:
            log.warning("replication stream from %s lost (%s)", self.master, why)
        core.link_closed(self.master)
        self.driver.process()
        self._generation += 1
        self._wake.set()


def _encoding_summary(chunks: list[ChunkSent]) -> str:
    """'zlib, 412 KB as 61 KB' or 'plain, 412 KB' (mixed: the view changed meanwhile)."""
    raw = sum(c.raw_bytes for c in chunks)
    wire = sum(c.wire_bytes for c in chunks)
    packed = sum(1 for c in chunks if c.packed)
    if packed == 0:
        return f"plain, {raw / 1024:.0f} KB"
    how = "zlib" if packed == len(chunks) else f"zlib for {packed} of {len(chunks)} chunks"
    return f"{how}, {raw / 1024:.0f} KB as {wire / 1024:.0f} KB"


def persists_within(persists: Sequence[Persist], max_ops: int) -> int:
    """How many of the first `persists` one transaction takes: as many as fit in `max_ops`
    storage ops, and at least one."""
    ops = 0
    for i, persist in enumerate(persists):
        ops += len(persist.ops)
        if ops > max_ops and i > 0:
            return i
    return len(persists)


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


# Releases the batches behind these tokens, each with the partitions aborted meanwhile.
Release = Callable[[list[tuple[object, frozenset[int]]]], None]


def _no_release(tokens: list[tuple[object, frozenset[int]]]) -> None:
    raise RuntimeError("batches were replicated before anything could release them")


class RoleListener(Protocol):
    """What the partition node hears of the roles the state machine takes."""

    def promoted(self, p: int) -> None: ...
    def demoted_all(self, partitions: Sequence[int]) -> None: ...


class ReplicationDriver:
    def __init__(
        self,
        core: Replicator,
        store: RedisStore,
        on_failure: Callable[[BaseException], None],
        *,
        roles: RoleListener | None = None,
        release: Release = _no_release,
        tick_s: float = 0.1,
        incarnation: int = 0,
        agent: AgreementClient | None = None,
        writer: TransactionClient | None = None,
        write_timeout: float | None = None,
        tls: ClusterTLS,
    ) -> None:
        self.core = core
        # How this node dials its masters (hexmq.trust.grpc_tls: as each serves, TLS or not).
        self._tls = tls
        self.store = store
        # What the follower's writes go through (the store's client, unless the service gives
        # its transaction writer, services/partition/redis_tx.py: then each MULTI/EXEC has
        # write_timeout in all).
        self._writer = writer
        self._write_timeout = write_timeout
        self.tick_s = tick_s
        self.incarnation = incarnation
        self.roles = roles
        self._agent = agent
        self._on_failure = on_failure
        # What releases the master's batches once every in-sync follower has them
        # (group_commit.release_batches over the node's commit queue).
        self._release = release
        # The view's members: node -> (partition service address, whether it serves TLS).
        self._peers: dict[str, tuple[str, bool]] = {}
        self._links: dict[str, MasterLink] = {}
        self._feeds: dict[str, Outbox] = {}
        self._persist: list[Persist] = []
        self._persist_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._reads: set[asyncio.Task[None]] = set()
        self._snapshot_slots = asyncio.Semaphore(SNAPSHOT_READS_AT_ONCE)
        self._asks: set[asyncio.Task[None]] = set()
        self.snapshots_sent = 0
        # When the lease stops being valid unless renewed (monotonic seconds).
        self._lease_until = 0.0
        self._lease_timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._write_loop(), name="replica-writer"),
            asyncio.create_task(self._tick_loop(), name="replica-ticker"),
        ]
        if self._agent is not None:
            self._tasks.append(asyncio.create_task(self._lease_loop(), name="lease"))

    async def stop(self) -> None:
        for link in self._links.values():
            await link.stop()
        for outbox in self._feeds.values():
            outbox.close()
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        tasks = [*self._tasks, *self._reads, *self._asks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def members(self) -> set[str]:
        """The node ids of the view's members (who may follow this node's partitions)."""
        return set(self._peers)

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

    def admitted(self, view: mpb.View) -> bool:
        """The view admits this node with this partition service (its incarnation; a view
        that names none admits any, as a static membership does)."""
        me = next((m for m in view.members if m.node_id == self.core.node_id), None)
        return me is not None and me.incarnation in (0, self.incarnation)

    async def apply_view(self, view: mpb.View) -> None:
        core = self.core
        self._peers = {m.node_id: (m.partition_addr, m.tls) for m in view.members}
        assignments: dict[int, Assignment] = {}
        if self.admitted(view):
            assignments = {
                a.partition: Assignment(
                    a.epoch, tuple(a.replicas), frozenset(a.in_sync), a.handover_to
                )
                for a in view.partitions
            }
        fresh = [
            p
            for p, a in assignments.items()
            if core.node_id in a.replicas and p not in core.mastered and p not in core.followed
        ]
        stored = await self.store.load_positions(fresh) if fresh else {}
        protocol = ClusterProtocol.of_view(view)
        if protocol != core.protocol:
            log.info(
                "view %d: the cluster speaks protocol %s (was %s)",
                view.epoch,
                protocol.describe(),
                core.protocol.describe(),
            )
        telemetry.METRICS.show_protocol(protocol)
        core.set_protocol(protocol)
        core.set_view(assignments, stored)
        self.process()

    def _relink(self) -> None:
        """Replication streams to exactly the masters this node follows."""
        core = self.core
        wanted = core.masters_followed()
        for master in sorted(wanted - set(self._links)):
            peer = self._peers.get(master)
            if peer is None:
                log.warning("no address for master %s: not in the view's members", master)
                continue
            link = MasterLink(self, master, peer[0])
            self._links[master] = link
            link.start()
        for master in sorted(set(self._links) - wanted):
            link = self._links.pop(master)
            core.link_closed(master)
            self._spawn(link.stop(), "replica-link-stop")

    def _spawn(self, work: object, name: str) -> None:
        task = asyncio.ensure_future(work)  # type: ignore[call-overload]
        task.set_name(name)
        self._asks.add(task)
        task.add_done_callback(self._asks.discard)

    def master_durable(
        self, entries: list[Entry], token: object, aborted: frozenset[int], lazy: bool
    ) -> None:
        """A batch is durable here (GroupCommit's `on_durable`): its entries go to the
        followers, and its token comes back to `release` once they all have them."""
        self.core.master_durable(entries, token, aborted)
        self.process(lazy=lazy)

    def process(self, *, lazy: bool = False) -> None:
        """Carry out what the state machine has decided. `lazy`: what it sends followers now
        are a lazy batch's entries (hexmq/pacing.py), which may wait for company."""
        ready = self.core.ready()
        if not ready:
            return
        if ready.committed:
            self._release(ready.committed)
        roles = self.roles
        if roles is not None:
            if ready.demoted:
                log.info("no longer master of partitions %s", ranges(ready.demoted))
                roles.demoted_all(ready.demoted)
            for p in ready.promoted:
                roles.promoted(p)
        if ready.relink:
            self._relink()
        for change in ready.in_sync_changes:
            self._spawn(self._ask_in_sync(change), "in-sync-change")
        for handover in ready.handovers:
            self._spawn(self._ask_handover(handover), "handover")
        for follower, items in ready.to_followers.items():
            outbox = self._feeds.get(follower)
            if outbox is not None:
                outbox.push(items, lazy=lazy)
        for master, frame in ready.to_masters.items():
            link = self._links.get(master)
            if link is not None:
                link.push(frame)
        if ready.persist:
            self._persist.extend(ready.persist)
            self._persist_wake.set()
        for read in ready.snapshot_reads:
            task = asyncio.create_task(self._read_snapshot(read), name="snapshot-read")
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)

    # ----- master side -------------------------------------------------------------------

    async def serve_feed(
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
        core = self.core
        old = self._feeds.pop(follower, None)
        if old is not None:
            old.close()
            core.feed_closed(follower)
        outbox = Outbox()
        self._feeds[follower] = outbox
        core.feed_open(follower, first.hello.positions, first.hello.incarnation)
        log.info("follower %s connected", follower)
        self.process()
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
                self.process()

    async def _read_feed(
        self, follower: str, outbox: Outbox, requests: AsyncIterator[pb.FollowerFrame]
    ) -> None:
        core = self.core
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
                self.process()
        except grpc.aio.AioRpcError:
            pass
        except Exception:
            log.exception("follower %s: replication stream failed", follower)
        finally:
            outbox.close()

    async def _read_snapshot(self, read: SnapshotRead) -> None:
        async with self._snapshot_slots:
            await self._read_snapshot_now(read)

    async def _read_snapshot_now(self, read: SnapshotRead) -> None:
        sent = 0
        chunks: list[ChunkSent] = []
        try:
            previous: list[tuple[int, str, bytes, bytes]] | None = None
            async for chunk in self.store.snapshot_chunks(read.partition, SNAPSHOT_CHUNK_OPS):
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
            self.core.snapshot_lost(read)
            self.process()

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
        sent = self.core.snapshot_chunk(read, ops, last)
        if sent is None:
            return False
        chunks.append(sent)
        encoding = "zlib" if sent.packed else "plain"
        telemetry.METRICS.snapshot_bytes.labels(encoding).inc(sent.wire_bytes)
        self.process()
        return True

    # ----- follower side -----------------------------------------------------------------

    async def _write_loop(self) -> None:
        client = self._writer if self._writer is not None else self.store.client
        loop = asyncio.get_running_loop()
        pacer, linger = FlushPacer(full=FULL_PERSIST), telemetry.METRICS.linger("replica_write")
        while True:
            await self._persist_wake.wait()
            self._persist_wake.clear()
            # One MULTI/EXEC in flight, at most one per pacing interval (hexmq/pacing.py): the
            # frames that arrive meanwhile join it, up to MAX_OPS_PER_WRITE a transaction.
            delay = pacer.delay(loop.time(), len(self._persist))
            if delay:
                await asyncio.sleep(delay)
            pacer.sent(loop.time())
            while self._persist:
                count = persists_within(self._persist, MAX_OPS_PER_WRITE)
                batches = self._persist[:count]
                del self._persist[:count]
                linger.record(len(batches), delay)
                delay = 0.0
                if not await self._write(client, batches):
                    return

    async def _write(self, client: TransactionClient, batches: list[Persist]) -> bool:
        """One transaction of follower writes; False if it failed (the service stops)."""
        core = self.core
        timeout = self._write_timeout
        pipe = client.pipeline(transaction=True)
        try:
            for persist in batches:
                if persist.clear and len(pipe):
                    # Read what to drop only after the writes before it are in.
                    await timed_execute(pipe, timeout)
                    pipe = client.pipeline(transaction=True)
                for p in persist.clear:
                    pipe.delete(*await self.store.partition_keys(p))
                apply_ops(pipe, persist.ops)
                for p, pos in persist.positions.items():
                    put_position(pipe, p, pos, persist.histories.get(p))
            await timed_execute(pipe, timeout)
        except (redis.RedisError, OSError) as exc:
            self._on_failure(StorageFailed(f"redis write of replicated entries failed: {exc}"))
            return False
        for persist in batches:
            core.follower_durable(persist.id)
        self.process()
        return True

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.core.tick()
            self.process()

    # ----- agreement -------------------------------------------------------------------

    async def _ask_in_sync(self, change: InSyncChange) -> None:
        agent = self._agent
        if agent is None:
            # No agent (a single node's view never changes): nothing to agree with.
            self.core.in_sync_settled(change, made=not change.add)
            self.process()
            return
        try:
            made = await agent.in_sync(change)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            log.warning(
                "membership agent unreachable for an in-sync change of partition %d (%s); "
                "asking again",
                change.partition,
                exc,
            )
            await asyncio.sleep(AGENT_RETRY_S)
            self.core.in_sync_failed(change)
        else:
            if made:
                log.info(
                    "partition %d epoch %d: %s %s the in-sync set",
                    change.partition,
                    change.epoch,
                    change.follower,
                    "added to" if change.add else "removed from",
                )
            else:
                log.info(
                    "partition %d epoch %d: %s not added to the in-sync set (the view moved on)",
                    change.partition,
                    change.epoch,
                    change.follower,
                )
            self.core.in_sync_settled(change, made=made)
        self.process()

    async def _ask_handover(self, handover: HandoverReady) -> None:
        agent = self._agent
        made = False
        if agent is not None:
            try:
                made = await agent.handover(handover)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                log.warning("membership agent unreachable for a handover (%s)", exc)
        if not made:
            await asyncio.sleep(AGENT_RETRY_S)
            self.core.handover_settled(handover)
            self.process()

    async def _lease_loop(self) -> None:
        """Follow the agent's lease: valid for valid_for_ms from each message, unless renewed."""
        agent = self._agent
        assert agent is not None
        loop = asyncio.get_running_loop()
        async for state in agent.leases():
            if self._lease_timer is not None:
                self._lease_timer.cancel()
                self._lease_timer = None
            valid = state.valid and state.valid_for_ms > 0
            if valid:
                self._lease_until = time.monotonic() + state.valid_for_ms / 1000
                self._lease_timer = loop.call_later(state.valid_for_ms / 1000, self._lease_lapsed)
            self.core.set_lease(valid)
            self.process()

    def _lease_lapsed(self) -> None:
        self._lease_timer = None
        log.warning("liveness lease lapsed: lone masters stop acknowledging until it is renewed")
        self.core.set_lease(False)
        self.process()
