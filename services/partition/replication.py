"""Replication of a node's partitions: a deterministic state machine with no I/O.

Every partition has a master and followers, as the agreed view says (services/membership; the
view names each partition's master epoch, replicas and in-sync set). The master sequences the
writes of each group-commit batch per partition (one LogEntry per partition and batch, seq =
previous + 1), makes them durable in its own Redis first and only then streams them to its
followers; a batch's results are released (`Ready.committed`) once every follower the master
counts as in sync has acknowledged, durably, the entry it needs.

The in-sync set changes only through the view (docs/failover.md): the master asks for a
follower to be added once it has caught up and counts it from that moment; it asks for a
lagging or lost one to be removed and keeps counting it until the view (the agent's answer)
confirms. So the view's in-sync set always holds every acknowledged write, and any member of
it may be promoted.

Epochs and histories (after Kafka's KIP-101/279): each replica keeps the partition's epoch
history, (epoch, first seq) per master tenure. A follower joins its master per partition with
the (epoch, seq) of its last entry; the master answers with a `FeedStart` at its epoch, then the
log from there if that position lies on its own history (and its in-memory log reaches back),
or else a snapshot of its state, which replaces the follower's copy: a position off the
master's history is a tail the master never had, hence never acknowledged. A follower that is in
the in-sync set is taken out of it through the view before its copy is replaced. Followers keep
the same in-memory log of recent entries as masters, so that a promoted follower can serve its
followers from the log.

Fencing: a follower takes a partition's items only after a FeedStart whose epoch is its view's
epoch for the partition, on the stream from its view's master; a master takes joins, acks and
needs only of its current epoch. A deposed master therefore commits nothing that needs a
follower; one whose in-sync set is itself alone commits only while its liveness lease holds.

The adapters (services/partition/peers.py) feed inputs in and carry `ready()` out: gRPC
streams between nodes, the follower's Redis writes, the master's snapshot reads, proposals to
the membership agent. Tests drive this class directly over an in-memory network
(tests/unit/test_replication_scenarios.py).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import BASELINE, ZLIB_SNAPSHOTS, ClusterProtocol
from services.partition.snapshot_codec import (
    ChunkSent,
    SnapshotChunkError,
    chunk_ops,
    fill_chunk,
)

HSET = pb.StorageOp.KIND_HSET
HDEL = pb.StorageOp.KIND_HDEL
DEL = pb.StorageOp.KIND_DEL
# (kind, key, field, value): one storage write. Tuples on the hot path; protobuf only on the wire.
Op = tuple[int, str, bytes, bytes]
# (epoch, seq): where a replica of a partition stands. (0, 0) is "holds nothing".
Position = tuple[int, int]
NOWHERE: Position = (0, 0)
# (epoch, first seq) per master tenure, oldest first.
History = tuple[tuple[int, int], ...]

DEFAULT_LOG_ENTRIES = 50_000


class FollowerState(Enum):
    """A follower as the master sees it: what its stream is doing. The value is what the
    status call reports (FollowerStatus.state)."""

    DOWN = "down"
    SNAPSHOT = "snapshot"
    LOG = "log"
    LIVE = "live"
    # Joined, but its copy must be replaced by a snapshot once the view no longer counts it in
    # sync.
    WAITING = "waiting"


class InSync(Enum):
    """A follower's standing in the master's in-sync accounting. Counted (its acknowledgement
    is needed to release a write) in every standing but OUT."""

    OUT = "out"
    ADDING = "adding"  # asked the view to add it; counted from the moment of asking
    IN = "in"  # in the view's in-sync set
    REMOVING = "removing"  # asked the view to remove it; counted until the view confirms


@dataclass(frozen=True, slots=True)
class ReplicationLimits:
    """log_entries/log_bytes: how much of each partition's recent history a replica keeps for
    catch-up; window: entries sent to one follower of one partition and not yet acknowledged;
    lag_ticks: how long a counted follower may stay behind before the master asks the view to
    drop it; down_ticks: how long a counted follower's stream may be down before that;
    need_retry_ticks: how long a follower waits before asking for a gap, or joining, again."""

    log_entries: int = DEFAULT_LOG_ENTRIES
    log_bytes: int = 16 << 20
    window: int = 512
    lag_ticks: int = 50
    down_ticks: int = 2
    need_retry_ticks: int = 10


def op_size(op: Op) -> int:
    return len(op[1]) + len(op[2]) + len(op[3]) + 8


def ops_to_pb(ops: Iterable[Op]) -> list[pb.StorageOp]:
    return [pb.StorageOp(kind=k, key=key, field=f, value=v) for k, key, f, v in ops]  # type: ignore[arg-type]


def ops_from_pb(ops: Iterable[pb.StorageOp]) -> list[Op]:
    return [(op.kind, op.key, op.field, op.value) for op in ops]


def history_of(position: Position, history: Sequence[tuple[int, int]] = ()) -> History:
    """A stored history, or for data stored before histories existed, one epoch from seq 1."""
    if history:
        return tuple((int(e), int(s)) for e, s in history)
    return ((position[0], 1),) if position[1] else ()


def on_history(history: History, last_seq: int, pos: Position) -> bool:
    """True if the entry at pos[1] of this history (whose last entry is last_seq) has epoch
    pos[0]: a replica standing at pos holds a prefix of this history. (0, 0) always is."""
    epoch, seq = pos
    if seq == 0:
        return epoch == 0
    if seq > last_seq:
        return False
    for i, (e, start) in enumerate(history):
        if e == epoch:
            end = history[i + 1][1] - 1 if i + 1 < len(history) else last_seq
            return start <= seq <= end
    return False


def history_to_pb(history: History) -> list[pb.PartitionPosition]:
    return [pb.PartitionPosition(epoch=e, seq=s) for e, s in history]


@dataclass(slots=True)
class Entry:
    partition: int
    epoch: int
    seq: int
    ops: list[Op]
    size: int
    _item: pb.ReplicationItem | None = None
    # Set on the first entry a master writes in its epoch: the history to store with it.
    history: History | None = None
    # The QoS 1 publishes written by this entry, by origin (LogEntry.origins).
    origins: Sequence[bytes] = ()

    def item(self) -> pb.ReplicationItem:
        """The wire form, built once and shared by every follower."""
        if self._item is None:
            self._item = pb.ReplicationItem(
                entry=pb.LogEntry(
                    partition=self.partition,
                    epoch=self.epoch,
                    seq=self.seq,
                    ops=ops_to_pb(self.ops),
                    origins=self.origins,
                )
            )
        return self._item


@dataclass(slots=True)
class RecentLog:
    """The recent entries of one partition, for followers to catch up from:
    entries[i].seq == start + i; `base_epoch` is the epoch of the entry at start - 1."""

    entries: deque[Entry] = field(default_factory=deque)
    size: int = 0
    start: int = 1
    base_epoch: int = 0
    # Origin of each QoS 1 publish the entries hold -> the seq of its entry.
    by_origin: dict[bytes, int] = field(default_factory=dict)

    def reset(self, position: Position) -> None:
        self.entries.clear()
        self.by_origin.clear()
        self.size = 0
        self.start = position[1] + 1
        self.base_epoch = position[0]

    def append(self, entry: Entry, limits: ReplicationLimits, pinned: int) -> None:
        if not self.entries:
            self.start = entry.seq
        self.entries.append(entry)
        self.size += entry.size
        if entry.origins:
            by_origin = self.by_origin
            for origin in entry.origins:
                by_origin[origin] = entry.seq
        entries = self.entries
        while entries and (len(entries) > limits.log_entries or self.size > limits.log_bytes):
            if entries[0].seq >= pinned:
                break
            gone = entries.popleft()
            self.size -= gone.size
            self.base_epoch = gone.epoch
            self.start = gone.seq + 1
            for origin in gone.origins:
                if self.by_origin.get(origin) == gone.seq:
                    del self.by_origin[origin]

    def reaches(self, seq: int) -> bool:
        """The log holds every entry from seq on (up to its end)."""
        return seq >= self.start

    def bytes_after(self, seq: int) -> int | None:
        """The size of the entries after seq (None: the log no longer reaches back to them)."""
        if not self.reaches(seq + 1):
            return None
        return sum(e.size for e in itertools.islice(self.entries, seq + 1 - self.start, None))


@dataclass(slots=True)
class FollowerProgress:
    """The master's view of one follower of one partition."""

    node: str
    state: FollowerState = FollowerState.DOWN
    # Next seq to send (LOG/LIVE), and the highest seq the follower has made durable.
    next: int = 0
    acked: int = 0
    isr: InSync = InSync.OUT
    # The last tick at which the follower had acknowledged all the master had made durable,
    # and the tick its stream went down (while DOWN).
    caught_up_at: int = 0
    down_since: int = 0
    # SNAPSHOT: which snapshot (ids are unique per Replicator, so a reader of an abandoned one
    # is told to stop even when the new one stands at the same position), the position it
    # stands for, and whether its first chunk went out.
    snapshot_id: int = 0
    snapshot_at: Position = NOWHERE
    snapshot_started: bool = False
    # Bytes of storage ops the snapshot has sent so far (for status: what is left).
    snapshot_sent: int = 0
    # The last join this follower made on its current stream (None: none yet). One answered
    # by a snapshot has its FeedStart sent with the first chunk, which may take a while (reads
    # wait for a slot, Redis is busy): the follower joins again meanwhile, every
    # need_retry_ticks, and each such join used to restart the snapshot, which then never got
    # to its first chunk (the rebalance benchmark: 9 partitions copying by snapshot for good).
    last_join: Position | None = None
    # No longer one of the view's replicas, but still counted until the agent settles the
    # in-sync change asked for it (an addition might yet be made).
    departed: bool = False
    # It has joined since this master took the partition (until then its stream may simply
    # not be open yet: a new master waits lag_ticks, not down_ticks, before asking to drop it).
    joined: bool = False

    @property
    def counted(self) -> bool:
        return self.isr != InSync.OUT


