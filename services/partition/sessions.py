"""A session as its partition master holds it in memory, and the delivery window that feeds it
to the one live connection."""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb

if TYPE_CHECKING:
    from services.partition.id_source import IdSource
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


def queued_size(qm: pb.QueuedMessage) -> int:
    """What a queued message counts against --max-queued-bytes: its payload and topic (a
    released QoS 2 stub, which holds neither, counts nothing)."""
    msg = qm.message
    return len(msg.payload) + len(msg.topic)


class Claim(enum.Enum):
    """What the session's partition answers to an inbound QoS 2 PUBLISH (Session.qos2_receive)."""

    # First time (or an earlier attempt is known to have ended unreported): route it.
    NEW = 1
    # Received before: answer PUBREC and do not route again.
    DUPLICATE = 2
    # This same connection is routing it right now.
    IN_PROGRESS = 3
    # Another connection's attempt is still routing it: answer once it reports.
    WAIT = 4


class Routed(enum.Enum):
    """How Session.qos2_routed changed the stored state of a packet id."""

    UNCHANGED = 0
    PUT = 1
    DELETED = 2


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
    # The queue's bytes (queued_size), for --max-queued-bytes.
    queued_bytes: int = 0
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
    # Inbound QoS 2: packet id -> its state, from the first PUBLISH until PUBREL.
    q2in: dict[int, pb.Qos2Inbound] = field(default_factory=dict)
    # The connection this session had on the master this node took the partition over from
    # ("" when none): its edge re-attaches it, or another connection takes the session over
    # and this one is kicked (services/partition/roles.py).
    orphan: str = ""
    # Queued shared-subscription messages being given to another member of their group
    # (services/partition/redelivery.py): not sent to this session meanwhile; the delivery
    # order waits at the first one until it is moved (deleted here) or given back.
    handing: set[int] = field(default_factory=set)

    @property
    def client_id(self) -> str:
        return self.record.client_id

    def next_message_id(self) -> int:
        mid = self.record.next_message_id or 1
        self.record.next_message_id = mid + 1
        return mid

    def attach(self, connection: LiveConnection, inflight: Iterable[int] = ()) -> None:
        """A connection holds the session: everything unacknowledged goes out again, except
        what `inflight` names (a re-attached connection's messages its client has already been
        sent and not acknowledged: they are not sent again without a reconnect, MQTT-4.4.0-1)."""
        self.connection = connection
        self.orphan = ""
        self.record.disconnected_at_ms = 0
        self.record.connection_id = connection.connection_id
        sent = {mid for mid in inflight if mid in self.queue}
        self.inflight = sent
        self.ever_sent |= sent
        self.unsent = deque(mid for mid in self.queue if mid not in sent)
        self.transient = 0

    def detach(self, now_ms: int) -> None:
        self.connection = None
        self.record.disconnected_at_ms = now_ms
        self.inflight.clear()
        self.unsent.clear()
        self.transient = 0

    def enqueue(self, qm: pb.QueuedMessage) -> None:
        self.queue[qm.message_id] = qm
        self.queued_bytes += queued_size(qm)
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
            qm = self.queue.pop(mid, None)
            if qm is not None:
                self.queued_bytes -= queued_size(qm)
                removed.append(mid)
                self.inflight.discard(mid)
                self.ever_sent.discard(mid)
        if self.handing:
            self.handing.difference_update(removed)
        return removed

    def release(self, message_ids: list[int]) -> list[pb.QueuedMessage]:
        """The client sent PUBREC for these QoS 2 messages: each becomes a released stub (no
        payload), which is sent as PUBREL from now on, never as PUBLISH, and stays in flight
        until PUBCOMP. Returns the stubs, in order (already released ones too: a repeated PUBREC
        gets PUBREL again); the caller stores them and sends them once that is durable."""
        stubs = []
        for mid in message_ids:
            qm = self.queue.get(mid)
            if qm is None or qm.qos != 2:
                continue
            if not qm.released:
                self.queued_bytes -= queued_size(qm)
                qm = pb.QueuedMessage(message_id=mid, qos=2, released=True)
                self.queue[mid] = qm
            stubs.append(qm)
        return stubs

    # ----- inbound QoS 2 ----------------------------------------------------------------

    def qos2_receive(
        self, packet_id: int, connection_id: str, running: str | None, ids: IdSource
    ) -> Claim:
        """PUBLISH QoS 2 with `packet_id` from `connection_id`. `running` is the connection
        whose attempt at this packet id is still routing (None: no attempt is known to be
        running). On NEW the packet id is claimed for `connection_id`; the caller stores
        `q2in[packet_id]`, whose origin id (from `ids`) the routing carries."""
        state = self.q2in.get(packet_id)
        if state is not None and state.routed:
            return Claim.DUPLICATE
        if running is not None:
            return Claim.IN_PROGRESS if running == connection_id else Claim.WAIT
        if state is None:
            self.q2in[packet_id] = pb.Qos2Inbound(connection_id=connection_id, origin=ids.origin())
            return Claim.NEW
        # Claimed by an attempt that ended without a word (its edge or its link went away
        # mid-routing, or it failed part-way and kept the claim): route it again, with the
        # same origin id, so the targets that stored it do not store it twice. (A claim stored
        # before origin ids existed gets one now.)
        state.connection_id = connection_id
        if not state.origin:
            state.origin = ids.origin()
        return Claim.NEW

    def qos2_routed(
        self, packet_id: int, connection_id: str, ok: bool, *, keep_claim: bool = False
    ) -> Routed:
        """The routing of `packet_id` by `connection_id` ended: stored everywhere (ok) or not.
        Not ok, the claim is dropped (a resend is a new message), or with `keep_claim` left
        for the resend to take over with the same origin id."""
        state = self.q2in.get(packet_id)
        if state is None or state.routed:
            return Routed.UNCHANGED  # released meanwhile (a client's PUBREL before PUBREC)
        if ok:
            state.routed = True
            state.connection_id = ""
            state.origin = b""  # no routing of it can be retried any more
            return Routed.PUT
        if state.connection_id != connection_id or keep_claim:
            return Routed.UNCHANGED  # taken over by another connection, or kept for the resend
        del self.q2in[packet_id]
        return Routed.DELETED

    def qos2_release(self, packet_id: int) -> bool:
        """PUBREL: forget the packet id; False if it was not known."""
        return self.q2in.pop(packet_id, None) is not None

    def pump(self) -> list[pb.QueuedMessage]:
        """The messages the window allows to send now, marked as sent."""
        conn = self.connection
        if conn is None or not conn.ready or not self.unsent:
            return []
        out: list[pb.QueuedMessage] = []
        oldest = next(iter(self.queue), 0)
        window = conn.receive_maximum
        handing = self.handing
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
            if mid - oldest >= PACKET_ID_SPAN or (handing and mid in handing):
                break
            self.unsent.popleft()
            self.inflight.add(mid)
            if qm.released:
                out.append(qm)  # PUBREL again
            elif mid in self.ever_sent:
                resend = pb.QueuedMessage()
                resend.CopyFrom(qm)
                resend.dup = True
                out.append(resend)
            else:
                self.ever_sent.add(mid)
                out.append(qm)
        return out
