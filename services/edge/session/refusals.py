"""A client's publish that was not stored: never acknowledged as if it were."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from hexmq.mqtt import PubAck, PubRec
from services.edge.session.state import RC, V5, SessionState

if TYPE_CHECKING:
    from opentelemetry.trace import Span

# The session's own logger: these lines are the connection's, as they were when this lived
# on SessionState.
log = logging.getLogger("hexmq.edge.connection")


def refuse_publish(
    s: SessionState,
    pid: int,
    why: str,
    span: Span | None = None,
    *,
    qos: int = 1,
    close: bool = False,
    quiet: bool = False,
) -> None:
    """Never acknowledge what was not stored: 5.0 gets a failing PUBACK (PUBREC for QoS 2,
    which ends that exchange), 3.1.1 (which has none) or `close` loses the connection and
    the client will resend the unacknowledged message. `quiet`: a refusal past the failover
    bound, logged once per partition and burst (services/edge/hold.py), not here."""
    s.edge.stats.refused_publishes += 1
    if span is not None:
        s.edge.tracer.finish(span, reason_code=RC.UNSPECIFIED_ERROR, error=why)
    if s.version == V5 and not close:
        if not quiet:
            log.warning("%s: PUBLISH %d refused: %s", s.client_id, pid, why)
        ack = PubRec if qos == 2 else PubAck
        props = s.reason(lambda p: ack(pid, RC.UNSPECIFIED_ERROR, p), why, problem_information=True)
        s.send(ack(pid, RC.UNSPECIFIED_ERROR, props))
    else:
        s.close(f"PUBLISH {pid} cannot be stored: {why}", quiet=quiet)
