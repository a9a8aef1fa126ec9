"""The client's answers to deliveries (PUBACK, PUBREC, PUBCOMP), PINGREQ and DISCONNECT."""

from __future__ import annotations

from hexmq.mqtt import Disconnect, PingReq, PingResp, PubAck, PubComp, PubRec
from services.edge.session.actions import Close
from services.edge.session.outbound import PUBLISHED, PUBLISHED_QOS2, RELEASED
from services.edge.session.state import RC, V5, SessionState, State


def handle_puback(s: SessionState, packet: PubAck, now: float, wall_ms: int) -> None:
    out = s.outbound
    mid = out.answered(packet.packet_id, PUBLISHED) if out is not None else None
    if out is None or mid is None:
        return  # not in flight on this connection
    out.acks.append(mid)
    if s.deliver_spans:
        client_acked(s, packet.packet_id)


def handle_pubrec(s: SessionState, packet: PubRec, now: float, wall_ms: int) -> None:
    out = s.outbound
    mid = out.answered(packet.packet_id, PUBLISHED_QOS2) if out is not None else None
    if out is None or mid is None:
        return  # not in flight on this connection
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
    mid = out.answered(packet.packet_id, RELEASED) if out is not None else None
    if out is not None and mid is not None:
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
