"""The client's answers to deliveries (PUBACK, PUBREC, PUBCOMP), PINGREQ and DISCONNECT."""

from __future__ import annotations

from hexmq.mqtt import Disconnect, PingReq, PingResp, PubAck, PubComp, PubRec
from services.edge.session.actions import Close
from services.edge.session.outbound import PUBLISHED, PUBLISHED_QOS2, RELEASED, Outbound, Phase
from services.edge.session.state import RC, V5, SessionState, State

# An acknowledgement of the wrong kind for what is in flight with its packet id is a Protocol
# Error (5.0: DISCONNECT 0x82, then close, MQTT-4.13.1-1; 3.1.1: close, MQTT-4.8.0-1), as
# mosquitto has it: a QoS 1 delivery is answered with PUBACK (MQTT-4.3.2-4), a QoS 2 one with
# PUBREC (MQTT-4.3.3-8), and PUBCOMP answers our PUBREL (MQTT-4.3.3-11), so PUBREC or PUBCOMP
# for a QoS 1 delivery, PUBACK for a QoS 2 one, and PUBCOMP before its PUBREL are violations.
# An acknowledgement for a packet id with nothing in flight is not one: a late duplicate
# (after a reconnect or a resend), or one for an exchange already finished; it is ignored.
# Nor is a PUBREC repeated after our PUBREL (the PUBREL stands: ignored). Packet ids are
# stable per message (services/edge/translate.py, packet_id_for), so an id is not reused for
# another QoS while an acknowledgement of its last use could still come.
WRONG_ACK: dict[tuple[type, Phase], str] = {
    (PubAck, PUBLISHED_QOS2): "PUBACK for a QoS 2 delivery",
    (PubAck, RELEASED): "PUBACK for a QoS 2 delivery",
    (PubRec, PUBLISHED): "PUBREC for a QoS 1 delivery",
    (PubComp, PUBLISHED): "PUBCOMP for a QoS 1 delivery",
    (PubComp, PUBLISHED_QOS2): "PUBCOMP before PUBREL",
}


def wrong_ack(s: SessionState, out: Outbound, packet: PubAck | PubRec | PubComp) -> None:
    """`packet` answers nothing in flight in the phase it answers: a Protocol Error if its
    id is in flight in another phase (WRONG_ACK), else ignored."""
    pid = packet.packet_id
    phase = out.phase(pid)
    what = WRONG_ACK.get((type(packet), phase)) if phase is not None else None
    if what is not None:
        s.fail(RC.PROTOCOL_ERROR, f"{what} (packet id {pid})")


def handle_puback(s: SessionState, packet: PubAck, now: float, wall_ms: int) -> None:
    out = s.outbound
    if out is None:
        return  # nothing in flight on this connection
    mid = out.answered(packet.packet_id, PUBLISHED)
    if mid is None:
        wrong_ack(s, out, packet)
        return
    out.acks.append(mid)
    if s.deliver_spans:
        client_acked(s, packet.packet_id)


def handle_pubrec(s: SessionState, packet: PubRec, now: float, wall_ms: int) -> None:
    out = s.outbound
    if out is None:
        return  # nothing in flight on this connection
    mid = out.answered(packet.packet_id, PUBLISHED_QOS2)
    if mid is None:
        wrong_ack(s, out, packet)
        return
    if packet.reason_code >= RC.UNSPECIFIED_ERROR:
        # The client refused it: the exchange ends here (no PUBREL), the message is done.
        out.acks.append(mid)
    else:
        out.recs.append(mid)
    # The client has the message: its trace ends here (what follows is PUBREL/PUBCOMP,
    # possibly on a later connection).
    client_acked(s, packet.packet_id)


def handle_pubcomp(s: SessionState, packet: PubComp, now: float, wall_ms: int) -> None:
    out = s.outbound
    if out is None:
        return  # nothing in flight on this connection
    mid = out.answered(packet.packet_id, RELEASED)
    if mid is None:
        wrong_ack(s, out, packet)
        return
    out.acks.append(mid)


def client_acked(s: SessionState, pid: int) -> None:
    spans = s.deliver_spans
    if spans:
        span = spans.pop(pid, None)
        if span is not None:
            s.edge.tracer.client_ack(span, s.client_id)


def handle_pingreq(s: SessionState, packet: PingReq, now: float, wall_ms: int) -> None:
    s.send(PingResp())


def handle_disconnect(s: SessionState, packet: Disconnect, now: float, wall_ms: int) -> None:
    expiry = packet.properties.session_expiry_interval
    v5 = s.version == V5
    if expiry and v5 and s.connect_expiry == 0:
        # 3.14.2.2.2: not a valid DISCONNECT (so the will is sent, as for a lost connection).
        s.fail(
            RC.PROTOCOL_ERROR,
            "DISCONNECT sets a Session Expiry Interval on a session connected with 0",
        )
        return
    with_will = packet.reason_code == RC.DISCONNECT_WITH_WILL_MESSAGE
    if expiry is not None and expiry > s.config.max_session_expiry:
        s.edge.stats.limited["session_expiry"] += 1
        expiry = s.config.max_session_expiry
    s.close_session(graceful=True, expiry=expiry if v5 else None, send_will=with_will)
    s.state = State.CLOSED
    s.emit(Close(packet.reason_code, "the client disconnected"))