@dataclass(slots=True)
class MasteredPartition:
    partition: int
    epoch: int
    # Last seq assigned, last seq durable here, and the epoch of the entry at `durable`.
    seq: int
    durable: int
    durable_epoch: int
    followers: dict[str, FollowerProgress]
    history: History
    log: RecentLog
    # More than one replica (a lone master of a partition with followers needs its lease).
    replicated: bool = True
    # The first entry of this epoch has not been proposed yet: it carries the history.
    history_unwritten: bool = True
    # The view asks this master to hand the partition over to this in-sync replica: new writes
    # stop (the node answers MOVED) and the handover is asked for once none is pending.
    handover_to: str = ""
    handover_asked: bool = False

    def lag(self, fp: FollowerProgress) -> int:
        """Entries durable here that the follower has not acknowledged."""
        return max(self.durable - fp.acked, 0)


@dataclass(slots=True)
class FollowedPartition:
    partition: int
    master: str
    epoch: int
    # What this follower has accepted in order (durable, or queued for its store in order),
    # and what of it is durable (what a join may claim).
    received: Position = NOWHERE
    durable: Position = NOWHERE
    history: History = ()
    log: RecentLog = field(default_factory=RecentLog)
    # The master's FeedStart at `epoch` arrived on the current stream: its items are taken.
    accepting: bool = False
    # When the last join was sent on the current stream (0: none yet).
    joined_at: int = 0
    # A snapshot is being written: the partition's state is partial until its last chunk.
    loading: bool = False
    # The master's history as its snapshot's FeedStart gave it (the history after the last chunk).
    snapshot_history: History = ()
    # `history` changed without being stored yet (it goes with the next persist).
    history_dirty: bool = False
    # The seq asked for after a gap (0: none), and when.
    need: int = 0
    need_at: int = 0


