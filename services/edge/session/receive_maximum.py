"""Our Receive Maximum: a client's publishes being stored, counted in its inbound window
(QoS 1 until PUBACK, QoS 2 until PUBREC, and QoS 2 PUBREC'd until PUBCOMP: MQTT-4.9)."""

from __future__ import annotations

from services.edge.session.actions import Pause
from services.edge.session.state import RC, V5, SessionState
from services.edge.session.window import InflightWindow

INFLIGHT = Pause.INFLIGHT  # (a module constant: per-message path)
# Bytes of payload a connection may have being stored before its socket stops being read
# (with our Receive Maximum, the inbound window's bounds).
INBOUND_BYTES = 16 * 1024 * 1024


def count_in(s: SessionState, size: int) -> bool:
    """One more publish being stored; False after ending the connection for exceeding
    our Receive Maximum."""
    window = s.inbound
    if window is None:
        window = s.inbound = InflightWindow(s.config.receive_maximum, INBOUND_BYTES)
    # (The window's fields directly: this runs once per QoS 1/2 publish.)
    window.count += 1
    window.bytes += size
    claims = s.claims
    received = len(claims.received) if claims is not None else 0
    if window.count + received > window.max_count and s.version == V5:
        # MQTT-3.3.4-9: more unacknowledged QoS 1 and 2 publishes than we announced (a
        # QoS 2 one counts until its PUBCOMP).
        s.fail(
            RC.RECEIVE_MAXIMUM_EXCEEDED,
            f"more than {window.max_count} unacknowledged QoS 1/2 publishes",
        )
        return False
    if window.count >= window.max_count or window.bytes >= window.max_bytes:
        s.pause(INFLIGHT)
    return True


def uncount_in(s: SessionState, size: int) -> None:
    window = s.inbound
    assert window is not None
    window.count -= 1
    window.bytes -= size
    if s.paused & INFLIGHT and window.low:
        s.resume(INFLIGHT)
