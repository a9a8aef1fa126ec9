"""Replication of a node's partitions: a deterministic state machine with no I/O.

Every partition has a master (the first replica of its view assignment) and RF-1 followers. The
master sequences the writes of each group-commit batch per partition (one LogEntry per partition
and batch, seq = previous + 1), makes them durable in its own Redis first and only then streams
them to its followers; a batch's results are released (`Ready.committed`) once every in-sync
follower of every partition it wrote has acknowledged, durably, the entry it needs.

Persisting before sending means a follower can never hold a write its master does not: after a
master restart a follower's position is a prefix of the master's history (same epoch, seq at most
the master's), so the two only ever need to agree on where the follower stands.

Catch-up: a follower says where it stands (`feed_open`, from its hello). The master streams its
in-memory log from there when the log still reaches back that far, and otherwise asks the adapter
for a snapshot of the partition (`Ready.snapshot_reads`): the partition's state as stored at or
after the snapshot position, read in chunks, followed by the log from that position (writes are
whole-value overwrites and deletes, so replaying entries over a state that already has some of
them converges). The log is pinned while a snapshot is on its way. A follower is in sync once it
has acknowledged everything the master had made durable; it drops out when its stream is gone or
it stays behind for longer than the lag limit.

The adapters (services/partition/peers.py) feed inputs in and carry `ready()` out: gRPC
streams between nodes, the follower's Redis writes and the master's snapshot reads. Tests drive
this class directly over an in-memory network (tests/unit/test_replication_scenarios.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hexmq.api.partition.v1 import partition_pb2 as pb

HSET = pb.StorageOp.KIND_HSET
HDEL = pb.StorageOp.KIND_HDEL
DEL = pb.StorageOp.KIND_DEL
# (kind, key, field, value): one storage write. Tuples on the hot path; protobuf only on the wire.
Op = tuple[int, str, bytes, bytes]
# (epoch, seq): where a replica of a partition stands. (0, 0) is "holds nothing".
Position = tuple[int, int]
NOWHERE: Position = (0, 0)

DEFAULT_LOG_ENTRIES = 50_000

# Follower states as the master sees them.
DOWN = "down"
SNAPSHOT = "snapshot"
LOG = "log"
LIVE = "live"


@dataclass(frozen=True, slots=True)
class ReplicationLimits:
    """log_entries/log_bytes: how much of each partition's recent history the master keeps for
    catch-up; window: entries sent to one follower of one partition and not yet acknowledged;
    lag_ticks: how long an in-sync follower may stay behind before it is dropped from the in-sync
    set; need_retry_ticks: how long a follower waits before asking for a gap again."""

    log_entries: int = DEFAULT_LOG_ENTRIES
    log_bytes: int = 16 << 20
    window: int = 512
    lag_ticks: int = 50
    need_retry_ticks: int = 10


def op_size(op: Op) -> int:
    return len(op[1]) + len(op[2]) + len(op[3]) + 8


def ops_to_pb(ops: Iterable[Op]) -> list[pb.StorageOp]:
    return [pb.StorageOp(kind=k, key=key, field=f, value=v) for k, key, f, v in ops]  # type: ignore[arg-type]


def ops_from_pb(ops: Iterable[pb.StorageOp]) -> list[Op]:
    return [(op.kind, op.key, op.field, op.value) for op in ops]


@dataclass(slots=True)
class Entry:
    partition: int
    epoch: int
    seq: int
    ops: list[Op]
    size: int
    _item: pb.ReplicationItem | None = None

    def item(self) -> pb.ReplicationItem:
        """The wire form, built once and shared by every follower."""
        if self._item is None:
            self._item = pb.ReplicationItem(
                entry=pb.LogEntry(
                    partition=self.partition,
                    epoch=self.epoch,
                    seq=self.seq,
                    ops=ops_to_pb(self.ops),
                )
            )
        return self._item


@dataclass(slots=True)
class FollowerProgress:
    """The master's view of one follower of one partition."""

    node: str
    state: str = DOWN
    # Next seq to send (LOG/LIVE), and the highest seq the follower has made durable.
    next: int = 0
    acked: int = 0
    in_sync: bool = False
    # The last tick at which the follower had acknowledged all the master had made durable.
    caught_up_at: int = 0
    # SNAPSHOT: which snapshot (ids are unique per Replicator, so a reader of an abandoned one
    # is told to stop even when the new one stands at the same position), the position it
    # stands for, and whether its first chunk went out.
    snapshot_id: int = 0
    snapshot_at: Position = NOWHERE
    snapshot_started: bool = False


