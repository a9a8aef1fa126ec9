"""What a node's replication holds: the master's view of each follower, the partitions it
masters and follows, the instructions it hands its adapters (`Ready`), the view's assignments, and
`ReplicaState`, the state both sides of the Replicator share (services/partition/replication.py)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.membership.view import master_of
from hexmq.node_protocol import BASELINE, ClusterProtocol
from services.partition.replication_log import (
    NOWHERE,
    History,
    Op,
    Position,
    RecentLog,
    ReplicationLimits,
)


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
        return master_of(self)


@dataclass(frozen=True, slots=True)
class Stored:
    """A partition as this node's store holds it: its position and epoch history."""

    position: Position = NOWHERE
    history: History = ()


class ReplicaState:
    """The state of a node's replication, shared by its master side
    (services/partition/replication_master.py) and its follower side
    (services/partition/replication_follower.py); the Replicator adds the roles."""

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
