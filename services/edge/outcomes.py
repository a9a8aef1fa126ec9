"""The partition's outcomes in MQTT's words. The partition speaks no MQTT: it reports what
became of each filter of a SUBSCRIBE or UNSUBSCRIBE (`pb.FilterOutcome`) and why it ends a
connection (`pb.KickReason`); these tables are the one place where those become the reason
codes the edge sends. Every value of both enums has an entry (tests/unit/test_edge_outcomes.py).

A value missing here (one a newer partition added) becomes 0x80 Unspecified error, which is a
refusal in every packet it can reach, never a grant the partition did not make.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt.reason_codes import ReasonCode as RC

SUBSCRIBE_CODES: Mapping[int, RC] = {
    pb.FILTER_OUTCOME_GRANTED_QOS_0: RC.GRANTED_QOS_0,
    pb.FILTER_OUTCOME_GRANTED_QOS_1: RC.GRANTED_QOS_1,
    pb.FILTER_OUTCOME_GRANTED_QOS_2: RC.GRANTED_QOS_2,
    pb.FILTER_OUTCOME_SUBSCRIPTION_LIMIT: RC.QUOTA_EXCEEDED,
}
UNSUBSCRIBE_CODES: Mapping[int, RC] = {
    pb.FILTER_OUTCOME_REMOVED: RC.SUCCESS,
    pb.FILTER_OUTCOME_NOT_SUBSCRIBED: RC.NO_SUBSCRIPTION_EXISTED,
}
KICK_CODES: Mapping[int, RC] = {
    pb.KICK_REASON_TAKEN_OVER: RC.SESSION_TAKEN_OVER,
    # Sent by no partition: a Kick whose reason was never set.
    pb.KICK_REASON_UNSPECIFIED: RC.UNSPECIFIED_ERROR,
}


def suback_codes(outcomes: Iterable[int]) -> list[int]:
    """A Subscribe's filter outcomes as SUBACK reason codes, in order."""
    return [SUBSCRIBE_CODES.get(outcome, RC.UNSPECIFIED_ERROR) for outcome in outcomes]


def unsuback_codes(outcomes: Iterable[int]) -> tuple[int, ...]:
    """An Unsubscribe's filter outcomes as UNSUBACK reason codes, in order."""
    return tuple(UNSUBSCRIBE_CODES.get(outcome, RC.UNSPECIFIED_ERROR) for outcome in outcomes)


def kick_code(reason: int) -> RC:
    """The DISCONNECT reason code for a Kick."""
    return KICK_CODES.get(reason, RC.UNSPECIFIED_ERROR)
