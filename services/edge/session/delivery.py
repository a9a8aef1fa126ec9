"""Deliveries to the client, the acknowledgements that go back to the partition, and the
re-attach of a live connection's session at its partition's (new) master.

Deliver: each queued message of a `Delivery` becomes a PUBLISH (or, once the partition has
recorded the client's PUBREC, a PUBREL) in socket order, with the connection's outgoing topic
aliases applied as the bytes are made; what the client may not receive (ACL), what expired,
what is over its Maximum Packet Size and QoS 0 for a client whose socket is backed up are
dropped (the QoS 1/2 ones acknowledged, so that the partition forgets them).

Re-attach (docs/failover.md, "Re-attach"): when the view moves the session's partition to
another master or epoch, or the link to its master comes back, the connection stays open and
sends AttachSession, carrying what only the edge knows: the message ids in flight to the
client, those whose PUBREL awaits PUBCOMP, and the acknowledgements whose DeliveryAcks are not
confirmed. The connection's acknowledgements wait until it is answered (they would otherwise
reach the master before it knows the connection). TAKEN_OVER or NOT_FOUND closes the
connection; no master within the failover bound leaves it open and the re-attach waiting again
(a client is not disconnected because its session has no master: DESIGN G7).
"""

from __future__ import annotations

import logging

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import NO_PROPERTIES, Publish, PubRel
from services.edge.session.actions import Acknowledge, Attach
from services.edge.session.handle_qos2 import record_qos2
from services.edge.session.outbound import PUBLISHED, PUBLISHED_QOS2, Outbound
from services.edge.session.state import CONNECTED, OK, RC, V5, SessionState, State
from services.edge.tickets import Route, refused_by_hold
from services.edge.translate import packet_id_for, publish_properties

log = logging.getLogger("hexmq.edge.connection")

# QoS 0 deliveries are dropped (and counted) for a subscriber whose socket has this much unsent.
QOS0_DROP_BUFFER = 4 * 1024 * 1024


def outbound(s: SessionState) -> Outbound:
    out = s.outbound
    if out is None:
        out = s.outbound = Outbound(s.receive_maximum or s.config.max_inflight_v311)
    return out


def send_delivery(s: SessionState, delivery: pb.Delivery, wall_ms: int, buffered: int) -> None:
    """Send a Delivery's messages; `buffered`: bytes the socket has not sent yet."""
    if s.state is not CONNECTED:
        return
    out = outbound(s)
    edge = s.edge
    send = s.codec.send
    tracer = edge.tracer
    acl = s.acl
    out_aliases = s.out_aliases
    limit = s.client_max_packet
    v5 = s.version == V5
    written = s.out_bytes
    for qm in delivery.messages:
        if qm.released:
            # QoS 2, PUBREC recorded: PUBREL (again) until PUBCOMP.
            rel_pid = packet_id_for(qm.message_id)
            data = send(PubRel(rel_pid))
            out.released(rel_pid, qm.message_id, len(data))
            s.write(data)
            written += len(data)
            continue
        m = qm.message
        if acl is not None and not acl.may_receive(m.topic):
            # Granted by a broader subscription (or one made under other rules): not for
            # this client. Acknowledged so that the partition forgets it.
            if qm.qos:
                out.acks.append(qm.message_id)
            continue
        if qm.qos == 0 and buffered + written > QOS0_DROP_BUFFER:
            # A subscriber that cannot keep up loses QoS 0 messages, not the broker memory.
            edge.stats.dropped_qos0 += 1
            continue
        if m.expires_at_ms and m.expires_at_ms <= wall_ms and not (qm.dup and qm.qos == 2):
            # (A QoS 2 message sent before is not dropped: its delivery has started and the
            # client holds its packet id until PUBREL.)
            if qm.qos:
                out.acks.append(qm.message_id)
            continue
        pid = packet_id_for(qm.message_id) if qm.qos else None
        props = publish_properties(qm, wall_ms) if v5 else NO_PROPERTIES
        if out_aliases is None:
            data = send(Publish(m.topic, m.payload, qm.qos, qm.retain, qm.dup, pid, props))
        else:  # the alias map changes here, in send order, only for what is sent
            data = out_aliases.encode(
                send, m.topic, m.payload, qm.qos, qm.retain, qm.dup, pid, props, limit
            )
        if limit and len(data) > limit:
            # MQTT-3.1.2-25: too large for this client: discard it and behave as if it
            # had been delivered (the partition forgets it), for this client only.
            edge.stats.dropped_too_large += 1
            if qm.qos:
                out.acks.append(qm.message_id)
            continue
        span = tracer.start_deliver(qm, s.client_id) if tracer.enabled else None
        if pid is not None:
            phase = PUBLISHED_QOS2 if qm.qos == 2 else PUBLISHED
            out.sent(pid, qm.message_id, phase, len(data))
            if span is not None:
                spans = s.deliver_spans
                if spans is None:
                    spans = s.deliver_spans = {}
                spans[pid] = span
        elif span is not None:
            span.end()
        s.write(data)
        written += len(data)
        edge.stats.messages_out[qm.qos] += 1
    flush_acks(s)


