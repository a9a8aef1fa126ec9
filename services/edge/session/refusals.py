"""A client's publish that was not stored: never acknowledged as if it were."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb
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
    code: int = RC.UNSPECIFIED_ERROR,
) -> None:
    """Never acknowledge what was not stored: 5.0 gets a failing PUBACK (PUBREC for QoS 2,
    which ends that exchange), 3.1.1 (which has none) or `close` loses the connection and
    the client will resend the unacknowledged message. `quiet`: a refusal past the failover
    bound, logged once per partition and burst (services/edge/hold.py), not here."""
    s.edge.stats.refused_publishes += 1
    if span is not None:
        s.edge.tracer.finish(span, reason_code=code, error=why)
    if s.version == V5 and not close:
        if not quiet:
            log.warning("%s: PUBLISH %d refused: %s", s.client_id, pid, why)
        ack = PubRec if qos == 2 else PubAck
        props = s.reason(lambda p: ack(pid, code, p), why, problem_information=True)
        s.send(ack(pid, code, props))
    else:
        s.close(f"PUBLISH {pid} cannot be stored: {why}", quiet=quiet)


def watch_retained(
    answered: Callable[..., None], refusals: list[str], retained: object
) -> Callable[..., None]:
    """`answered`, noting in `refusals` a target's word that the message was not retained
    (over the cluster's retained cap) though its subscribers have it."""
    if retained is None:
        return answered

    def answer(result: pb.Result, *rest: object) -> None:
        if result.retained_refused:
            refusals.append(result.message)
        answered(result, *rest)

    return answer


def refuse_retain(s: SessionState, pid: int, why: str, span: Span | None, *, qos: int) -> None:
    """A 5.0 publish its subscribers got but that was not retained (--max-retained-messages,
    --max-retained-bytes): PUBACK (PUBREC) 0x97 Quota exceeded with the reason; the
    connection goes on."""
    s.edge.stats.rejected["publish", RC.QUOTA_EXCEEDED] += 1
    if span is not None:
        s.edge.tracer.finish(span, reason_code=RC.QUOTA_EXCEEDED, error=why)
    ack = PubRec if qos == 2 else PubAck
    props = s.reason(lambda p: ack(pid, RC.QUOTA_EXCEEDED, p), why, problem_information=True)
    s.send(ack(pid, RC.QUOTA_EXCEEDED, props))
