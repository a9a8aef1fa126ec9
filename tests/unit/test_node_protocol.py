"""The inter-node protocol's versions and features (hexmq/node_protocol.py): what a cluster
speaks given its members, who may join, which links are refused."""

from __future__ import annotations

import pytest

from hexmq.api.common.v1 import common_pb2
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.node_protocol import (
    BASELINE,
    KICK_ACKS,
    LEGACY,
    THIS_RELEASE,
    ZLIB_SNAPSHOTS,
    ClusterProtocol,
    ProtocolError,
    Support,
    admission_refusal,
    cluster_protocol,
    common_support,
    link_refusal,
)

ZLIB = frozenset({ZLIB_SNAPSHOTS})
V2 = Support(1, 2, ZLIB | {KICK_ACKS})  # this release
V3 = Support(2, 3, ZLIB | {"x-later"})  # a release after it (drops version 1)
V4 = Support(4, 4)  # a release far ahead


def test_this_release_speaks_versions_1_and_2_with_zlib_snapshots_and_kick_acks() -> None:
    assert THIS_RELEASE == V2
    assert THIS_RELEASE.describe() == "1..2 +kick-acks +zlib-snapshots"
    assert LEGACY.describe() == "1"


def test_a_cluster_speaks_the_highest_version_every_member_supports() -> None:
    assert cluster_protocol([V2, V2, V2]) == ClusterProtocol(2, V2.features)
    # One member of the previous release holds the cluster at version 1, every feature off.
    assert cluster_protocol([V2, LEGACY, V2]) == BASELINE
    assert cluster_protocol([V2, V3]) == ClusterProtocol(2, ZLIB)  # x-later: V2 lacks it
    assert cluster_protocol([V3, V3]) == ClusterProtocol(3, ZLIB | {"x-later"})
    assert cluster_protocol([]) == BASELINE


def test_a_feature_is_on_only_when_every_member_supports_it() -> None:
    without = Support(1, 2)  # speaks version 2 but does not offer the feature
    assert cluster_protocol([V2, without]) == ClusterProtocol(2)
    assert not cluster_protocol([V2, without]).uses(ZLIB_SNAPSHOTS)
    assert cluster_protocol([V2]).uses(ZLIB_SNAPSHOTS)


def test_members_that_share_no_version_get_no_feature() -> None:
    assert cluster_protocol([LEGACY, V3]) == ClusterProtocol(1)
    assert common_support([LEGACY, V3]) is None


def test_what_two_processes_both_speak() -> None:
    assert V2.meet(LEGACY) == LEGACY
    assert V2.meet(V3) == Support(2, 2, ZLIB)
    assert LEGACY.meet(V3) is None


def test_a_joiner_must_share_a_version_with_every_member() -> None:
    members = {"n1": V2, "n2": V2}
    assert admission_refusal(LEGACY, members) is None  # v0.2.0 may join (and roll back)
    assert admission_refusal(V3, members) is None
    assert admission_refusal(V2, {}) is None
    too_new = admission_refusal(V4, members)
    assert too_new is not None
    assert too_new.startswith("too new: it speaks protocol versions from 4 on")
    assert "n1 (1..2), n2 (1..2)" in too_new
    # A cluster already at 2..3 (every member of the next release) refuses v0.2.0.
    too_old = admission_refusal(LEGACY, {"n1": V3, "n2": V3, "n3": V2})
    assert too_old is not None
    assert too_old.startswith("too old: it speaks protocol versions up to 1")
    assert "n1 (2..3), n2 (2..3) speak(s) nothing older than 2" in too_old
    split = admission_refusal(V2, {"n1": LEGACY, "n2": V4})
    assert split is not None
    assert "the members share no version" in split


def test_a_link_between_processes_that_share_no_version_is_refused() -> None:
    assert link_refusal("edge n4", LEGACY, THIS_RELEASE) is None
    assert link_refusal("edge n4", V4, THIS_RELEASE) == (
        "edge n4 speaks protocol versions 4, this process speaks 1..2: no version in common"
    )


def test_supports_round_trip_and_an_unset_one_is_v0_2_0() -> None:
    assert Support.from_proto(V2.to_proto()) == V2
    assert Support.from_proto(common_pb2.ProtocolSupport()) == LEGACY
    with pytest.raises(ProtocolError, match="without versions"):
        Support.from_proto(common_pb2.ProtocolSupport(features=["zlib-snapshots"]))
    with pytest.raises(ProtocolError, match="need 1 <= lowest <= highest"):
        Support.from_proto(common_pb2.ProtocolSupport(min_version=3, max_version=2))


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: Support(0, 1), "need 1 <= lowest <= highest"),
        (lambda: Support(2, 1), "need 1 <= lowest <= highest"),
        (lambda: Support(1, 1, frozenset({ZLIB_SNAPSHOTS})), "needs protocol version 2"),
        (lambda: Support(1, 2, frozenset({"Bad Name"})), "feature name 'Bad Name'"),
    ],
)
def test_an_impossible_support_is_refused_naming_what_is_wrong(build: object, error: str) -> None:
    with pytest.raises(ProtocolError, match=error):
        build()


def test_a_view_says_what_the_cluster_speaks_and_one_from_v0_2_0_says_version_1() -> None:
    assert ClusterProtocol.of_view(mpb.View()) == BASELINE
    view = mpb.View(protocol_version=2, features=[ZLIB_SNAPSHOTS])
    assert ClusterProtocol.of_view(view) == ClusterProtocol(2, ZLIB)
    assert ClusterProtocol(2, ZLIB).describe() == "version 2, features: zlib-snapshots"
    assert BASELINE.describe() == "version 1, features: none"