@dataclass(slots=True)
class MasteredPartition:
    partition: int
    epoch: int
    # Last seq assigned, last seq durable here, and the epoch of the entry at `durable`.
    seq: int
    durable: int
    durable_epoch: int
    followers: dict[str, FollowerProgress]
    # Durable entries kept for catch-up: log[i].seq == log_start + i.
    log: deque[Entry] = field(default_factory=deque)
    log_bytes: int = 0
    log_start: int = 1
    # Epoch of the entry at log_start - 1 (what a follower standing there must have).
    base_epoch: int = 0

    def lag(self, fp: FollowerProgress) -> int:
        """Entries durable here that the follower has not acknowledged."""
        return max(self.durable - fp.acked, 0)

    def position_known(self, pos: Position) -> bool:
        """True if the history up to pos is this master's and the log continues from it."""
        epoch, seq = pos
        if seq > self.durable or seq < self.log_start - 1:
            return False
        if seq == self.log_start - 1:
            return epoch == self.base_epoch
        return self.log[seq - self.log_start].epoch == epoch


@dataclass(slots=True)
class FollowedPartition:
    partition: int
    master: str
    epoch: int
    # What this follower has accepted in order (durable, or queued for its store in order),
    # and what of it is durable (what a hello may claim).
    received: Position = NOWHERE
    durable: Position = NOWHERE
    # A snapshot is being written: the partition's state is partial until its last chunk.
    loading: bool = False
    # The seq asked for after a gap (0: none), and when.
    need: int = 0
    need_at: int = 0


@dataclass(slots=True)
class Persist:
    """Writes a follower must make durable, in one transaction: first drop the partitions in
    `clear`, then apply `ops` in order, then record `positions`; then call
    `Replicator.follower_durable(id)`."""

    id: int
    clear: list[int] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    positions: dict[int, Position] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """Read partition's stored state (at or after `at`) in chunks and hand each to
    `Replicator.snapshot_chunk(read, ops, last)`."""

    follower: str
    partition: int
    at: Position
    id: int


@dataclass(slots=True)
class Ready:
    to_followers: dict[str, list[pb.ReplicationItem]] = field(default_factory=dict)
    to_masters: dict[str, pb.FollowerFrame] = field(default_factory=dict)
    persist: list[Persist] = field(default_factory=list)
    snapshot_reads: list[SnapshotRead] = field(default_factory=list)
    # Tokens of master batches now replicated to every in-sync follower, in proposal order.
    committed: list[object] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(
            self.to_followers
            or self.to_masters
            or self.persist
            or self.snapshot_reads
            or self.committed
        )


@dataclass(frozen=True, slots=True)
class Assignment:
    epoch: int
    replicas: tuple[str, ...]


