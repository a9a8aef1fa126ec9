"""PartitionState: everything the partition master's commands work on, declared once.

The state is made of parts, each owned by the one module whose functions change it (the others
read it at most); the command functions take the state, the edge link a command came on, the
command and `now` (services/partition/commands.py maps the commands to them). What a command
leaves to be done goes out as data (services/partition/effects.py): on the group commit's
queue (`commit`, once its writes are durable and replicated) or on `outbox` (now, once the
handler has returned); the adapter (services/partition/node.py) carries both out. No clock,
no I/O: the adapter passes the time in and owns the event loop, Redis and the links' frames.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.topics import TopicTrie
from services.partition.commit_queue import CommitQueue
from services.partition.effects import Effect
from services.partition.id_source import IdSource
from services.partition.index_barrier import IndexBarrier
from services.partition.limits import LimitCounts, QueueLimits
from services.partition.links import EdgeLink
from services.partition.qos2_seen import SeenOrigins
from services.partition.redelivery import SharedRedelivery
from services.partition.replication import Replicator
from services.partition.retained import RetainedMessages
from services.partition.sessions import Session
from services.partition.shared import SharedGroups
from services.partition.sysstats import NodeStatsBoard
from services.partition.takeover import Takeovers
from services.partition.tracing import AppendTracer
from services.partition.will_board import WillBoard

# Commands waiting for a partition this node is about to serve: (link, command, until when
# they may wait, on the adapter's monotonic clock in seconds).
Waiting = deque[tuple[EdgeLink, pb.EdgeCommand, float]]


@dataclass(slots=True)
class Roles:
    """Owned by roles.py: which partitions this node masters, and on what word."""

    # The agreed view (who masters what, for fencing answers); None until the first one.
    view: mpb.View | None = None
    # partition -> epoch, for the partitions this node masters and has loaded.
    mastered: dict[int, int] = field(default_factory=dict)
    # partition -> epoch, for partitions promoted here and being loaded from Redis.
    loading: dict[int, int] = field(default_factory=dict)
    # partition -> the commands waiting for it, in arrival order.
    waiting: dict[int, Waiting] = field(default_factory=dict)
    # When each partition being loaded was promoted (unix ns), and who mastered it before.
    promoted_at: dict[int, int] = field(default_factory=dict)
    previous_master: dict[int, str] = field(default_factory=dict)
    # Partitions this node follows but is not in sync of, since when (unix ns).
    catching_up: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class Connections:
    """Owned by session_commands.py: the edges linked here, the sessions of the partitions
    mastered here and the takeovers under way."""

    # edge id -> its link (the newest one: a re-linked edge replaces its old link).
    links: dict[str, EdgeLink] = field(default_factory=dict)
    # client id -> its session.
    sessions: dict[str, Session] = field(default_factory=dict)
    # Takeovers whose answer waits for the kicked connection's edge to close it (G5).
    takeovers: Takeovers = field(default_factory=Takeovers)


@dataclass(slots=True)
class SubscriptionIndex:
    """Owned by subscriptions.py: the subscriptions of the sessions here and the index the
    edges route by."""

    # Every non-shared subscription of every session here: filter -> client id -> spec.
    trie: TopicTrie[str, pb.SubscriptionSpec] = field(default_factory=TopicTrie)
    # How many sessions of a partition use a (non-shared) filter; 0 <-> 1 changes go to
    # every edge.
    refs: dict[tuple[int, str], int] = field(default_factory=dict)
    # Shared subscriptions: the members of each group per partition (not in the trie: the
    # edge names the groups a partition serves for each message).
    shared: SharedGroups = field(default_factory=SharedGroups)
    # Index updates are numbered; a SUBACK that added a filter waits for every edge's ack.
    barrier: IndexBarrier = field(default_factory=IndexBarrier)


@dataclass(slots=True)
class Delivery:
    """Owned by delivery.py: the limits on queues and retained messages, what they turned
    away, and the sessions to write or pump once a batch is sealed or released."""

    limits: QueueLimits = field(default_factory=QueueLimits)
    # What each limit turned away (issue 25): queues, subscriptions, retained messages.
    limit_counts: LimitCounts = field(default_factory=LimitCounts)
    # QoS >= 1 messages not queued for a session (or pushed out of it) by the limit.
    dropped_queue_full: int = 0
    # QoS 1 publishes sent again that found their writes made already.
    resent_publishes: int = 0
    # Publishes handled, and messages sent to connections.
    messages_in: int = 0
    messages_out: int = 0
    # Sessions whose record changed in the batch being gathered (written once per batch).
    dirty: dict[str, Session] = field(default_factory=dict)
    # Sessions to pump when the release under way ends (by identity: a session replaced in
    # the meantime is not pumped).
    released_pumps: dict[int, Session] = field(default_factory=dict)
    # The retained messages of the partitions mastered here, indexed by topic level.
    retained: RetainedMessages = field(default_factory=RetainedMessages)


@dataclass(slots=True)
class InboundQos2:
    """Owned by qos2_inbound.py: inbound QoS 2 as a publisher's partition (the attempts at its
    packet ids) and as a target (the origin ids of the routings stored here)."""

    # (client id, packet id) -> the connection whose attempt is routing now, and its link.
    attempts: dict[tuple[str, int], tuple[str, EdgeLink]] = field(default_factory=dict)
    # (client id, packet id) -> the Qos2Receive commands of other connections waiting for
    # that attempt to report (memory only: an attempt whose link is gone cannot report).
    waiters: dict[tuple[str, int], list[tuple[EdgeLink, pb.EdgeCommand]]] = field(
        default_factory=dict
    )
    # The origin ids of the routings stored here.
    seen: SeenOrigins = field(default_factory=SeenOrigins)


@dataclass(slots=True, eq=False)
class PartitionState:
    """The partition master's state (the module docstring says who owns which part)."""

    node_id: str
    # The group commit's sans-IO queue: handlers put their writes on its batch and their
    # deferred effects on it (services/partition/commit_queue.py).
    commit: CommitQueue
    # New ids (origins, handoffs): services/partition/sources.py.
    ids: IdSource
    # The replication core, read by handlers (is a partition being handed over; did a
    # publish sent again write already); None in tests of the commands alone.
    replicator: Replicator | None
    # Starts a publish's partition.append spans (ended by an effect once durable).
    tracer: AppendTracer
    roles: Roles = field(default_factory=Roles)
    conns: Connections = field(default_factory=Connections)
    index: SubscriptionIndex = field(default_factory=SubscriptionIndex)
    delivery: Delivery = field(default_factory=Delivery)
    qos2: InboundQos2 = field(default_factory=InboundQos2)
    # Owned by wills.py: the wills due and handed out.
    wills: WillBoard = field(init=False)
    # Owned by session_commands.py: messages of shared-group members whose connection or
    # session ended, for other members (services/partition/redelivery.py).
    redelivery: SharedRedelivery = field(init=False)
    # The edges' $SYS reports (node_stats, session_commands.py).
    sys_stats: NodeStatsBoard = field(init=False)
    # Effects to carry out as soon as the handler (or housekeeping step) returns, in order:
    # sends that do not wait for a batch (index updates, deliveries of what is durable).
    outbox: list[Effect] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.wills = WillBoard(self.node_id)
        self.sys_stats = NodeStatsBoard(self.node_id)
