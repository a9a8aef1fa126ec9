"""A session as its partition master holds it in memory, and the delivery window that feeds it
to the one live connection."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb

if TYPE_CHECKING:
    from services.partition.links import EdgeLink

# MQTT packet identifiers are 16 bit and nonzero. The edge derives a delivery's packet id from
# its message id ((id - 1) % 65535 + 1), which stays stable across reconnects and restarts
# (MQTT-4.4.0-1: resend with the original packet identifier) as long as no two messages in
# flight are 65535 ids apart; `pump` holds that line.
PACKET_ID_SPAN = 65535
NEVER_EXPIRES = 0xFFFFFFFF
# QoS 0 messages waiting behind unacknowledged QoS 1 ones for one connection (memory only);
# past this, new QoS 0 messages for that connection are dropped (QoS 0 allows it) and counted.
MAX_TRANSIENT = 10_000


@dataclass(slots=True)
class LiveConnection:
    link: EdgeLink
    connection_id: str
    receive_maximum: int
    # False until the edge has been told the connection holds the session (its CONNACK or
    # re-attach result went out): deliveries must not overtake that answer, or the edge would
    # meet them for a connection it has not accepted yet.
    ready: bool = False


@dataclass(slots=True)
class Session:
    partition: int
    record: pb.SessionRecord
    subscriptions: dict[str, pb.SubscriptionSpec] = field(default_factory=dict)
    # The shared filters ("$share/{ShareName}/{filter}") among `subscriptions`.
    shared: set[str] = field(default_factory=set)
    # Every queued (QoS >= 1) message not yet acknowledged, in message id order.
    queue: OrderedDict[int, pb.QueuedMessage] = field(default_factory=OrderedDict)
    connection: LiveConnection | None = None
    # What the current connection gets next, in order: message ids of queued messages (may hold
    # acked ids, skipped when met) and, inline, QoS 0 messages that are never stored. One
    # sequence keeps a subscriber's deliveries in publish order across QoS levels.
    unsent: deque[int | pb.QueuedMessage] = field(default_factory=deque)
    transient: int = 0
    dropped_qos0: int = 0
    # Sent on the current connection and not yet acknowledged.
    inflight: set[int] = field(default_factory=set)
    # Sent on some connection (so a resend carries DUP).
    ever_sent: set[int] = field(default_factory=set)
    # The highest message id known to be in Redis: nothing above it may be sent yet.
    durable_mid: int = 0

    @property
    def client_id(self) -> str:
        return self.record.client_id

    def next_message_id(self) -> int:
        mid = self.record.next_message_id or 1
        self.record.next_message_id = mid + 1
        return mid

    def attach(self, connection: LiveConnection) -> None:
        """A new connection holds the session: everything unacknowledged goes out again."""
        self.connection = connection
        self.record.disconnected_at_ms = 0
        self.inflight.clear()
        self.unsent = deque(self.queue)
        self.transient = 0

    def detach(self, now_ms: int) -> None:
        self.connection = None
        self.record.disconnected_at_ms = now_ms
        self.inflight.clear()
        self.unsent.clear()
        self.transient = 0

    def enqueue(self, qm: pb.QueuedMessage) -> None:
        self.queue[qm.message_id] = qm
        if self.connection is not None:
            self.unsent.append(qm.message_id)

    def enqueue_transient(self, qm: pb.QueuedMessage) -> None:
        """A QoS 0 message for the live connection: sent in turn, never stored."""
        if self.connection is None:
            return
        if self.transient >= MAX_TRANSIENT:
            self.dropped_qos0 += 1
            return
        self.transient += 1
        self.unsent.append(qm)

    def acknowledge(self, message_ids: list[int]) -> list[int]:
        """Drop acknowledged messages; returns the ids that were queued."""
        removed = []
        for mid in message_ids:
            if self.queue.pop(mid, None) is not None:
                removed.append(mid)
                self.inflight.discard(mid)
                self.ever_sent.discard(mid)
        return removed

    def pump(self) -> list[pb.QueuedMessage]:
        """The messages the window allows to send now, marked as sent."""
        conn = self.connection
        if conn is None or not conn.ready or not self.unsent:
            return []
        out: list[pb.QueuedMessage] = []
        oldest = next(iter(self.queue), 0)
        window = conn.receive_maximum
        while self.unsent:
            item = self.unsent[0]
            if not isinstance(item, int):
                self.unsent.popleft()
                self.transient -= 1
                out.append(item)
                continue
            if len(self.inflight) >= window:
                break
            mid = item
            if mid > self.durable_mid:
                break
            qm = self.queue.get(mid)
            if qm is None:
                self.unsent.popleft()
                continue
            if mid - oldest >= PACKET_ID_SPAN:
                break
            self.unsent.popleft()
            self.inflight.add(mid)
            if mid in self.ever_sent:
                resend = pb.QueuedMessage()
                resend.CopyFrom(qm)
                resend.dup = True
                out.append(resend)
            else:
                self.ever_sent.add(mid)
                out.append(qm)
        return out