class Replicator:
    def __init__(self, node_id: str, limits: ReplicationLimits | None = None) -> None:
        self.node_id = node_id
        self.limits = limits or ReplicationLimits()
        self.now = 0
        self.mastered: dict[int, MasteredPartition] = {}
        self.followed: dict[int, FollowedPartition] = {}
        # Followers with an open stream to this node, and masters this node has a stream to.
        self.feeds: set[str] = set()
        self.links: set[str] = set()
        # Master batches waiting for followers: (token, [(partition, follower, seq)]).
        self._pending: deque[tuple[object, list[tuple[int, str, int]]]] = deque()
        self._persist_seq = 0
        self._snapshot_ids = 0
        self._persisting: dict[int, Persist] = {}
        self._ready = Ready()

    # ----- roles -----------------------------------------------------------------------

    def set_roles(
        self, assignments: Mapping[int, Assignment], stored: Mapping[int, Position]
    ) -> None:
        """Take the roles the view gives this node. `stored` is this node's durable position
        per partition (from its store). A partition whose role or epoch changes starts afresh."""
        me = self.node_id
        for p, a in assignments.items():
            pos = stored.get(p, NOWHERE)
            if a.replicas and a.replicas[0] == me:
                old = self.mastered.get(p)
                if old is not None and old.epoch == a.epoch:
                    continue
                self.followed.pop(p, None)
                self.mastered[p] = MasteredPartition(
                    partition=p,
                    epoch=a.epoch,
                    seq=pos[1],
                    durable=pos[1],
                    durable_epoch=pos[0],
                    followers={n: FollowerProgress(n) for n in a.replicas[1:]},
                    log_start=pos[1] + 1,
                    base_epoch=pos[0],
                )
            elif me in a.replicas:
                fp = self.followed.get(p)
                if fp is not None and fp.master == a.replicas[0] and fp.epoch == a.epoch:
                    continue
                self.mastered.pop(p, None)
                self.followed[p] = FollowedPartition(
                    p, a.replicas[0], a.epoch, received=pos, durable=pos
                )
            else:
                self.mastered.pop(p, None)
                self.followed.pop(p, None)
        for p in [p for p in self.mastered if p not in assignments]:
            del self.mastered[p]
        for p in [p for p in self.followed if p not in assignments]:
            del self.followed[p]
        self._advance()

    def masters_followed(self) -> set[str]:
        """The nodes this node needs a replication stream to."""
        return {fp.master for fp in self.followed.values()}

    # ----- master side -------------------------------------------------------------------

    def propose(self, writes: Mapping[int, Sequence[Op]]) -> list[Entry]:
        """Sequence one batch's writes: one entry per partition. The caller makes the entries
        durable (with `position` of each) and then calls `master_durable`."""
        entries = []
        for p, ops in writes.items():
            m = self.mastered.get(p)
            if m is None:
                raise KeyError(f"partition {p} is not mastered by {self.node_id}")
            if not ops:
                continue
            m.seq += 1
            entries.append(Entry(p, m.epoch, m.seq, list(ops), sum(op_size(op) for op in ops)))
        return entries

    def master_durable(self, entries: Sequence[Entry], token: object) -> None:
        """`entries` (from `propose`, in order) are durable here: stream them to followers and
        release `token` once every in-sync follower has them."""
        needs: list[tuple[int, str, int]] = []
        now = self.now
        for e in entries:
            m = self.mastered.get(e.partition)
            if m is None or m.epoch != e.epoch:
                continue  # the partition moved while the batch was being written
            for fp in m.followers.values():
                if fp.acked >= m.durable:
                    fp.caught_up_at = now
            m.durable = e.seq
            m.durable_epoch = e.epoch
            if not m.log:
                m.log_start = e.seq
            m.log.append(e)
            m.log_bytes += e.size
            for fp in m.followers.values():
                if fp.in_sync:
                    needs.append((e.partition, fp.node, e.seq))
                if fp.state in (LOG, LIVE):
                    self._send(m, fp)
            self._trim(m)
        self._pending.append((token, needs))
        self._advance()

    def feed_open(self, follower: str, positions: Mapping[int, Position]) -> None:
        """A follower opened its stream (replacing any earlier one) and says where it stands."""
        self.feeds.add(follower)
        for p, m in self.mastered.items():
            fp = m.followers.get(follower)
            if fp is None:
                continue
            pos = positions.get(p, NOWHERE)
            fp.in_sync = False
            fp.snapshot_started = False
            if pos == (m.durable_epoch, m.durable):
                fp.state, fp.next, fp.acked = LIVE, m.durable + 1, m.durable
                fp.in_sync = True
                fp.caught_up_at = self.now
            elif m.position_known(pos):
                fp.state, fp.next, fp.acked = LOG, pos[1] + 1, pos[1]
                self._send(m, fp)
            else:
                self._start_snapshot(m, fp)
        self._advance()

    def feed_closed(self, follower: str) -> None:
        self.feeds.discard(follower)
        for m in self.mastered.values():
            fp = m.followers.get(follower)
            if fp is not None:
                fp.state = DOWN
                fp.in_sync = False
                fp.snapshot_started = False
        self._advance()

    def step_acks(self, follower: str, acks: Iterable[pb.PartitionPosition]) -> None:
        now = self.now
        for ack in acks:
            m = self.mastered.get(ack.partition)
            fp = m.followers.get(follower) if m is not None else None
            if m is None or fp is None or fp.state not in (LOG, LIVE):
                continue
            if ack.seq > fp.acked:
                fp.acked = min(ack.seq, m.durable)
            if fp.acked >= m.durable:
                fp.caught_up_at = now
                fp.state = LIVE
                fp.in_sync = True
            self._send(m, fp)
        self._advance()

    def step_needs(self, follower: str, needs: Iterable[pb.PartitionPosition]) -> None:
        """The follower met a gap: resend from the seq it expected, or snapshot."""
        for need in needs:
            m = self.mastered.get(need.partition)
            fp = m.followers.get(follower) if m is not None else None
            if m is None or fp is None or fp.state not in (LOG, LIVE):
                continue
            fp.acked = min(fp.acked, need.seq - 1)
            if m.log_start <= need.seq <= m.durable + 1:
                fp.state, fp.next = LOG, need.seq
                self._send(m, fp)
            else:
                self._start_snapshot(m, fp)
        self._advance()

    def snapshot_chunk(self, read: SnapshotRead, ops: list[Op], last: bool) -> bool:
        """One chunk of a snapshot read; False if that snapshot is no longer wanted (the stream
        broke or a newer one started): the reader stops."""
        follower, p, at = read.follower, read.partition, read.at
        m = self.mastered.get(p)
        fp = m.followers.get(follower) if m is not None else None
        if m is None or fp is None or fp.state != SNAPSHOT or fp.snapshot_id != read.id:
            return False
        chunk = pb.SnapshotChunk(
            partition=p,
            epoch=at[0],
            seq=at[1],
            first=not fp.snapshot_started,
            last=last,
            ops=ops_to_pb(ops),
        )
        fp.snapshot_started = True
        self._out(follower).append(pb.ReplicationItem(snapshot=chunk))
        if last:
            fp.state, fp.next, fp.acked = LOG, at[1] + 1, 0
            self._send(m, fp)
        return True

    def _start_snapshot(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        fp.state = SNAPSHOT
        fp.in_sync = False
        fp.snapshot_started = False
        fp.snapshot_at = (m.durable_epoch, m.durable)
        fp.acked = 0
        self._snapshot_ids += 1
        fp.snapshot_id = self._snapshot_ids
        self._ready.snapshot_reads.append(
            SnapshotRead(fp.node, m.partition, fp.snapshot_at, fp.snapshot_id)
        )

    def _send(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        if fp.next <= m.durable and fp.next < m.log_start:
            self._start_snapshot(m, fp)  # the log no longer reaches back to it
            return
        limit = min(m.durable, fp.acked + self.limits.window)
        if fp.next > limit:
            return
        out = self._out(fp.node)
        log, start = m.log, m.log_start
        for seq in range(fp.next, limit + 1):
            out.append(log[seq - start].item())
        fp.next = limit + 1

    def _trim(self, m: MasteredPartition) -> None:
        limits = self.limits
        # A follower taking a snapshot needs the entries after the snapshot's position.
        pinned = min(
            (fp.snapshot_at[1] + 1 for fp in m.followers.values() if fp.state == SNAPSHOT),
            default=m.durable + 1,
        )
        log = m.log
        while log and (len(log) > limits.log_entries or m.log_bytes > limits.log_bytes):
            if log[0].seq >= pinned:
                break
            gone = log.popleft()
            m.log_bytes -= gone.size
            m.base_epoch = gone.epoch
            m.log_start = gone.seq + 1

    def _advance(self) -> None:
        pending = self._pending
        committed = self._ready.committed
        while pending:
            token, needs = pending[0]
            for p, node, seq in needs:
                m = self.mastered.get(p)
                fp = m.followers.get(node) if m is not None else None
                if fp is not None and fp.in_sync and fp.acked < seq:
                    return
            pending.popleft()
            committed.append(token)

    def _out(self, follower: str) -> list[pb.ReplicationItem]:
        out = self._ready.to_followers.get(follower)
        if out is None:
            out = self._ready.to_followers[follower] = []
        return out

    # ----- follower side -----------------------------------------------------------------

    def link_open(self, master: str) -> list[pb.PartitionPosition]:
        """This node opened its stream to `master`: the positions its hello carries."""
        self.links.add(master)
        positions = []
        for fp in self.followed.values():
            if fp.master != master:
                continue
            fp.need = 0
            if fp.loading:
                # Cut off mid-snapshot: what is stored of the partition is partial (and its
                # stored position says so); start over from nothing.
                fp.loading = False
                fp.received = NOWHERE
                epoch, seq = NOWHERE
            else:
                # Only what is durable: the master counts the hello's position as acknowledged.
                epoch, seq = fp.durable
            positions.append(pb.PartitionPosition(partition=fp.partition, epoch=epoch, seq=seq))
        return positions

    def link_closed(self, master: str) -> None:
        self.links.discard(master)

    def step_items(self, master: str, items: Iterable[pb.ReplicationItem]) -> None:
        """Entries and snapshot chunks from `master`, in stream order."""
        persist: Persist | None = None
        for item in items:
            if item.HasField("entry"):
                e = item.entry
                fp = self.followed.get(e.partition)
                if fp is None or fp.master != master or fp.loading:
                    continue
                expected = fp.received[1] + 1
                if e.seq < expected:
                    continue  # already have it (resent after a reconnect or a need)
                if e.seq > expected:
                    if fp.need != expected:
                        fp.need, fp.need_at = expected, self.now
                        self._need(fp)
                    continue
                fp.received = (e.epoch, e.seq)
                fp.need = 0
                if persist is None:
                    persist = self._new_persist()
                persist.ops.extend(ops_from_pb(e.ops))
                persist.positions[e.partition] = fp.received
            else:
                c = item.snapshot
                fp = self.followed.get(c.partition)
                if fp is None or fp.master != master:
                    continue
                if persist is None:
                    persist = self._new_persist()
                if c.first:
                    fp.loading = True
                    fp.need = 0
                    # Anything this batch held for the partition is superseded.
                    persist.clear.append(c.partition)
                    persist.ops = [op for op in persist.ops if not _in_partition(op, c.partition)]
                    persist.positions[c.partition] = NOWHERE
                elif not fp.loading:
                    continue
                persist.ops.extend(ops_from_pb(c.ops))
                if c.last:
                    fp.loading = False
                    fp.received = (c.epoch, c.seq)
                    persist.positions[c.partition] = fp.received
        if persist is not None:
            self._ready.persist.append(persist)

    def follower_durable(self, persist_id: int) -> None:
        persist = self._persisting.pop(persist_id)
        for p, (epoch, seq) in persist.positions.items():
            fp = self.followed.get(p)
            if fp is None:
                continue
            fp.durable = (epoch, seq)
            frame = self._to_master(fp.master)
            frame.acks.append(pb.PartitionPosition(partition=p, epoch=epoch, seq=seq))

    def _new_persist(self) -> Persist:
        self._persist_seq += 1
        persist = Persist(self._persist_seq)
        self._persisting[persist.id] = persist
        return persist

    def _need(self, fp: FollowedPartition) -> None:
        frame = self._to_master(fp.master)
        frame.needs.append(pb.PartitionPosition(partition=fp.partition, seq=fp.need))

    def _to_master(self, master: str) -> pb.FollowerFrame:
        frame = self._ready.to_masters.get(master)
        if frame is None:
            frame = self._ready.to_masters[master] = pb.FollowerFrame()
        return frame

    # ----- time and output ---------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1
        now, lag = self.now, self.limits.lag_ticks
        dropped = False
        for m in self.mastered.values():
            for fp in m.followers.values():
                if fp.in_sync and fp.acked < m.durable and now - fp.caught_up_at > lag:
                    fp.in_sync = False
                    dropped = True
        if dropped:
            self._advance()
        retry = self.limits.need_retry_ticks
        for fd in self.followed.values():
            if fd.need and fd.master in self.links and now - fd.need_at >= retry:
                fd.need_at = now
                self._need(fd)

    def ready(self) -> Ready:
        """What to send, persist, read and release now; each call hands it over once."""
        ready, self._ready = self._ready, Ready()
        return ready

    # ----- status ------------------------------------------------------------------------

    def follower_status(self, p: int) -> list[pb.FollowerStatus]:
        m = self.mastered.get(p)
        if m is None:
            return []
        return [
            pb.FollowerStatus(
                node_id=fp.node,
                acknowledged=fp.acked,
                lag=m.lag(fp),
                in_sync=fp.in_sync,
                state=fp.state,
            )
            for fp in m.followers.values()
        ]

    def in_sync_followers(self, p: int) -> list[FollowerProgress]:
        m = self.mastered.get(p)
        return [fp for fp in m.followers.values() if fp.in_sync] if m is not None else []

    def lag(self, p: int, fp: FollowerProgress) -> int:
        m = self.mastered.get(p)
        return m.lag(fp) if m is not None else 0

    def lag_by_follower(self) -> dict[str, int]:
        """Entries each follower node has not acknowledged, over the partitions mastered here."""
        lags: dict[str, int] = {}
        for m in self.mastered.values():
            for fp in m.followers.values():
                lags[fp.node] = lags.get(fp.node, 0) + m.lag(fp)
        return lags

    def position(self, p: int) -> Position:
        m = self.mastered.get(p)
        if m is not None:
            return (m.durable_epoch, m.durable)
        fp = self.followed.get(p)
        return fp.received if fp is not None else NOWHERE


def _in_partition(op: Op, p: int) -> bool:
    return op[1].startswith(f"hx:{p}:")
