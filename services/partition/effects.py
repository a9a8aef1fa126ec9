"""What a partition command leaves to be done once the batch it wrote is durable here and on
every in-sync follower, as data.

A handler changes memory at once and puts its writes on the group commit's batch (storage ops,
services/partition/write_batch.py); what the edges may hear only after that (results, kicks,
deliveries) and what the node does then goes on the batch too, as one of the effects below
(`CommitQueue.after`, commit_queue.py). When the batch is released, `PartitionNode.carry_out`
(given to GroupCommit) carries each out, in order. A command whose partition was aborted before
the release is answered MOVED instead of carrying out its effects (commit_queue.Scope). Tests
read them with `CommitQueue.pending()`.

What goes out at once (index updates every edge routes by before a SUBACK, deliveries of
messages already durable, a span) is put on the state's `outbox` (services/partition/state.py)
as the same data; the adapter carries it out as soon as the handler returns. Effects are data
only: no closures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Span
    from opentelemetry.util.types import AttributeValue

    from hexmq.api.partition.v1 import partition_pb2 as pb
    from services.partition.links import EdgeLink
    from services.partition.sessions import LiveConnection, Session
    from services.partition.takeover import HeldAnswer


@dataclass(frozen=True, slots=True)
class Send:
    """An event for an edge: a result with fields, a kick, an answer to a query."""

    link: EdgeLink
    event: pb.PartitionEvent


@dataclass(frozen=True, slots=True)
class AfterIndexed:
    """Send `event` (a SUBACK's result) once every edge linked now applied index update `seq`:
    a filter new to the edges' index routes there before its subscriber hears of it."""

    link: EdgeLink
    event: pb.PartitionEvent
    seq: int


@dataclass(frozen=True, slots=True)
class ConnectionReady:
    """The edge has (or, in the same frame, will have) the answer that accepts `conn`: its
    session's messages may go to it."""

    session: Session
    conn: LiveConnection


@dataclass(frozen=True, slots=True)
class AnswerTakeover:
    """The OpenSession that took a session over is durable: answer it (and make its
    connection ready) once the connections it kicked are closed (services/partition/takeover.py)."""

    answer: HeldAnswer


@dataclass(frozen=True, slots=True)
class MessageDurable:
    """A queued message is durable: it may be delivered (the session is pumped once per
    release, whatever number of its messages it brought)."""

    session: Session
    message_id: int


@dataclass(frozen=True, slots=True)
class Pump:
    """Pump the session once this release is done (something it waited for is durable)."""

    session: Session


@dataclass(frozen=True, slots=True)
class SendReleased:
    """PUBREL for these QoS 2 messages (released stubs, now durable), if `conn` still holds
    the session: a PUBREL never goes out before its stub is stored."""

    session: Session
    conn: LiveConnection
    stubs: tuple[pb.QueuedMessage, ...]


@dataclass(frozen=True, slots=True)
class HandOutWills:
    """Give the wills due now to edges to publish."""


@dataclass(frozen=True, slots=True)
class HandoffReady:
    """A shared-subscription handoff is durable: it may be handed out."""

    handoff_id: int


@dataclass(frozen=True, slots=True)
class HandOutShared:
    """Hand out the shared-subscription handoffs that are ready."""


@dataclass(frozen=True, slots=True)
class SendToAll:
    """An event for every edge linked when it was decided (an index update), at once."""

    links: tuple[EdgeLink, ...]
    event: pb.PartitionEvent


@dataclass(frozen=True, slots=True)
class RecordSpan:
    """A finished span to record (services/partition/roles.py: partition.catchup and
    partition.failover), from `start_ns` to `end_ns` (unix ns)."""

    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]


@dataclass(frozen=True, slots=True)
class EndAppendSpans:
    """A traced publish's partition.append spans (partition, epoch, span), ended once its batch
    is durable and replicated, with the subscribers each reached (`fanout`, partition -> count,
    filled by the handler) and a partition.ack child for QoS >= 1
    (services/partition/tracing.py)."""

    spans: tuple[tuple[int, int, Span], ...]
    qos: int
    fanout: dict[int, int]


Effect = (
    Send
    | AfterIndexed
    | ConnectionReady
    | AnswerTakeover
    | MessageDurable
    | Pump
    | SendReleased
    | HandOutWills
    | HandoffReady
    | HandOutShared
    | SendToAll
    | RecordSpan
    | EndAppendSpans
)