@dataclass(slots=True)
class Persist:
    """Writes a follower must make durable, in one transaction: first drop the partitions in
    `clear`, then apply `ops` in order, then record `positions` (with `histories` where they
    changed); then call `Replicator.follower_durable(id)`."""

    id: int
    clear: list[int] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    positions: dict[int, Position] = field(default_factory=dict)
    histories: dict[int, History] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """Read partition's stored state (at or after `at`) in chunks and hand each to
    `Replicator.snapshot_chunk(read, ops, last)`."""

    follower: str
    partition: int
    at: Position
    id: int


@dataclass(frozen=True, slots=True)
class InSyncChange:
    """Ask the view to add `follower` to (or remove it from) the partition's in-sync set; the
    answer comes back through `Replicator.in_sync_settled`. An addition names the follower's
    incarnation (from its stream's hello): the view adds only that incarnation."""

    partition: int
    epoch: int
    follower: str
    add: bool
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class HandoverReady:
    """The partition is quiesced: ask the view to make `to` its master."""

    partition: int
    epoch: int
    to: str


@dataclass(slots=True)
class Ready:
    to_followers: dict[str, list[pb.ReplicationItem]] = field(default_factory=dict)
    to_masters: dict[str, pb.FollowerFrame] = field(default_factory=dict)
    persist: list[Persist] = field(default_factory=list)
    snapshot_reads: list[SnapshotRead] = field(default_factory=list)
    # Master batches now released, in proposal order, each with the partitions whose part of
    # it was aborted (this node stopped mastering them at that epoch): the commands that wrote
    # them must not be acknowledged.
    committed: list[tuple[object, frozenset[int]]] = field(default_factory=list)
    # Partitions this node now masters (load them, then serve) and no longer masters (drop
    # their memory state).
    promoted: list[int] = field(default_factory=list)
    demoted: list[int] = field(default_factory=list)
    in_sync_changes: list[InSyncChange] = field(default_factory=list)
    handovers: list[HandoverReady] = field(default_factory=list)
    # The masters this node follows may have changed (a deferred role change was applied):
    # open and close replication streams to match masters_followed().
    relink: bool = False

    def __bool__(self) -> bool:
        return bool(
            self.relink
            or self.to_followers
            or self.to_masters
            or self.persist
            or self.snapshot_reads
            or self.committed
            or self.promoted
            or self.demoted
            or self.in_sync_changes
            or self.handovers
        )


@dataclass(frozen=True, slots=True)
class Assignment:
    """A partition's entry in the agreed view."""

    epoch: int
    replicas: tuple[str, ...]
    in_sync: frozenset[str] = frozenset()
    handover_to: str = ""

    @property
    def master(self) -> str:
        return self.replicas[0] if self.replicas else ""


@dataclass(frozen=True, slots=True)
class Stored:
    """A partition as this node's store holds it: its position and epoch history."""

    position: Position = NOWHERE
    history: History = ()