def flush_acks(s: SessionState) -> None:
    """Send the acknowledgements gathered by this input as one DeliveryAck."""
    out = s.outbound
    if out is None or not out.acks_waiting or s.partition is None or s.attaching:
        return  # (while a re-attach is on its way they wait: it must come first)
    # Lazy when nothing waits on it: no PUBREC to release (the client waits for PUBREL), no
    # earlier acknowledgement of the session unanswered (so at most one waits for company),
    # and the master, which counts these as in flight until it has them, has at least half
    # the window free: it is not holding back deliveries for them.
    window = out.window
    lazy = (
        not out.recs
        and not out.unconfirmed
        and 2 * (window.count + len(out.acks)) <= window.max_count
        and (not window.max_bytes or 2 * window.bytes <= window.max_bytes)
    )
    token = s.new_token()
    acks, recs = out.take_acks(token)
    command = pb.EdgeCommand(
        delivery_ack=pb.DeliveryAck(
            client_id=s.client_id,
            connection_id=s.connection_id,
            message_ids=acks,
            received_ids=recs,
        ),
    )
    s.emit(Acknowledge(token, s.partition, command, lazy))


def acknowledged(s: SessionState, token: int, result: pb.Result) -> None:
    """The answer to a DeliveryAck (which may never come): its ids need no re-attach now."""
    if result.status == OK and s.outbound is not None:
        s.outbound.confirmed(token)


def reattach(s: SessionState) -> bool:
    """Make this connection its session's live one at the partition's master now. False when
    it is not connected, already attached there, or a re-attach is on its way (then another
    follows it if still needed)."""
    p = s.partition
    if s.state is not State.CONNECTED or p is None:
        return False
    if s.attaching:
        s.attach_again = True
        return False
    current = s.edge.partition_route(p)
    if current is not None and current == s.attached:
        return False
    out = outbound(s)
    if out.acks_waiting:  # not sent: they go with the re-attach
        out.take_acks(s.new_token())
    carried, acked, received = out.carried()
    token = s.ask(lambda result, route: attached(s, carried, result, route))
    command = pb.AttachSession(
        client_id=s.client_id,
        connection_id=s.connection_id,
        receive_maximum=s.receive_maximum,
        maximum_packet_size=s.client_max_packet,
        inflight_ids=out.in_flight_ids(),
        released_ids=out.released_ids(),
        acked_ids=acked,
        received_ids=received,
    )
    s.attaching = token
    s.emit(Attach(token, p, pb.EdgeCommand(attach_session=command)))
    return True


def attached(s: SessionState, carried: list[int], result: pb.Result, route: Route | None) -> None:
    """The AttachSession's answer."""
    s.attaching = 0
    again, s.attach_again = s.attach_again, False
    if s.state is not State.CONNECTED:
        return
    if result.status == OK:
        s.attached = route
        out = outbound(s)
        for token in carried:
            out.confirmed(token)
        flush_acks(s)
        claims = s.claims
        if claims is not None and claims.unrecorded:
            # QoS 2 publishes stored everywhere whose routing could not be recorded: now it
            # can be.
            for pid, pending in claims.take_unrecorded().items():
                record_qos2(
                    s, pid, pending.size, None, pending.reason, pending.span, pending.routed
                )
        p = s.partition
        assert p is not None
        if again or s.edge.partition_route(p) != s.attached:
            reattach(s)
        return
    if refused_by_hold(result):
        # No master within the bound: the connection stays, the re-attach waits again.
        reattach(s)
        return
    log.warning(
        "%s: session could not be re-attached (%s): %s",
        s.client_id,
        pb.StatusCode.Name(result.status),
        result.message,
    )
    reason = RC.UNSPECIFIED_ERROR
    if s.version == V5 and result.status == pb.StatusCode.STATUS_CODE_TAKEN_OVER:
        reason = RC.SESSION_TAKEN_OVER
    # (No CloseSession: the session is not this connection's any more.)
    s.disconnect(reason, None)
