"""The agreement planner (services/membership/plan.py): one test per rule of docs/failover.md.

Views are built by the planner itself (the first view) or by hand where a test needs a table
the rules would take many steps to reach; the goal order of a partition comes from
services/membership/goal.py, so a test picks its nodes by where the ring puts them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.hashring import assign
from hexmq.node_protocol import (
    KICK_ACKS,
    LEGACY,
    THIS_RELEASE,
    ZLIB_SNAPSHOTS,
    ClusterProtocol,
    Support,
)
from services.membership.goal import goal_orders
from services.membership.plan import (
    REFUSED,
    SILENT,
    HandoverRequest,
    InSyncRequest,
    Observed,
    PlanConfig,
    Registration,
    ViewError,
    check_view,
    failover_records,
    goal,
    plan,
    refused_joiners,
    request_outcome,
)
from tests.support.plan_inputs import NOW, SETTLE, reg


def config(node: str = "n1", *, partitions: int = 8, rf: int = 3, expect: int = 3) -> PlanConfig:
    return PlanConfig(node, partitions, rf, expect, SETTLE)


def observed(
    nodes: Sequence[str] | Mapping[str, int],
    suspicions: Mapping[str, Mapping[str, str]] | None = None,
    requests: Sequence[InSyncRequest | HandoverRequest] = (),
) -> Observed:
    """Registrations of `nodes` (incarnation 1, or as mapped), seen long ago."""
    incs = nodes if isinstance(nodes, Mapping) else dict.fromkeys(nodes, 1)
    return Observed({n: reg(n, i) for n, i in incs.items()}, suspicions or {}, requests)


def first_view(nodes: Sequence[str], partitions: int = 8, rf: int = 3) -> pb.View:
    view = plan(None, observed(nodes), config(partitions=partitions, rf=rf), NOW)
    assert view is not None
    return view


def make_view(
    rows: Sequence[tuple[str, str]],
    members: Sequence[str],
    *,
    targets: Sequence[str] | None = None,
    epoch: int = 5,
    rf: int = 3,
    epochs: Mapping[int, int] | None = None,
    handover: Mapping[int, str] | None = None,
    protocol: ClusterProtocol | None = None,
) -> pb.View:
    """A view with one row per partition: ("replicas, master first", "in-sync nodes"), whose
    members speak `protocol` together (by default: every member of this release)."""
    if protocol is None:
        protocol = ClusterProtocol(THIS_RELEASE.max_version, THIS_RELEASE.features)
    return pb.View(
        epoch=epoch,
        partition_count=len(rows),
        replication_factor=rf,
        members=[reg(n).member() for n in sorted(members)],
        target_members=sorted(targets or members),
        partitions=[
            pb.PartitionAssignment(
                partition=p,
                epoch=(epochs or {}).get(p, 1),
                replicas=replicas.split(),
                in_sync=in_sync.split(),
                handover_to=(handover or {}).get(p, ""),
            )
            for p, (replicas, in_sync) in enumerate(rows)
        ],
        protocol_version=protocol.version,
        features=sorted(protocol.features),
    )


def next_view(view: pb.View, obs: Observed, node: str = "n1", now: int = NOW) -> pb.View:
    new = plan(view, obs, config(node), now)
    assert new is not None, "expected a new view"
    assert new.epoch == view.epoch + 1
    check_view(new)
    return new


def row(view: pb.View, p: int) -> tuple[int, list[str], list[str], str]:
    a = view.partitions[p]
    return a.epoch, list(a.replicas), list(a.in_sync), a.handover_to


def order(view: pb.View, p: int) -> tuple[str, ...]:
    members = [m.node_id for m in view.members]
    targets = view.target_members
    return goal_orders(targets, members, view.partition_count, view.replication_factor)[p]


def members(view: pb.View) -> list[str]:
    return [m.node_id for m in view.members]


N3 = ["n1", "n2", "n3"]
N5 = ["n1", "n2", "n3", "n4", "n5"]


# ----- rule 1: the first view ---------------------------------------------------------------


def test_the_first_view_waits_for_expect_serving_nodes() -> None:
    assert plan(None, observed({"n1": 1, "n2": 1, "n3": 0}), config(), NOW) is None
    assert plan(None, observed(["n1", "n2"]), config(), NOW) is None
    view = plan(None, observed({"n1": 7, "n2": 1, "n3": 0, "n4": 2}), config(), NOW)
    assert view is not None
    assert [(m.node_id, m.incarnation) for m in view.members] == [("n1", 7), ("n2", 1), ("n4", 2)]


def test_the_first_view_places_every_partition_by_assign() -> None:
    view = first_view(["n3", "n1", "n2", "n4"], partitions=16, rf=3)
    assert view.epoch == 1
    assert (view.partition_count, view.replication_factor) == (16, 3)
    assert list(view.target_members) == ["n1", "n2", "n3", "n4"]
    assert view.members[0] == reg("n1").member()
    placed = assign(["n1", "n2", "n3", "n4"], 16, 3)
    for p, a in enumerate(view.partitions):
        assert (a.partition, a.epoch, a.handover_to) == (p, 1, "")
        assert tuple(a.replicas) == placed[p]
        assert list(a.in_sync) == list(a.replicas)


# ----- rule 2: who is lost -------------------------------------------------------------------


def test_a_node_without_registration_is_lost() -> None:
    view = first_view(N3)
    assert members(next_view(view, observed(["n1", "n3"]))) == ["n1", "n3"]


def test_a_restarted_node_is_lost() -> None:
    view = first_view(N3)
    assert members(next_view(view, observed({"n1": 1, "n2": 2, "n3": 1}))) == ["n1", "n3"]


def test_a_node_whose_partition_service_is_not_serving_is_lost() -> None:
    view = first_view(N3)
    assert members(next_view(view, observed({"n1": 1, "n2": 0, "n3": 1}))) == ["n1", "n3"]


def test_one_refused_report_from_a_live_member_removes_a_node() -> None:
    view = first_view(N5)
    new = next_view(view, observed(N5, {"n4": {"n2": REFUSED}}))
    assert members(new) == ["n1", "n3", "n4", "n5"]


def test_silence_needs_reports_from_more_than_half_of_the_members() -> None:
    view = first_view(N5)  # five members: three reporters needed
    two = {"n1": {"n5": SILENT}, "n2": {"n5": SILENT}}
    assert plan(view, observed(N5, two), config(), NOW) is None
    three = {**two, "n3": {"n5": SILENT}}
    assert members(next_view(view, observed(N5, three))) == ["n1", "n2", "n3", "n4"]


def test_a_minority_cannot_remove_a_majority() -> None:
    view = first_view(N5)
    minority = {
        "n4": {"n1": SILENT, "n2": SILENT, "n3": SILENT},
        "n5": {"n1": SILENT, "n2": SILENT, "n3": SILENT},
    }
    assert plan(view, observed(N5, minority), config(), NOW) is None
    alone = {"n5": dict.fromkeys(N5[:4], SILENT)}
    assert plan(view, observed(N5, alone), config("n5"), NOW) is None
    # The majority removes the minority.
    majority = {r: {"n4": SILENT, "n5": SILENT} for r in ["n1", "n2", "n3"]}
    assert members(next_view(view, observed(N5, {**minority, **majority}))) == N5[:3]


def test_members_that_suspect_each_other_are_not_all_removed_by_silence() -> None:
    # Every agent stalls (a loaded host): n3 reports n1 and n2, n1 and n2 report each other.
    # Each has two reporters of three members; removing both left n3 alone with every
    # partition (make test-deploy at load 60). One goes, the other waits: in the next view
    # n1's report no longer counts, and n2 stays.
    view = first_view(N3)
    mutual = {"n1": {"n2": SILENT}, "n2": {"n1": SILENT}, "n3": {"n1": SILENT, "n2": SILENT}}
    new = next_view(view, observed(N3, mutual))
    assert members(new) == ["n2", "n3"]
    assert plan(new, observed(N3, mutual), config("n3"), NOW) is None
    # Five members: two go by silence at once (three stay), not three.
    five = {r: {s: SILENT for s in N5[:3] if s != r} for r in N5}
    assert members(next_view(first_view(N5), observed(N5, five))) == N5[2:]
    # Hard evidence is not held back: refused, gone from the registry.
    refused = {**mutual, "n3": {"n1": REFUSED, "n2": REFUSED}}
    assert members(next_view(view, observed(N3, refused))) == ["n3"]


def test_reports_count_only_from_registered_view_members() -> None:
    view = first_view(N3)
    outsider = {"n9": {"n2": REFUSED}}  # registered, not a member (it joins; n2 stays)
    assert members(next_view(view, observed([*N3, "n9"], outsider))) == [*N3, "n9"]
    # n3's session lapsed while its report of n2 stayed behind: n3 is lost, n2 is not.
    stale = next_view(view, observed(["n1", "n2"], {"n3": {"n2": REFUSED}}))
    assert members(stale) == ["n1", "n2"]


def test_a_node_never_counts_as_reporting_itself() -> None:
    view = first_view(N3)
    assert plan(view, observed(N3, {"n2": {"n2": REFUSED}}), config(), NOW) is None
    half = {"n2": {"n2": SILENT}, "n1": {"n2": SILENT}}  # one real reporter of three members
    assert plan(view, observed(N3, half), config(), NOW) is None


# ----- rule 3: losing a node -----------------------------------------------------------------


def test_losing_a_node_changes_only_the_partitions_it_held() -> None:
    view = first_view(N5, partitions=32, rf=2)
    new = next_view(view, observed(["n1", "n2", "n4", "n5"]))
    held = [p for p in range(32) if "n3" in view.partitions[p].replicas]
    assert held
    assert len(held) < 32
    for p in range(32):
        a, b = view.partitions[p], new.partitions[p]
        if p not in held:
            assert a == b
            continue
        assert "n3" not in b.in_sync
        survivors = [r for r in a.replicas if r != "n3"]
        assert list(b.replicas[: len(survivors)]) == survivors  # kept, in order
        assert list(b.in_sync) == survivors
        assert b.epoch == (new.epoch if a.replicas[0] == "n3" else 1)


def test_only_an_in_sync_replica_is_promoted() -> None:
    first, second, third = order(first_view(N3, partitions=1), 0)
    # The next node in goal order (second) is a follower still catching up: third takes over.
    view = make_view([(f"{first} {second} {third}", f"{first} {third}")], N3)
    new = next_view(view, observed([second, third]))
    assert row(new, 0)[:3] == (6, [third, second], [third])


def test_the_promoted_master_is_the_first_in_sync_node_in_goal_order() -> None:
    first, second, third = order(first_view(N3, partitions=1), 0)
    # Replicas listed against the goal order: the order of the list does not decide.
    view = make_view([(f"{first} {third} {second}", f"{first} {third} {second}")], N3)
    new = next_view(view, observed([second, third]))
    assert row(new, 0)[:3] == (6, [second, third], [second, third])


def test_the_last_in_sync_replica_keeps_an_offline_partition() -> None:
    view = make_view([("n1 n2 n3", "n1"), ("n2 n1 n3", "n2 n1")], N3)
    new = next_view(view, observed(["n2", "n3"]))
    assert row(new, 0) == (1, ["n1", "n2", "n3"], ["n1"], "")  # offline, waiting for n1
    assert row(new, 1)[:3] == (1, ["n2", "n3"], ["n2"])
    records = failover_records(view, new, 42)
    assert [(r.partition, r.kind, r.from_node, r.to_node) for r in records] == [
        (0, "offline", "n1", "")
    ]
    # Nothing moves while it is offline: no follower is appended, no handover asked.
    assert plan(new, observed(["n2", "n3"]), config("n2"), NOW) is None


def test_losing_every_in_sync_replica_at_once_keeps_them_all() -> None:
    view = make_view([("n1 n2 n3", "n1 n2")], ["n1", "n2", "n3", "n4"])
    new = next_view(view, observed(["n3", "n4"]))
    assert row(new, 0) == (1, ["n1", "n2", "n3"], ["n1", "n2"], "")
    # Followers of an offline partition can still be lost; its in-sync replicas stay.
    newer = next_view(new, observed(["n4"]), node="n4")
    assert row(newer, 0) == (1, ["n1", "n2"], ["n1", "n2"], "")


def test_only_a_members_agent_removes_members() -> None:
    """A node out of the view (joining, or removed and back) may see a cluster it has not
    caught up with: its agent removes nobody. (A restarted agent that planned before reading
    the registrations once took every member for unregistered and removed them all.)"""
    view = make_view([("n1 n2 n3", "n1 n2 n3")], ["n1", "n2", "n3"])
    lost = next_view(view, observed(["n1", "n3"]), node="n1")
    assert members(lost) == ["n1", "n3"]
    partial = observed(["n2"])  # n2's agent, back, before it has read n1's and n3's keys
    assert plan(lost, partial, config("n2"), NOW) is None
    assert plan(view, observed(["n2"]), config("n4"), NOW) is None


# ----- rule 4: joining -----------------------------------------------------------------------


def test_a_node_joins_once_its_registration_has_settled() -> None:
    view = first_view(N3)
    lost = next_view(view, observed(["n1", "n2"]))
    back = Observed({n: reg(n, since=NOW - 400) for n in N3}, {})
    assert plan(lost, back, config(), NOW) is None  # registered 400 ms ago
    joined = next_view(lost, back, now=NOW - 400 + SETTLE)
    assert members(joined) == N3
    assert joined.members[2].incarnation == 1


def test_a_suspected_node_does_not_join() -> None:
    view = first_view(N3)
    lost = next_view(view, observed(["n1", "n2"]))
    assert plan(lost, observed(N3, {"n2": {"n3": SILENT}}), config(), NOW) is None
    # A report by a node outside the view does not keep anyone out.
    assert members(next_view(lost, observed([*N3, "n9"], {"n9": {"n3": SILENT}}))) == [
        *N3,
        "n9",
    ]


def test_a_new_node_becomes_a_target_member_and_gets_goal_replicas() -> None:
    view = first_view(N3, partitions=16)
    joined = next_view(view, observed(["n1", "n2", "n3", "n4"]))
    assert list(joined.target_members) == ["n1", "n2", "n3", "n4"]
    placed = assign(["n1", "n2", "n3", "n4"], 16, 3)
    for p, a in enumerate(joined.partitions):
        assert goal(joined, p) == list(placed[p])
        assert list(a.replicas[:3]) == list(view.partitions[p].replicas)  # nothing moved yet
        assert set(a.replicas) == set(view.partitions[p].replicas) | set(placed[p])
        assert list(a.in_sync) == list(view.partitions[p].in_sync)
    assert any("n4" in a.replicas for a in joined.partitions)


def test_removals_come_before_joins() -> None:
    view = first_view(N3)
    lost = next_view(view, observed(["n1", "n2"]))
    # n2 is gone and n3 is back: first a view without n2, then one with n3.
    without = next_view(lost, observed(["n1", "n3"]))
    assert members(without) == ["n1"]
    assert members(next_view(without, observed(["n1", "n3"]))) == ["n1", "n3"]


def test_a_restarted_master_gets_a_new_epoch() -> None:
    view = first_view(N3, partitions=1)
    master = view.partitions[0].replicas[0]
    others = [n for n in N3 if n != master]
    restarted = observed({**dict.fromkeys(others, 1), master: 2})
    failed = next_view(view, restarted)  # its old incarnation leaves...
    assert failed.partitions[0].replicas[0] != master
    assert failed.partitions[0].epoch == 2
    rejoined = next_view(failed, restarted)  # ...the new one joins as a follower
    assert [(m.node_id, m.incarnation) for m in rejoined.members if m.node_id == master] == [
        (master, 2)
    ]
    assert master not in rejoined.partitions[0].in_sync
    # Once its master says it caught up, it is the goal master again: a handover, a new epoch.
    now_master = rejoined.partitions[0].replicas[0]
    add = InSyncRequest(0, 2, frozenset({master}))
    synced = next_view(rejoined, Observed(restarted.registry, {}, [add]), now_master)
    assert synced.partitions[0].handover_to == master
    move = HandoverRequest(0, 2, master)
    moved = next_view(synced, Observed(restarted.registry, {}, [move]), now_master)
    assert row(moved, 0)[0] == moved.epoch == 5
    assert moved.partitions[0].replicas[0] == master


def test_an_offline_partition_is_restored_by_its_last_in_sync_replica() -> None:
    view = make_view([("n1 n2 n3", "n1")], N3)
    offline = next_view(view, observed(["n2", "n3"]))
    back = next_view(offline, observed({"n1": 2, "n2": 1, "n3": 1}))
    assert row(back, 0)[:3] == (7, ["n1", "n2", "n3"], ["n1"])
    records = failover_records(offline, back, 9)
    assert [(r.kind, r.from_node, r.to_node, r.epoch, r.view_epoch) for r in records] == [
        ("restored", "n1", "n1", 7, 7)
    ]


def test_a_restored_partition_drops_in_sync_replicas_still_away() -> None:
    view = make_view([("n1 n2 n3", "n1 n2")], N3)
    offline = next_view(view, observed(["n3"]))
    back = next_view(offline, observed(["n2", "n3"]))
    assert row(back, 0)[:3] == (7, ["n2", "n3"], ["n2"])


# ----- rule 5: towards the goal --------------------------------------------------------------


def test_goal_is_assign_then_the_ring_over_members() -> None:
    view = first_view(N5, partitions=16)
    placed = assign(N5, 16, 3)
    assert [goal(view, p) for p in range(16)] == [list(r) for r in placed]
    lost = next_view(view, observed(["n1", "n2", "n4", "n5"]))
    for p in range(16):
        assert goal(lost, p) == [n for n in order(view, p) if n != "n3"][:3]
    with pytest.raises(ValueError, match=r"partition 16 outside 0\.\.15"):
        goal(view, 16)


def test_a_lost_nodes_goal_replica_is_appended_as_a_follower() -> None:
    view = first_view(N5, partitions=16)
    new = next_view(view, observed(["n1", "n2", "n4", "n5"]))
    for p in range(16):
        want = goal(new, p)
        assert set(want) <= set(new.partitions[p].replicas)
        appended = [r for r in new.partitions[p].replicas if r not in view.partitions[p].replicas]
        assert not set(appended) & set(new.partitions[p].in_sync)
        assert len(appended) == ("n3" in view.partitions[p].replicas)


def test_handover_to_names_the_goal_master_once_it_is_in_sync() -> None:
    first, second, third = order(first_view(N3, partitions=1), 0)
    catching_up = make_view([(f"{second} {third} {first}", f"{second} {third}")], N3)
    assert plan(catching_up, observed(N3), config(), NOW) is None
    in_sync = make_view([(f"{second} {third} {first}", f"{second} {third} {first}")], N3)
    asked = next_view(in_sync, observed(N3))
    assert row(asked, 0) == (1, [second, third, first], [second, third, first], first)
    assert plan(asked, observed(N3), config(), NOW) is None
    # The goal master lost: the request is withdrawn.
    assert row(next_view(asked, observed([second, third])), 0)[3] == ""


def test_surplus_replicas_are_dropped_once_the_goal_holds() -> None:
    view = first_view(N3, partitions=1, rf=2)
    want = goal(view, 0)
    extra = next(n for n in N3 if n not in want)
    behind = make_view([(f"{want[0]} {extra} {want[1]}", f"{want[0]} {extra}")], N3, rf=2)
    assert plan(behind, observed(N3), config(), NOW) is None  # the goal follower is not in sync
    done = make_view([(f"{want[0]} {extra} {want[1]}", f"{want[0]} {extra} {want[1]}")], N3, rf=2)
    assert row(next_view(done, observed(N3)), 0) == (1, want, want, "")


# ----- rule 6: local requests ----------------------------------------------------------------


def appended_view() -> pb.View:
    """One partition: n1 masters it at epoch 3, n2 in sync, n3 a follower catching up."""
    return make_view([("n1 n2 n3", "n1 n2")], N3, epochs={0: 3})


def test_the_master_adds_a_caught_up_follower_to_in_sync() -> None:
    view = appended_view()
    add = InSyncRequest(0, 3, frozenset({"n3"}))
    new = next_view(view, observed(N3, requests=[add]))
    assert row(new, 0) == (3, ["n1", "n2", "n3"], ["n1", "n2", "n3"], "")
    assert request_outcome(add, view) == "pending"
    assert request_outcome(add, new) == "done"


def test_only_the_master_changes_in_sync() -> None:
    view = appended_view()
    add = InSyncRequest(0, 3, frozenset({"n3"}))
    assert plan(view, observed(N3, requests=[add]), config("n2"), NOW) is None
    remove = InSyncRequest(0, 3, remove=frozenset({"n2"}))
    assert plan(view, observed(N3, requests=[remove]), config("n3"), NOW) is None


def test_requests_for_another_epoch_are_moot() -> None:
    view = appended_view()
    stale = InSyncRequest(0, 2, frozenset({"n3"}))
    assert plan(view, observed(N3, requests=[stale]), config(), NOW) is None
    assert request_outcome(stale, view) == "moot"
    handover = HandoverRequest(0, 2, "n2")
    assert plan(view, observed(N3, requests=[handover]), config(), NOW) is None
    assert request_outcome(handover, view) == "moot"


def test_the_master_removes_a_follower_from_in_sync_but_never_itself() -> None:
    view = appended_view()
    remove = InSyncRequest(0, 3, remove=frozenset({"n2"}))
    new = next_view(view, observed(N3, requests=[remove]))
    assert row(new, 0)[2] == ["n1"]
    assert request_outcome(remove, view) == "pending"
    assert request_outcome(remove, new) == "done"
    itself = InSyncRequest(0, 3, remove=frozenset({"n1"}))
    assert plan(view, observed(N3, requests=[itself]), config(), NOW) is None
    assert request_outcome(itself, view) == "moot"


def test_an_in_sync_addition_needs_a_replica_that_is_a_member() -> None:
    w0, w1 = goal(first_view(N3, partitions=1, rf=2), 0)
    extra = next(n for n in N3 if n not in (w0, w1))
    view = make_view([(f"{w0} {w1}", f"{w0} {w1}")], N3, rf=2)
    not_replica = InSyncRequest(0, 1, frozenset({extra}))
    assert plan(view, observed(N3, requests=[not_replica]), config(w0), NOW) is None
    assert request_outcome(not_replica, view) == "moot"
    # The follower lost in the same step as its addition: the addition is moot.
    behind = make_view([(f"{w0} {w1} {extra}", f"{w0} {w1}")], N3)
    lost = InSyncRequest(0, 1, frozenset({extra}))
    new = next_view(behind, observed([w0, w1], requests=[lost]), w0)
    assert row(new, 0)[1:3] == ([w0, w1], [w0, w1])
    assert request_outcome(lost, new) == "moot"


def test_a_handover_makes_an_in_sync_member_master_at_a_new_epoch() -> None:
    view = make_view([("n1 n2 n3", "n1 n2 n3")], N3, epochs={0: 3}, handover={0: "n3"})
    move = HandoverRequest(0, 3, "n3")
    new = next_view(view, observed(N3, requests=[move]))
    assert row(new, 0)[:2] == (6, ["n3", "n1", "n2"])
    assert request_outcome(move, view) == "pending"
    assert request_outcome(move, new) == "done"
    records = failover_records(view, new, 1)
    assert [(r.kind, r.from_node, r.to_node, r.epoch) for r in records] == [
        ("handover", "n1", "n3", 6)
    ]
    # A later request of the old tenure is moot: the partition moved on.
    assert request_outcome(InSyncRequest(0, 3, remove=frozenset({"n2"})), new) == "moot"


def test_a_handover_to_a_replica_not_in_sync_is_ignored() -> None:
    view = appended_view()
    move = HandoverRequest(0, 3, "n3")
    assert plan(view, observed(N3, requests=[move]), config(), NOW) is None
    assert request_outcome(move, view) == "moot"


def test_requests_apply_in_order_and_a_handover_ends_the_tenure() -> None:
    view = appended_view()
    add = InSyncRequest(0, 3, frozenset({"n3"}))
    move = HandoverRequest(0, 3, "n3")
    late = InSyncRequest(0, 3, remove=frozenset({"n2"}))
    new = next_view(view, observed(N3, requests=[add, move, late]))
    assert row(new, 0)[:3] == (6, ["n3", "n1", "n2"], ["n3", "n1", "n2"])


# ----- rule 7: no empty proposals; epochs move only with the master --------------------------


def test_an_unchanged_observation_plans_nothing() -> None:
    view = first_view(N5, partitions=16)
    for node in N5:
        assert plan(view, observed(N5), config(node), NOW) is None
    # Planning again on each agreed result settles within a few steps.
    lost = next_view(view, observed(N5[:4]))
    assert plan(lost, observed(N5[:4]), config(), NOW) is None


def test_partition_epochs_change_only_with_their_master() -> None:
    """Through a loss, a second loss, and both returning: an epoch moves exactly when the
    partition gets another master or an offline partition is restored, and then to the epoch
    of the view that made the change."""
    view = first_view(N5, partitions=32, rf=2)
    steps = [N5[:4], N5[:3], N5[:4], N5]
    for nodes in steps:
        new = plan(view, observed(nodes), config(), NOW)
        assert new is not None
        for a, b in zip(view.partitions, new.partitions, strict=True):
            restored = a.replicas[0] not in members(view) and b.replicas[0] in members(new)
            changed = a.replicas[0] != b.replicas[0] or restored
            assert b.epoch == (new.epoch if changed else a.epoch)
        view = new


# ----- protocol versions (hexmq/node_protocol.py, docs/releases.md) ------------------------

ZLIB = frozenset({ZLIB_SNAPSHOTS})
CURRENT = ClusterProtocol(2, ZLIB | {KICK_ACKS})
TOO_NEW = Support(4, 5)


def speaking(
    supports: Mapping[str, Support],
    incarnations: Mapping[str, int] | None = None,
    suspicions: Mapping[str, Mapping[str, str]] | None = None,
) -> Observed:
    """Registrations (seen long ago) of nodes that speak these supports."""
    registry = {
        n: Registration(*_addrs(n), (incarnations or {}).get(n, 1), 0, protocol=s)
        for n, s in supports.items()
    }
    return Observed(registry, suspicions or {})


def _addrs(node: str) -> tuple[str, str, str, str]:
    n = node.removeprefix("n")
    return node, f"127.0.0.1:70{n}", f"127.0.0.1:18{n}", f"127.0.0.1:80{n}"


def protocol(view: pb.View) -> ClusterProtocol:
    return ClusterProtocol.of_view(view)


def test_the_first_view_says_what_its_members_speak_together() -> None:
    assert protocol(first_view(N3)) == CURRENT
    mixed = plan(
        None, speaking({"n1": THIS_RELEASE, "n2": LEGACY, "n3": THIS_RELEASE}), config(), 0
    )
    assert mixed is not None
    assert (mixed.protocol_version, list(mixed.features)) == (1, [])


def test_the_first_view_is_formed_by_the_nodes_that_share_a_version() -> None:
    nodes = {"n1": TOO_NEW, "n2": THIS_RELEASE, "n3": THIS_RELEASE, "n4": LEGACY}
    view = plan(None, speaking(nodes), config(expect=3), NOW)
    assert view is not None
    assert members(view) == ["n2", "n3", "n4"]
    assert protocol(view) == ClusterProtocol(1)
    assert plan(None, speaking(nodes), config(expect=4), NOW) is None
    refused = refused_joiners(None, speaking(nodes))
    assert list(refused) == ["n1"]
    assert refused["n1"].startswith("too new: it speaks protocol versions from 4 on")


def test_a_node_of_the_previous_release_joins_and_the_same_view_turns_features_off() -> None:
    view = first_view(N3)
    assert protocol(view) == CURRENT
    nodes = dict.fromkeys(N3, THIS_RELEASE) | {"n4": LEGACY}
    joined = next_view(view, speaking(nodes))
    assert members(joined) == ["n1", "n2", "n3", "n4"]
    assert protocol(joined) == ClusterProtocol(1)
    # It leaves again (rolled forward): the view that removes it turns them back on.
    upgraded = next_view(joined, speaking(dict.fromkeys(N3, THIS_RELEASE)))
    assert members(upgraded) == N3
    assert protocol(upgraded) == CURRENT


def test_the_feature_turns_on_only_with_the_last_member_that_lacked_it() -> None:
    nodes = {"n1": THIS_RELEASE, "n2": LEGACY, "n3": LEGACY}
    view = plan(None, speaking(nodes), config(), NOW)
    assert view is not None
    # n2 is replaced by this release (a restart: a new incarnation), then n3.
    without = next_view(view, speaking(nodes | {"n2": THIS_RELEASE}, {"n2": 2}))
    back = next_view(without, speaking(nodes | {"n2": THIS_RELEASE}, {"n2": 2}))
    assert members(back) == N3
    assert protocol(back) == ClusterProtocol(1)  # n3 still speaks version 1 only
    current = dict.fromkeys(N3, THIS_RELEASE)
    without = next_view(back, speaking(current, {"n2": 2, "n3": 2}))
    assert protocol(without) == CURRENT  # n3, the last of v0.2.0, is out
    back = next_view(without, speaking(current, {"n2": 2, "n3": 2}))
    assert members(back) == N3
    assert protocol(back) == CURRENT


def test_a_node_too_new_for_the_members_is_not_admitted_and_the_plan_goes_on() -> None:
    view = first_view(N3, partitions=16)
    obs = speaking(dict.fromkeys(N3, THIS_RELEASE) | {"n4": TOO_NEW})
    assert plan(view, obs, config(), NOW) is None  # nothing else to do
    refused = refused_joiners(view, obs)
    assert list(refused) == ["n4"]
    assert "n1 (1..2), n2 (1..2), n3 (1..2) speak(s) nothing newer than 2" in refused["n4"]
    # Another node joins meanwhile; n4 stays out.
    obs = speaking(dict.fromkeys([*N3, "n5"], THIS_RELEASE) | {"n4": TOO_NEW})
    assert members(next_view(view, obs)) == [*N3, "n5"]
    assert refused_joiners(view, speaking(dict.fromkeys(N3, THIS_RELEASE))) == {}


def test_a_node_too_old_for_the_members_is_not_admitted() -> None:
    later = Support(2, 3, ZLIB)
    nodes = dict.fromkeys(N3, later)
    view = plan(None, speaking(nodes), config(), NOW)
    assert view is not None
    assert protocol(view) == ClusterProtocol(3, ZLIB)
    obs = speaking(nodes | {"n4": LEGACY})
    assert plan(view, obs, config(), NOW) is None
    assert refused_joiners(view, obs)["n4"].startswith("too old")


def test_joiners_admitted_together_share_a_version_with_each_other() -> None:
    # n4 (1 only) and n5 (2..3) each share a version with the members (1..2), not with each
    # other: the first in node id order joins, the other waits, refused, for the next view.
    view = first_view(N3)
    nodes = dict.fromkeys(N3, THIS_RELEASE) | {"n4": LEGACY, "n5": Support(2, 3)}
    joined = next_view(view, speaking(nodes))
    assert members(joined) == [*N3, "n4"]
    assert "n5" in refused_joiners(joined, speaking(nodes))
    assert plan(joined, speaking(nodes), config(), NOW) is None


def test_a_view_from_a_v0_2_0_agent_is_brought_back_to_what_the_members_speak() -> None:
    """A v0.2.0 agent makes its views without the protocol fields (version 1, no features):
    one among members that all speak this release is followed by a view that turns them
    on, and changes nothing else."""
    view = first_view(N3)
    old = pb.View()
    old.CopyFrom(view)
    old.ClearField("protocol_version")
    old.ClearField("features")
    new = next_view(old, observed(N3))
    assert protocol(new) == CURRENT
    assert list(new.members) == list(view.members)
    assert list(new.partitions) == list(view.partitions)
    assert plan(new, observed(N3), config(), NOW) is None


def test_a_member_whose_agent_now_speaks_more_changes_the_view() -> None:
    """An agent upgraded alone re-registers the node with the same incarnation and a new
    support: the members speak something else together."""
    view = plan(None, speaking(dict.fromkeys(N3, THIS_RELEASE) | {"n3": LEGACY}), config(), 0)
    assert view is not None
    assert protocol(view) == ClusterProtocol(1)
    new = next_view(view, speaking(dict.fromkeys(N3, THIS_RELEASE)))
    assert members(new) == N3
    assert protocol(new) == CURRENT


# ----- rule 8: deterministic ------------------------------------------------------------------


def test_plan_is_deterministic_whatever_the_input_order() -> None:
    view = first_view(N5, partitions=16)
    names = [*N5, "n6"]
    reports = {"n1": {"n3": SILENT, "n2": SILENT}, "n4": {"n3": SILENT, "n2": SILENT}}
    results = set()
    rng = random.Random(7)
    for _ in range(10):
        shuffled = rng.sample(names, len(names))
        rep = {
            r: dict(rng.sample(sorted(reports[r].items()), 2)) for r in rng.sample(["n1", "n4"], 2)
        }
        new = plan(view, observed(shuffled, {**rep, "n5": {"n3": SILENT}}), config(), NOW)
        assert new is not None
        results.add(new.SerializeToString(deterministic=True))
    assert len(results) == 1


# ----- the rest of the interface -------------------------------------------------------------


def test_a_member_with_new_addresses_is_updated() -> None:
    view = first_view(N3)
    moved = Registration("n2", "127.0.0.1:7999", "127.0.0.1:1999", "127.0.0.1:8999", 1, 0)
    obs = Observed({**observed(N3).registry, "n2": moved}, {})
    new = next_view(view, obs)
    assert new.members[1] == moved.member()
    assert new.partitions == view.partitions


def test_bad_input_is_refused_with_a_clear_error() -> None:
    view = first_view(N3)
    broken = pb.View()
    broken.CopyFrom(view)
    del broken.partitions[2].in_sync[0]
    with pytest.raises(ViewError, match=r"view 1: partition 2: in_sync .* must hold the master"):
        plan(broken, observed(N3), config(), NOW)
    short = pb.View()
    short.CopyFrom(view)
    del short.partitions[-1]
    with pytest.raises(ViewError, match="partition_count 8 but 7 partitions"):
        check_view(short)
    with pytest.raises(ValueError, match="n1 reports n2 'gone'"):
        Observed({}, {"n1": {"n2": "gone"}})
    with pytest.raises(ValueError, match="registry key 'n1' holds the registration of 'n2'"):
        Observed({"n1": reg("n2")}, {})
    with pytest.raises(ValueError, match=r"\['n2'\] both added and removed"):
        InSyncRequest(0, 1, frozenset({"n2"}), frozenset({"n2"}))
    with pytest.raises(ValueError, match="epoch 0 is not positive"):
        HandoverRequest(0, 0, "n2")
    with pytest.raises(ValueError, match=r"PlanConfig\.rf must be positive"):
        PlanConfig("n1", 8, 0, 3, 0)
    with pytest.raises(ValueError, match="incarnation -1"):
        reg("n1", -1)


def test_failover_records_name_each_change_of_hands() -> None:
    view = make_view([("n1 n2 n3", "n1 n2 n3"), ("n2 n1", "n2"), ("n3 n1", "n3 n1")], N3)
    new = next_view(view, observed(["n1", "n3"]))  # n2 lost
    kinds = {r.partition: (r.kind, r.from_node, r.to_node) for r in failover_records(view, new, 5)}
    assert kinds == {1: ("offline", "n2", "")}
    lost_n1 = next_view(new, observed(["n3"]))
    kinds = {
        r.partition: (r.kind, r.from_node, r.to_node) for r in failover_records(new, lost_n1, 5)
    }
    assert kinds == {0: ("failover", "n1", "n3")}
    assert failover_records(lost_n1, lost_n1, 5) == []


# ----- join and leave (docs/failover.md, "Join" and "Leave") ---------------------------------


def leaving_reg(node: str) -> Registration:
    r = reg(node)
    return Registration(
        r.node_id, r.partition_addr, r.mqtt_addr, r.membership_addr, 1, 0, leaving=True
    )


def test_a_leaving_registration_takes_the_node_out_of_the_targets_and_its_goals() -> None:
    view = first_view(N5, partitions=16)
    obs = Observed({**{n: reg(n) for n in N5}, "n2": leaving_reg("n2")}, {})
    new = next_view(view, obs)
    assert list(new.leaving) == ["n2"]
    assert "n2" not in new.target_members
    assert "n2" in members(new)
    for a in new.partitions:
        if "n2" in a.replicas:
            # It stays until RF is restored elsewhere: a goal replica was appended for it.
            assert len(a.replicas) == 4
            if a.replicas[0] == "n2":
                assert a.handover_to in ("", *a.in_sync)
    # Once every partition holds its goal in sync without n2, it is dropped, then removed.
    rest = [n for n in N5 if n != "n2"]
    done = make_view(
        [(" ".join(r), " ".join(r)) for r in assign(rest, 16, 3)],
        N5,
        targets=rest,
    )
    done.leaving.append("n2")
    check_view(done)
    gone = next_view(done, obs)
    assert members(gone) == rest
    assert list(gone.leaving) == []


def test_the_last_member_that_stays_cannot_leave() -> None:
    view = make_view([("n1 n2", "n1 n2"), ("n2 n1", "n2 n1")], ["n1", "n2"], rf=2)
    obs = Observed({"n1": leaving_reg("n1"), "n2": leaving_reg("n2")}, {})
    new = next_view(view, obs)
    assert list(new.leaving) == ["n1"]
    assert list(new.target_members) == ["n2"]


def test_a_joining_node_lost_before_it_caught_up_leaves_the_targets() -> None:
    view = first_view(N3)
    joined = next_view(view, observed(["n1", "n2", "n3", "n4"]))
    assert list(joined.joining) == ["n4"]
    assert "n4" in joined.target_members
    lost = next_view(joined, observed(N3))
    assert list(lost.target_members) == N3
    assert list(lost.joining) == []
    # A target member that held its goal in sync and is lost stays a target (kill_for_good).
    settled = make_view([(" ".join(r), " ".join(r)) for r in assign(N5, 8, 3)], N5)
    assert list(next_view(settled, observed([*N3, "n4"])).target_members) == N5


def test_joining_and_leaving_must_be_members_in_their_place() -> None:
    view = first_view(N3)
    bad = pb.View()
    bad.CopyFrom(view)
    bad.leaving.append("n2")
    with pytest.raises(ViewError, match=r"leaving \['n2'\] must be members and not target"):
        check_view(bad)
    bad = pb.View()
    bad.CopyFrom(view)
    bad.joining.append("n9")
    with pytest.raises(ViewError, match=r"joining \['n9'\] must be members and targets"):
        check_view(bad)