class Replicator:
    def __init__(self, node_id: str, limits: ReplicationLimits | None = None) -> None:
        self.node_id = node_id
        self.limits = limits or ReplicationLimits()
        self.now = 0
        self.mastered: dict[int, MasteredPartition] = {}
        self.followed: dict[int, FollowedPartition] = {}
        # Followers with an open stream to this node (with their incarnation, from the hello),
        # and masters this node has a stream to.
        self.feeds: dict[str, int] = {}
        self.links: set[str] = set()
        # The node's liveness lease (its agent holds a live session): a lone master of a
        # replicated partition releases writes only while it holds.
        self.lease = True
        # Master batches waiting for followers, in proposal order:
        # (token, {partition: (epoch, seq)}, partitions aborted at proposal).
        self._pending: deque[tuple[object, dict[int, tuple[int, int]], frozenset[int]]] = deque()
        self._persist_seq = 0
        self._snapshot_ids = 0
        self._persisting: dict[int, Persist] = {}
        # Role changes that wait for the partition's writes on their way to this node's store
        # (as master or as follower): partition -> the assignment (None: no role any more).
        # master_durable and follower_durable apply them once the store has everything, so
        # that the position a partition then starts from is what its store holds.
        self._deferred: dict[int, Assignment | None] = {}
        self._ready = Ready()
        # What the cluster speaks, by the view this node acts on (set_protocol): snapshot
        # chunks are packed only while it has zlib-snapshots on.
        self.protocol: ClusterProtocol = BASELINE

    # ----- roles -----------------------------------------------------------------------

    def set_protocol(self, protocol: ClusterProtocol) -> None:
        """What the cluster speaks by the view about to be set (before set_view): a follower
        of another release is a replica only in views that count it a member, and such a view
        turns off what it cannot read."""
        self.protocol = protocol

    def set_view(self, assignments: Mapping[int, Assignment], stored: Mapping[int, Stored]) -> None:
        """Take the roles the view gives this node. `stored` is what this node's store holds
        of the partitions it has no role in yet (position and history). A partition whose
        master or epoch changes starts afresh: a master that is deposed aborts its pending
        writes of the partition and follows; a follower that becomes master first makes
        durable what it received, then takes the new epoch from its position."""
        me = self.node_id
        held = set(self.mastered) | set(self.followed)
        for p in sorted(held | set(assignments)):
            a = assignments.get(p)
            if a is not None and me not in a.replicas:
                a = None
            if a is None and p not in held:
                continue
            if self._role_changes(p, a) and not self._settled(p):
                self._deferred[p] = a
                fd = self.followed.get(p)
                if fd is not None:
                    fd.accepting = False  # nothing more from the old master meanwhile
                continue
            self._deferred.pop(p, None)
            self._apply(p, a, stored.get(p, Stored()))
        self._advance()

    def _role_changes(self, p: int, a: Assignment | None) -> bool:
        m = self.mastered.get(p)
        if m is not None:
            return a is None or a.master != self.node_id or a.epoch != m.epoch
        fd = self.followed.get(p)
        if fd is not None:
            return a is None or a.master != fd.master or a.epoch != fd.epoch
        return a is not None

    def _settled(self, p: int) -> bool:
        """No write of p is on its way to this node's store."""
        m = self.mastered.get(p)
        if m is not None:
            return m.seq == m.durable
        fd = self.followed.get(p)
        return fd is None or fd.received == fd.durable

    def _apply_settled(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            if p in self._deferred and self._settled(p):
                self._apply(p, self._deferred.pop(p), Stored())

    def _apply(self, p: int, a: Assignment | None, stored: Stored) -> None:
        self._ready.relink = True
        if a is None:
            self._drop(p)
        elif a.master == self.node_id:
            self._take_master(p, a, stored)
        else:
            self._take_follower(p, a, stored)

    def _drop(self, p: int) -> None:
        if self.mastered.pop(p, None) is not None:
            self._ready.demoted.append(p)
        self.followed.pop(p, None)

    def _take_master(self, p: int, a: Assignment, stored: Stored) -> None:
        m = self.mastered.get(p)
        if m is not None and m.epoch == a.epoch:
            self._follow_view(m, a)
            return
        if m is not None:
            # Mastered at another epoch: a new tenure (writes pending at the old one abort).
            del self.mastered[p]
            self._ready.demoted.append(p)
            position, history, log = (m.durable_epoch, m.durable), m.history, m.log
        else:
            fd = self.followed.get(p)
            if fd is not None:
                del self.followed[p]
                position, history, log = fd.durable, fd.history, fd.log
            else:
                position, history, log = (
                    stored.position,
                    history_of(stored.position, stored.history),
                    RecentLog(),
                )
                log.reset(position)
        if not history or history[-1][0] < a.epoch:
            history = (*history, (a.epoch, position[1] + 1))
        m = MasteredPartition(
            partition=p,
            epoch=a.epoch,
            seq=position[1],
            durable=position[1],
            durable_epoch=position[0],
            # Caught up "now": a follower has lag_ticks from the start of this tenure to join
            # and catch up before it counts as lagging (from 0 it would count as lagging on
            # the first tick, and every in-sync follower would be dropped at once: seed 2027).
            followers={
                n: FollowerProgress(n, down_since=self.now, caught_up_at=self.now)
                for n in a.replicas[1:]
            },
            history=history,
            log=log,
        )
        self.mastered[p] = m
        self._follow_view(m, a)
        self._ready.promoted.append(p)

    def _follow_view(self, m: MasteredPartition, a: Assignment) -> None:
        """The view's replicas, in-sync set and handover request for a partition mastered here."""
        m.replicated = len(a.replicas) > 1
        wanted = set(a.replicas[1:])
        for node, fp in list(m.followers.items()):
            if node in wanted:
                continue
            if fp.isr in (InSync.ADDING, InSync.REMOVING):
                fp.departed = True  # counted until its change is settled
            else:
                del m.followers[node]
        for node in sorted(wanted):
            known = m.followers.get(node)
            fp = (
                known
                if known is not None
                else FollowerProgress(node, down_since=self.now, caught_up_at=self.now)
            )
            if known is None or known.departed:
                m.followers[node] = fp
                fp.departed = False
                if node in self.feeds:
                    # Its stream is open already: it joins on it when asked (it may not
                    # know yet that it follows this partition again).
                    self._out(node).append(
                        pb.ReplicationItem(
                            start=pb.FeedStart(partition=m.partition, epoch=m.epoch, rejoin=True)
                        )
                    )
            if node in a.in_sync:
                if fp.isr == InSync.OUT:
                    fp.isr = InSync.IN
            elif fp.isr == InSync.IN:
                # Removed through the view: its node was lost, or this master took an older
                # view after its agent had confirmed the removal it asked for (seed 2027). A
                # follower that is caught up is asked back now: on a partition without writes
                # no acknowledgement would ever ask for it.
                fp.isr = InSync.OUT
                self._consider_adding(m, fp)
            if fp.state == FollowerState.WAITING and not fp.counted:
                self._start_snapshot(m, fp)
        if a.handover_to != m.handover_to:
            m.handover_to = a.handover_to
            m.handover_asked = False

    def _take_follower(self, p: int, a: Assignment, stored: Stored) -> None:
        fd = self.followed.get(p)
        if fd is not None and fd.master == a.master and fd.epoch == a.epoch:
            return
        m = self.mastered.pop(p, None)
        if m is not None:
            self._ready.demoted.append(p)
            position, history, log = (m.durable_epoch, m.durable), m.history, m.log
        elif fd is not None:
            position, history, log = fd.durable, fd.history, fd.log
        else:
            position, history, log = (
                stored.position,
                history_of(stored.position, stored.history),
                RecentLog(),
            )
            log.reset(position)
        new = FollowedPartition(p, a.master, a.epoch, history=history, log=log)
        new.received = new.durable = position
        new.loading = fd.loading if fd is not None else False
        self.followed[p] = new
        self._join(new)

    def masters_followed(self) -> set[str]:
        """The nodes this node needs a replication stream to."""
        return {fp.master for fp in self.followed.values()}

    def accepts_writes(self, p: int) -> bool:
        """The partition is mastered here and not being handed over."""
        m = self.mastered.get(p)
        return m is not None and not m.handover_to

    def pending_writes(self, p: int) -> bool:
        """Writes of p proposed here are not released yet."""
        return any(p in parts for _token, parts, _aborted in self._pending)

    # ----- master side -------------------------------------------------------------------

    def propose(
        self,
        writes: Mapping[int, Sequence[Op]],
        origins: Mapping[int, Sequence[bytes]] | None = None,
    ) -> tuple[list[Entry], frozenset[int]]:
        """Sequence one batch's writes: one entry per partition, with the origins of the QoS 1
        publishes it holds (`origins`; a partition with origins and no writes gets an entry
        all the same: the barrier of a publish written before, see `wrote`). The caller makes
        the entries durable (with the position, and the history where an entry carries one)
        and then calls `master_durable`. Writes of partitions no longer mastered here are not
        made (returned as aborted: the commands that made them must not be acknowledged)."""
        entries = []
        aborted = []
        parts = list(writes)
        if origins:
            parts += [p for p in origins if p not in writes]
        for p in parts:
            ops = writes.get(p, ())
            m = self.mastered.get(p)
            if m is None:
                aborted.append(p)
                continue
            ors = origins.get(p, ()) if origins else ()
            if not ops and not ors:
                continue
            m.seq += 1
            size = sum(op_size(op) for op in ops) + sum(len(o) for o in ors)
            entry = Entry(p, m.epoch, m.seq, list(ops), size, origins=ors)
            if m.history_unwritten:
                entry.history = m.history
                m.history_unwritten = False
            entries.append(entry)
        return entries, frozenset(aborted)

    def wrote(self, p: int, origin: bytes) -> bool:
        """Whether the recent log of p, mastered here, holds a publish from `origin` (written by
        this node as master, or received while it followed p): a publish sent again after a
        failover or a link outage, not to be written twice."""
        m = self.mastered.get(p)
        return m is not None and origin in m.log.by_origin

    def master_durable(
        self, entries: Sequence[Entry], token: object, aborted: frozenset[int] = frozenset()
    ) -> None:
        """`entries` (from `propose`, in order) are durable here: stream them to followers and
        release `token` once every counted follower has them."""
        parts: dict[int, tuple[int, int]] = {}
        now = self.now
        for e in entries:
            parts[e.partition] = (e.epoch, e.seq)
            m = self.mastered.get(e.partition)
            if m is None or m.epoch != e.epoch:
                continue  # the partition moved while the batch was being written
            for fp in m.followers.values():
                if fp.acked >= m.durable:
                    fp.caught_up_at = now
            m.durable = e.seq
            m.durable_epoch = e.epoch
            m.log.append(e, self.limits, self._pinned(m))
            for fp in m.followers.values():
                if fp.state in (FollowerState.LOG, FollowerState.LIVE):
                    self._send(m, fp)
        self._pending.append((token, parts, aborted))
        if self._deferred:
            self._apply_settled([p for p in parts if p in self._deferred])
        self._advance()

    def _pinned(self, m: MasteredPartition) -> int:
        """A follower taking a snapshot needs the entries after the snapshot's position."""
        return min(
            (
                fp.snapshot_at[1] + 1
                for fp in m.followers.values()
                if fp.state == FollowerState.SNAPSHOT
            ),
            default=m.durable + 1,
        )

    def feed_open(
        self, follower: str, joins: Iterable[pb.PartitionPosition], incarnation: int = 0
    ) -> None:
        """A follower opened its stream (replacing any earlier one); its hello's joins."""
        self.feeds[follower] = incarnation
        for m in self.mastered.values():
            fp = m.followers.get(follower)
            if fp is not None:
                self._lose_stream(fp)
        self.step_joins(follower, joins)

    def step_joins(self, follower: str, joins: Iterable[pb.PartitionPosition]) -> None:
        """The follower starts following these partitions from these positions."""
        for join in joins:
            m = self.mastered.get(join.partition)
            fp = m.followers.get(follower) if m is not None else None
            if m is None or fp is None or fp.departed or join.leader_epoch != m.epoch:
                continue  # not ours at that epoch (one of us has not seen the view yet)
            self._accept_join(m, fp, (join.epoch, join.seq))
        self._advance()

    def _accept_join(self, m: MasteredPartition, fp: FollowerProgress, pos: Position) -> None:
        if fp.state == FollowerState.SNAPSHOT and fp.last_join == pos:
            return  # the same join again, on the same stream: its snapshot is under way
        fp.last_join = pos
        fp.snapshot_started = False
        fp.joined = True
        if on_history(m.history, m.durable, pos) and m.log.reaches(pos[1] + 1):
            fp.state = FollowerState.LIVE if pos[1] == m.durable else FollowerState.LOG
            fp.next, fp.acked = pos[1] + 1, pos[1]
            if fp.state == FollowerState.LIVE:
                fp.caught_up_at = self.now
            self._out(fp.node).append(self._start_item(m, pos[1] + 1, snapshot=False))
            self._send(m, fp)
            self._consider_adding(m, fp)
            return
        # Off this master's history (a tail it never had), or behind its log: the follower's
        # copy is replaced by a snapshot, once the view no longer counts it in sync.
        fp.acked = 0
        if fp.counted:
            fp.state = FollowerState.WAITING
            self._ask_removal(m, fp)
        else:
            self._start_snapshot(m, fp)

    def _start_item(
        self, m: MasteredPartition, from_seq: int, *, snapshot: bool
    ) -> pb.ReplicationItem:
        history = [h for h in m.history if h[1] < from_seq] if not snapshot else list(m.history)
        return pb.ReplicationItem(
            start=pb.FeedStart(
                partition=m.partition,
                epoch=m.epoch,
                from_seq=from_seq,
                snapshot=snapshot,
                history=history_to_pb(tuple(history)),
            )
        )

    def feed_closed(self, follower: str) -> None:
        self.feeds.pop(follower, None)
        for m in self.mastered.values():
            fp = m.followers.get(follower)
            if fp is not None:
                self._lose_stream(fp)
        self._advance()

    def _lose_stream(self, fp: FollowerProgress) -> None:
        if fp.state != FollowerState.DOWN:
            fp.down_since = self.now
        fp.state = FollowerState.DOWN
        fp.snapshot_started = False
        fp.last_join = None

    def step_acks(self, follower: str, acks: Iterable[pb.PartitionPosition]) -> None:
        now = self.now
        for ack in acks:
            m = self.mastered.get(ack.partition)
            fp = m.followers.get(follower) if m is not None else None
            if (
                m is None
                or fp is None
                or fp.state not in (FollowerState.LOG, FollowerState.LIVE)
                or ack.leader_epoch != m.epoch
            ):
                continue
            if ack.seq > fp.acked:
                fp.acked = min(ack.seq, m.durable)
            if fp.acked >= m.durable:
                fp.caught_up_at = now
                fp.state = FollowerState.LIVE
                self._consider_adding(m, fp)
            self._send(m, fp)
        self._advance()

    def step_needs(self, follower: str, needs: Iterable[pb.PartitionPosition]) -> None:
        """The follower met a gap: resend from the seq it expected, or snapshot."""
        for need in needs:
            m = self.mastered.get(need.partition)
            fp = m.followers.get(follower) if m is not None else None
            if (
                m is None
                or fp is None
                or fp.state not in (FollowerState.LOG, FollowerState.LIVE)
                or need.leader_epoch != m.epoch
            ):
                continue
            fp.acked = min(fp.acked, need.seq - 1)
            if m.log.reaches(need.seq) and need.seq <= m.durable + 1:
                fp.state, fp.next = FollowerState.LOG, need.seq
                self._send(m, fp)
            elif fp.counted:
                fp.state = FollowerState.WAITING
                self._ask_removal(m, fp)
            else:
                self._start_snapshot(m, fp)
        self._advance()

    def snapshot_chunk(self, read: SnapshotRead, ops: list[Op], last: bool) -> ChunkSent | None:
        """One chunk of a snapshot read, and how it went out; None if that snapshot is no
        longer wanted (the stream broke or a newer one started): the reader stops."""
        follower, p, at = read.follower, read.partition, read.at
        m = self.mastered.get(p)
        fp = m.followers.get(follower) if m is not None else None
        if (
            m is None
            or fp is None
            or fp.state != FollowerState.SNAPSHOT
            or fp.snapshot_id != read.id
        ):
            return None
        chunk = pb.SnapshotChunk(
            partition=p,
            epoch=at[0],
            seq=at[1],
            first=not fp.snapshot_started,
            last=last,
        )
        sent = fill_chunk(chunk, ops, packed=self.protocol.uses(ZLIB_SNAPSHOTS))
        out = self._out(follower)
        if not fp.snapshot_started:
            out.append(self._start_item(m, at[1] + 1, snapshot=True))
        fp.snapshot_started = True
        fp.snapshot_sent += sum(op_size(op) for op in ops)
        out.append(pb.ReplicationItem(snapshot=chunk))
        if last:
            fp.state, fp.next, fp.acked = FollowerState.LOG, at[1] + 1, 0
            self._send(m, fp)
        return sent

    def snapshot_lost(self, read: SnapshotRead) -> None:
        """A snapshot read ended without its last chunk for a reason other than the stream or
        a newer snapshot (the adapter's read failed): if that snapshot is still wanted, start
        it again, since the follower's repeated joins no longer do."""
        m = self.mastered.get(read.partition)
        fp = m.followers.get(read.follower) if m is not None else None
        if (
            m is None
            or fp is None
            or fp.state != FollowerState.SNAPSHOT
            or fp.snapshot_id != read.id
        ):
            return
        self._start_snapshot(m, fp)

    def _start_snapshot(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        fp.state = FollowerState.SNAPSHOT
        fp.snapshot_started = False
        fp.snapshot_sent = 0
        fp.snapshot_at = (m.durable_epoch, m.durable)
        fp.acked = 0
        self._snapshot_ids += 1
        fp.snapshot_id = self._snapshot_ids
        self._ready.snapshot_reads.append(
            SnapshotRead(fp.node, m.partition, fp.snapshot_at, fp.snapshot_id)
        )

    def _send(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        if fp.next <= m.durable and not m.log.reaches(fp.next):
            # The log no longer reaches back to it.
            if fp.counted:
                fp.state = FollowerState.WAITING
                self._ask_removal(m, fp)
            else:
                self._start_snapshot(m, fp)
            return
        limit = min(m.durable, fp.acked + self.limits.window)
        if fp.next > limit:
            return
        out = self._out(fp.node)
        entries, start = m.log.entries, m.log.start
        for seq in range(fp.next, limit + 1):
            out.append(entries[seq - start].item())
        fp.next = limit + 1

    # ----- the in-sync set (through the view) ---------------------------------------------

    def _consider_adding(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        if (
            fp.isr == InSync.OUT
            and fp.state == FollowerState.LIVE
            and fp.acked >= m.durable
            and not fp.departed
        ):
            fp.isr = InSync.ADDING
            incarnation = self.feeds.get(fp.node, 0)
            self._ready.in_sync_changes.append(
                InSyncChange(m.partition, m.epoch, fp.node, True, incarnation)
            )

    def _ask_removal(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        if fp.isr in (InSync.IN, InSync.ADDING):
            fp.isr = InSync.REMOVING
            self._ready.in_sync_changes.append(InSyncChange(m.partition, m.epoch, fp.node, False))

    def in_sync_settled(self, change: InSyncChange, *, made: bool) -> None:
        """The agent's answer to a change: made (it holds in an agreed view, or a removal is moot),
        or not made (an addition it will not make)."""
        m = self.mastered.get(change.partition)
        fp = m.followers.get(change.follower) if m is not None else None
        if m is None or fp is None or m.epoch != change.epoch:
            return
        if change.add:
            if fp.isr == InSync.ADDING:
                fp.isr = InSync.IN if made and not fp.departed else InSync.OUT
        elif fp.isr == InSync.REMOVING:
            fp.isr = InSync.OUT
            if fp.state == FollowerState.WAITING:
                self._start_snapshot(m, fp)
        if fp.departed and fp.isr != InSync.REMOVING:
            if fp.isr == InSync.IN:
                # Added as it left: ask for its removal (it is no replica any more).
                self._ask_removal(m, fp)
            else:
                del m.followers[fp.node]
        else:
            self._consider_adding(m, fp)
        self._advance()

    def in_sync_failed(self, change: InSyncChange) -> None:
        """The agent could not be asked (unreachable): ask again."""
        m = self.mastered.get(change.partition)
        fp = m.followers.get(change.follower) if m is not None else None
        if m is None or fp is None or m.epoch != change.epoch:
            return
        if (change.add and fp.isr == InSync.ADDING) or (
            not change.add and fp.isr == InSync.REMOVING
        ):
            self._ready.in_sync_changes.append(change)

    def set_lease(self, valid: bool) -> None:
        if valid != self.lease:
            self.lease = valid
            self._advance()

    def handover_settled(self, ready: HandoverReady) -> None:
        """The agent answered a handover without making it (the view moved on): the partition
        takes writes again until the view asks anew."""
        m = self.mastered.get(ready.partition)
        if m is not None and m.epoch == ready.epoch:
            m.handover_asked = False

    def _releasable(self, parts: dict[int, tuple[int, int]]) -> bool:
        for p, (epoch, seq) in parts.items():
            m = self.mastered.get(p)
            if m is None or m.epoch != epoch:
                continue  # aborted: released without it
            counted = False
            for fp in m.followers.values():
                if fp.counted:
                    if fp.acked < seq:
                        return False
                    counted = True
            if not counted and m.replicated and not self.lease:
                return False
        return True

    def _advance(self) -> None:
        pending = self._pending
        committed = self._ready.committed
        while pending:
            token, parts, aborted = pending[0]
            if not self._releasable(parts):
                break
            pending.popleft()
            gone = [
                p
                for p, (epoch, _seq) in parts.items()
                if (m := self.mastered.get(p)) is None or m.epoch != epoch
            ]
            committed.append((token, aborted.union(gone) if gone else aborted))
        for m in self.mastered.values():
            if m.handover_to and not m.handover_asked and not self.pending_writes(m.partition):
                m.handover_asked = True
                self._ready.handovers.append(HandoverReady(m.partition, m.epoch, m.handover_to))

    def _out(self, follower: str) -> list[pb.ReplicationItem]:
        out = self._ready.to_followers.get(follower)
        if out is None:
            out = self._ready.to_followers[follower] = []
        return out

    # ----- follower side -----------------------------------------------------------------

    def link_open(self, master: str) -> list[pb.PartitionPosition]:
        """This node opened its stream to `master`: the joins its hello carries."""
        self.links.add(master)
        joins = []
        for fd in self.followed.values():
            if fd.master != master:
                continue
            fd.need = 0
            fd.accepting = False
            fd.joined_at = 0
            join = self._join_position(fd)
            if join is not None:
                joins.append(join)
        return joins

    def _join_position(self, fd: FollowedPartition) -> pb.PartitionPosition | None:
        """Where fd joins its master from, or None while writes it accepted are not durable yet
        (it joins once they are: a master counts the join's position as acknowledged)."""
        if fd.loading:
            # Cut off mid-snapshot: what is stored of the partition is partial (and its stored
            # position says so); start over from nothing.
            fd.loading = False
            fd.received = NOWHERE
            fd.history = ()
            if fd.durable != NOWHERE:
                return None  # the clear is still on its way to the store
        if fd.received != fd.durable:
            return None
        fd.joined_at = self.now or 1
        epoch, seq = fd.durable
        return pb.PartitionPosition(
            partition=fd.partition, epoch=epoch, seq=seq, leader_epoch=fd.epoch
        )

    def _join(self, fd: FollowedPartition) -> None:
        """Join fd's master on the open stream (a later join: the view changed)."""
        if fd.master not in self.links:
            return
        join = self._join_position(fd)
        if join is not None:
            self._to_master(fd.master).joins.append(join)

    def link_closed(self, master: str) -> None:
        self.links.discard(master)
        for fd in self.followed.values():
            if fd.master == master:
                fd.accepting = False
                fd.joined_at = 0

    def step_items(self, master: str, items: Iterable[pb.ReplicationItem]) -> None:
        """FeedStarts, entries and snapshot chunks from `master`, in stream order. Raises
        SnapshotChunkError for a chunk it cannot read (the items before it are taken); the
        adapter then ends the stream, and the follower joins again on a new one."""
        persist: Persist | None = None
        limits = self.limits
        for item in items:
            kind = item.WhichOneof("item")
            if kind == "entry":
                e = item.entry
                fd = self.followed.get(e.partition)
                if fd is None or fd.master != master or not fd.accepting or fd.loading:
                    continue
                expected = fd.received[1] + 1
                if e.seq < expected:
                    continue  # already have it (resent after a reconnect or a need)
                if e.seq > expected:
                    if fd.need != expected:
                        fd.need, fd.need_at = expected, self.now
                        self._need(fd)
                    continue
                fd.received = (e.epoch, e.seq)
                fd.need = 0
                if persist is None:
                    persist = self._new_persist()
                ops = ops_from_pb(e.ops)
                persist.ops.extend(ops)
                persist.positions[e.partition] = fd.received
                if not fd.history or fd.history[-1][0] < e.epoch:
                    fd.history = (*fd.history, (e.epoch, e.seq))
                    fd.history_dirty = True
                if fd.history_dirty:
                    persist.histories[e.partition] = fd.history
                    fd.history_dirty = False
                origins = list(e.origins)
                size = sum(op_size(op) for op in ops) + sum(len(o) for o in origins)
                fd.log.append(
                    Entry(e.partition, e.epoch, e.seq, ops, size, item, origins=origins),
                    limits,
                    e.seq + 1,
                )
            elif kind == "start":
                s = item.start
                fd = self.followed.get(s.partition)
                if fd is None or fd.master != master or s.epoch != fd.epoch:
                    continue  # not our master by our view (or our view is older): not taken
                if s.partition in self._deferred:
                    continue
                if s.rejoin:
                    fd.accepting = False
                    fd.joined_at = 0
                    self._join(fd)
                    continue
                fd.accepting = True
                fd.need = 0
                theirs = tuple((h.epoch, h.seq) for h in s.history)
                if s.snapshot:
                    fd.snapshot_history = theirs
                else:
                    # Our history up to from_seq is the master's (it checked our join); what
                    # we took from it after that point (a repeated FeedStart) stays.
                    ours = (h for h in fd.history if s.from_seq <= h[1] <= fd.received[1])
                    fd.history = theirs + tuple(ours)
                    fd.history_dirty = True
            else:
                c = item.snapshot
                fd = self.followed.get(c.partition)
                if fd is None or fd.master != master or not fd.accepting:
                    continue
                try:
                    chunk = chunk_ops(c)
                except SnapshotChunkError:
                    if persist is not None:  # what came before the chunk is taken
                        self._ready.persist.append(persist)
                    raise
                if persist is None:
                    persist = self._new_persist()
                if c.first:
                    fd.loading = True
                    fd.need = 0
                    fd.history = ()
                    fd.received = NOWHERE
                    # Its recent log goes with the state it held: cut off mid-snapshot, the
                    # follower joins from nothing and may be sent the log from seq 1, which
                    # appended to the old entries made a log whose entries[seq - start] is
                    # not entry seq (served wrong entries, or failed, once it was promoted).
                    fd.log.reset(NOWHERE)
                    # Anything this batch held for the partition is superseded.
                    persist.clear.append(c.partition)
                    persist.ops = [op for op in persist.ops if not _in_partition(op, c.partition)]
                    persist.positions[c.partition] = NOWHERE
                    persist.histories.pop(c.partition, None)
                elif not fd.loading:
                    continue
                persist.ops.extend(chunk)
                if c.last:
                    fd.loading = False
                    fd.received = (c.epoch, c.seq)
                    fd.history = fd.snapshot_history
                    fd.log.reset(fd.received)
                    persist.positions[c.partition] = fd.received
                    persist.histories[c.partition] = fd.history
        if persist is not None:
            self._ready.persist.append(persist)

    def follower_durable(self, persist_id: int) -> None:
        persist = self._persisting.pop(persist_id)
        for p, (epoch, seq) in persist.positions.items():
            fd = self.followed.get(p)
            if fd is None:
                continue
            fd.durable = (epoch, seq)
            if fd.accepting:
                frame = self._to_master(fd.master)
                frame.acks.append(
                    pb.PartitionPosition(partition=p, epoch=epoch, seq=seq, leader_epoch=fd.epoch)
                )
            elif not fd.joined_at and fd.received == fd.durable and p not in self._deferred:
                self._join(fd)  # a join waiting for these writes
        if self._deferred:
            self._apply_settled([p for p in persist.positions if p in self._deferred])
        self._advance()

    def _new_persist(self) -> Persist:
        self._persist_seq += 1
        persist = Persist(self._persist_seq)
        self._persisting[persist.id] = persist
        return persist

    def _need(self, fd: FollowedPartition) -> None:
        frame = self._to_master(fd.master)
        frame.needs.append(
            pb.PartitionPosition(partition=fd.partition, seq=fd.need, leader_epoch=fd.epoch)
        )

    def _to_master(self, master: str) -> pb.FollowerFrame:
        frame = self._ready.to_masters.get(master)
        if frame is None:
            frame = self._ready.to_masters[master] = pb.FollowerFrame()
        return frame

    # ----- time and output ---------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1
        now, limits = self.now, self.limits
        for m in self.mastered.values():
            for fp in m.followers.values():
                if fp.isr not in (InSync.IN, InSync.ADDING):
                    continue
                grace = limits.down_ticks if fp.joined else limits.lag_ticks
                down = fp.state == FollowerState.DOWN and now - fp.down_since >= grace
                lagging = fp.acked < m.durable and now - fp.caught_up_at > limits.lag_ticks
                if down or lagging:
                    self._ask_removal(m, fp)
        retry = limits.need_retry_ticks
        for fd in self.followed.values():
            if fd.master not in self.links:
                continue
            if fd.need and now - fd.need_at >= retry:
                fd.need_at = now
                self._need(fd)
            elif (
                not fd.accepting
                and fd.partition not in self._deferred
                and (not fd.joined_at or now - fd.joined_at >= retry)
            ):
                self._join(fd)

    def ready(self) -> Ready:
        """What to send, persist, read, release and ask for now; each call hands it over once."""
        ready, self._ready = self._ready, Ready()
        return ready

    # ----- status ------------------------------------------------------------------------

    def follower_status(
        self, p: int, state_bytes: Callable[[], int] = lambda: 0
    ) -> list[pb.FollowerStatus]:
        """Each follower of p mastered here; `state_bytes` estimates the size of p's state,
        asked only when some follower needs or takes a snapshot."""
        m = self.mastered.get(p)
        if m is None:
            return []
        size: list[int] = []

        def state() -> int:
            if not size:
                size.append(state_bytes())
            return size[0]

        return [
            pb.FollowerStatus(
                node_id=fp.node,
                acknowledged=fp.acked,
                lag=m.lag(fp),
                in_sync=fp.isr == InSync.IN,
                state=fp.state.value,
                bytes_left=_bytes_left(m, fp, state),
            )
            for fp in m.followers.values()
        ]

    def in_sync_followers(self, p: int) -> list[FollowerProgress]:
        """The followers a write of p waits for now."""
        m = self.mastered.get(p)
        return [fp for fp in m.followers.values() if fp.counted] if m is not None else []

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
        fd = self.followed.get(p)
        return fd.received if fd is not None else NOWHERE


def _bytes_left(m: MasteredPartition, fp: FollowerProgress, state: Callable[[], int]) -> int:
    """About what the follower still lacks, in bytes of storage ops (Entry.size's measure)."""
    if fp.state == FollowerState.SNAPSHOT:
        return max(state() - fp.snapshot_sent, 0) + (m.log.bytes_after(fp.snapshot_at[1]) or 0)
    lacking = m.log.bytes_after(fp.acked) if fp.state != FollowerState.WAITING else None
    return state() if lacking is None else lacking  # None: it needs a snapshot


def _in_partition(op: Op, p: int) -> bool:
    return op[1].startswith(f"hx:{p}:")
