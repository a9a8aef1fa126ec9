"""The partition's outcomes (partition.proto's FilterOutcome and KickReason) as the edge's MQTT
reason codes (services/edge/outcomes.py), and the bytes they travel as: the same as the
uint32 reason codes of v0.2.0, so that edges and partitions of both releases understand each
other during a rolling upgrade."""

from __future__ import annotations

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt.reason_codes import ReasonCode as RC
from services.edge.outcomes import (
    KICK_CODES,
    SUBSCRIBE_CODES,
    UNSUBSCRIBE_CODES,
    kick_code,
    suback_codes,
    unsuback_codes,
)

# Written by v0.2.0's generated code (the release test_upgrade.py starts), whose fields were
# `uint32 Kick.reason_code = 3` and `repeated uint32 Result.reason_codes = 6`:
#   Kick(client_id="c", connection_id="n1.1.7", reason_code=0x8E)
V020_KICK = b"\n\x01c\x12\x06n1.1.7\x18\x8e\x01"
#   Result(request_id=5, reason_codes=[0, 1, 2, 0x97], existed=[False, True, False, False])
V020_SUBSCRIBED = b"\x08\x052\x05\x00\x01\x02\x97\x01B\x04\x00\x01\x00\x00"
#   Result(request_id=6, reason_codes=[0, 0x11])
V020_UNSUBSCRIBED = b"\x08\x062\x02\x00\x11"


def test_every_filter_outcome_has_a_reason_code() -> None:
    assert set(SUBSCRIBE_CODES) | set(UNSUBSCRIBE_CODES) == set(pb.FilterOutcome.values())


def test_every_kick_reason_has_a_reason_code() -> None:
    assert set(KICK_CODES) == set(pb.KickReason.values())


@pytest.mark.parametrize(
    "table", [SUBSCRIBE_CODES, UNSUBSCRIBE_CODES, KICK_CODES], ids=["sub", "unsub", "kick"]
)
def test_each_outcome_is_numbered_as_the_reason_code_it_maps_to(table: dict[int, RC]) -> None:
    # What keeps the wire as it was: a v0.2.0 edge, which sends the number it gets, sends
    # what this edge sends. (A Kick whose reason is unset was never sent.)
    for value, code in table.items():
        if table is KICK_CODES and value == pb.KICK_REASON_UNSPECIFIED:
            continue
        assert value == code


def test_the_bytes_are_those_of_v0_2_0() -> None:
    kick = pb.Kick(client_id="c", connection_id="n1.1.7", reason=pb.KICK_REASON_TAKEN_OVER)
    assert kick.SerializeToString() == V020_KICK
    subscribed = pb.Result(
        request_id=5,
        filter_outcomes=[
            pb.FILTER_OUTCOME_GRANTED_QOS_0,
            pb.FILTER_OUTCOME_GRANTED_QOS_1,
            pb.FILTER_OUTCOME_GRANTED_QOS_2,
            pb.FILTER_OUTCOME_SUBSCRIPTION_LIMIT,
        ],
        existed=[False, True, False, False],
    )
    assert subscribed.SerializeToString() == V020_SUBSCRIBED
    unsubscribed = pb.Result(
        request_id=6,
        filter_outcomes=[pb.FILTER_OUTCOME_REMOVED, pb.FILTER_OUTCOME_NOT_SUBSCRIBED],
    )
    assert unsubscribed.SerializeToString() == V020_UNSUBSCRIBED


def test_what_a_v0_2_0_partition_sends_maps_to_what_it_meant() -> None:
    kick = pb.Kick.FromString(V020_KICK)
    assert kick_code(kick.reason) == RC.SESSION_TAKEN_OVER
    subscribed = pb.Result.FromString(V020_SUBSCRIBED)
    assert suback_codes(subscribed.filter_outcomes) == [0, 1, 2, RC.QUOTA_EXCEEDED]
    unsubscribed = pb.Result.FromString(V020_UNSUBSCRIBED)
    assert unsuback_codes(unsubscribed.filter_outcomes) == (
        RC.SUCCESS,
        RC.NO_SUBSCRIPTION_EXISTED,
    )


def test_an_outcome_this_edge_does_not_know_is_a_refusal() -> None:
    # A value a newer partition may add: never taken for a grant.
    unknown = 0x7F
    assert unknown not in set(SUBSCRIBE_CODES) | set(UNSUBSCRIBE_CODES) | set(KICK_CODES)
    assert suback_codes([unknown]) == [RC.UNSPECIFIED_ERROR]
    assert unsuback_codes([unknown]) == (RC.UNSPECIFIED_ERROR,)
    assert kick_code(unknown) == RC.UNSPECIFIED_ERROR
    # A Subscribe's outcome in an Unsubscribe's answer, and the other way round, too.
    assert unsuback_codes([pb.FILTER_OUTCOME_SUBSCRIPTION_LIMIT]) == (RC.UNSPECIFIED_ERROR,)
    assert suback_codes([pb.FILTER_OUTCOME_NOT_SUBSCRIBED]) == [RC.UNSPECIFIED_ERROR]
