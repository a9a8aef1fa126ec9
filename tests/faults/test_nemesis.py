"""Nemesis schedules and targets (tests/faults/nemesis.py): pure, so plain tests."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.faults import nemesis, netns, specs
from tests.faults.nemesis import AGREEMENT, Fault, schedule, targets


def test_a_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    kinds = nemesis.kinds_for(3)
    assert schedule(7, kinds, 60) == schedule(7, kinds, 60)
    assert schedule(7, kinds, 60) != schedule(8, kinds, 60)


def test_faults_come_one_at_a_time_with_quiet_periods() -> None:
    for seed in range(50):
        faults = schedule(seed, nemesis.kinds_for(5), 90, quiet=(5.0, 9.0))
        assert faults[0].at == 4.0
        assert faults[-1].at < 90
        for before, after in itertools.pairwise(faults):
            assert after.at - (before.at + before.duration) >= 5.0 - 0.1
        for f in faults:
            low, high = nemesis.DURATIONS[f.kind]
            assert low <= f.duration <= high
            assert (f.jump_s != 0) == (f.kind == "clock-jump")


def test_kinds_for_a_size_and_unknown_kinds() -> None:
    assert "ring" not in nemesis.kinds_for(3)
    assert "ring" in nemesis.kinds_for(5)
    assert "join-leave" in nemesis.kinds_for(8)
    assert "join-leave" not in nemesis.kinds_for(9)  # no group id for a tenth node
    with pytest.raises(ValueError, match="unknown nemesis partition-all"):
        nemesis.kinds_for(3, ["isolate", "partition-all"])
    with pytest.raises(ValueError, match="no nemesis left for 3 nodes"):
        nemesis.kinds_for(3, ["ring"])


def test_a_colocated_cluster_takes_every_kind_but_a_cut_between_a_nodes_own_services() -> None:
    assert "intra-node" in nemesis.kinds_for(3)
    assert nemesis.kinds_for(3, colocated=True) == [
        k for k in nemesis.kinds_for(3) if k != "intra-node"
    ]
    with pytest.raises(ValueError, match="co-located node runs them in one process"):
        nemesis.kinds_for(3, ["intra-node", "pause"], colocated=True)


def test_co_located_runs_say_so_in_their_replay_and_the_campaign_plays_both_packings() -> None:
    colocated = [spec for spec in specs.FIXED if spec.colocated]
    kinds = {k for spec in colocated for k in spec.kinds or ()}
    assert {"kill-master", "pause", "one-way", "redis-kill"} <= kinds
    for spec in specs.FIXED:
        assert ("--colocated" in spec.argv(Path("out"))) == spec.colocated
    campaign = specs.random_specs(6, 40)
    assert {spec.colocated for spec in campaign} == {True, False}
    assert all(spec.colocated == (spec.seed % 2 == 1) for spec in campaign)


# Node numbers in the view's table: partition 0 mastered by 1, followed by 2 and 3, ...
TABLE = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]


def fault(kind: str, pick: int = 5) -> Fault:
    return Fault(0, kind, 4.0, 5.0, pick)


def test_kill_master_and_follower_take_a_partitions_master_or_follower() -> None:
    for pick in range(20):
        master = targets(fault("kill-master", pick), [1, 2, 3], TABLE)
        assert master.partition is not None
        assert master.nodes == [TABLE[master.partition][0]]
        follower = targets(fault("kill-follower", pick), [1, 2, 3], TABLE)
        assert follower.partition is not None
        assert follower.nodes[0] in TABLE[follower.partition][1:]
    dead_master = targets(fault("kill-master"), [2, 3], TABLE)
    assert dead_master.nodes[0] != 1  # a partition whose master is down is never chosen


def test_kill_majority_takes_a_majority() -> None:
    assert len(targets(fault("kill-majority"), [1, 2, 3], TABLE).nodes) == 2
    assert len(targets(fault("kill-majority"), [1, 2, 3, 4, 5], TABLE).nodes) == 3


def test_isolate_and_halves_put_the_agreement_server_on_one_side() -> None:
    isolated = targets(fault("isolate"), [1, 2, 3], TABLE)
    (node,) = isolated.nodes
    assert isolated.groups == [[node], [*sorted({1, 2, 3} - {node}), AGREEMENT]]
    assert isolated.minority == [node]
    sides = set()
    for pick in range(20):
        halves = targets(fault("halves", pick), [1, 2, 3, 4, 5], TABLE)
        small, large = halves.groups
        assert len(set(small) - {AGREEMENT}) == 2
        assert len(set(large) - {AGREEMENT}) == 3
        assert halves.minority == sorted(set(small) - {AGREEMENT})
        sides.add(AGREEMENT in small)
    assert sides == {True, False}


def test_a_majority_ring_lets_every_node_see_a_different_majority() -> None:
    for n in (5, 7, 9):
        nodes = [f"a{i}" for i in range(n)]
        cut = {frozenset(pair) for pair in netns.ring(nodes)}
        seen = [
            frozenset({x} | {y for y in nodes if y != x and frozenset((x, y)) not in cut})
            for x in nodes
        ]
        assert all(len(s) >= n // 2 + 1 for s in seen), (n, seen)
        assert len(set(seen)) == n
        assert all(len(s) < n for s in seen)  # nobody sees everyone
    with pytest.raises(ValueError, match="at least 5 nodes"):
        netns.ring(["a", "b", "c"])


def test_ring_targets_cut_both_ways() -> None:
    ring = targets(fault("ring"), [1, 2, 3, 4, 5], TABLE)
    pairs = set(ring.one_way)
    assert pairs
    assert all((b, a) in pairs for a, b in pairs)
    assert AGREEMENT not in {x for pair in pairs for x in pair}


def test_cut_agreement_and_one_way() -> None:
    cut = targets(fault("cut-agreement"), [1, 2, 3], TABLE)
    (node,) = cut.nodes
    assert sorted(cut.one_way) == [(AGREEMENT, node), (node, AGREEMENT)]
    directions = set()
    for pick in range(20):
        one = targets(fault("one-way", pick), [1, 2, 3], TABLE)
        (node,) = one.nodes
        assert len(one.one_way) == 2
        directions.add(all(a == node for a, _b in one.one_way))
        assert all(node in pair for pair in one.one_way)
    assert directions == {True, False}  # both "cannot send" and "cannot hear"


def test_leave_rejoin_takes_a_live_node_and_join_leave_the_spare() -> None:
    left = {targets(fault("leave-rejoin", pick), [1, 3], TABLE).nodes[0] for pick in range(20)}
    assert left == {1, 3}
    alone = targets(fault("leave-rejoin"), [2], TABLE)
    assert alone.nodes == []
    assert "nobody to leave to" in alone.note
    assert targets(fault("join-leave"), [1, 2, 3], TABLE, spare=4).nodes == [4]
    assert targets(fault("join-leave"), [1, 2, 3], TABLE).nodes == []


def test_the_fixed_set_covers_every_nemesis() -> None:
    played = set()
    for spec in specs.FIXED:
        kinds = nemesis.kinds_for(spec.nodes, spec.kinds, colocated=spec.colocated)
        played |= {f.kind for f in schedule(spec.seed, kinds, spec.length)}
    assert played == set(nemesis.DURATIONS)


# ----- issue 30: a node's own services cut from each other, and plain rules ------------------


def test_intra_node_cuts_one_node_from_its_own_partition_service_or_agent_or_both() -> None:
    seen = set()
    for pick in range(40):
        cut = targets(fault("intra-node", pick), [1, 2, 3], TABLE)
        (node,) = cut.nodes
        assert node in (1, 2, 3)
        assert cut.own in (["partition"], ["membership"], ["partition", "membership"])
        assert (cut.groups, cut.one_way, cut.plain) == ([], [], [])
        seen.add(tuple(cut.own))
    assert len(seen) == 3
    both = next(
        targets(fault("intra-node", p), [1, 2, 3], TABLE)
        for p in range(40)
        if len(targets(fault("intra-node", p), [1, 2, 3], TABLE).own) == 2
    )
    assert both.note == (
        "its edge -> its partition service; its edge and partition service -> its agent cut"
    )


def test_plain_cuts_go_one_way_or_both_between_a_node_and_every_peer() -> None:
    kinds = set()
    for pick in range(60):
        cut = targets(fault("plain-cut", pick), [1, 2, 3], TABLE)
        (node,) = cut.nodes
        assert cut.minority == [node]
        others = {1, 2, 3} - {node}
        clients = any(nemesis.CLIENTS in pair for pair in cut.plain)
        peers = {*others, AGREEMENT, *((nemesis.CLIENTS,) if clients else ())}
        send = {(node, p) for p in peers}
        hear = {(p, node) for p in peers}
        how = cut.note.split(":")[0]
        assert (
            set(cut.plain)
            == {
                "cannot send": send,
                "cannot hear": hear,
                "both ways": send | hear,
            }[how]
        ), cut
        assert ("127.0.0.1" in cut.note) == clients
        kinds.add((how, clients))
    assert len(kinds) == 6  # three directions, with and without 127.0.0.1


def test_an_own_cut_is_one_conntrack_rule_on_the_reply_tuple() -> None:
    assert netns.own_cut_rule("127.0.0.13", 22886) == [
        *("-A", "INPUT", "-p", "tcp", "-m", "conntrack"),
        *("--ctreplsrc", "127.0.0.13", "--ctrepldst", "127.0.0.13"),
        *("--ctreplsrcport", "22886", "-j", "DROP"),
        *("-m", "comment", "--comment", "hexmq-faults own 127.0.0.13:22886"),
    ]


def test_plain_rules_come_after_the_kept_ports() -> None:
    rules = netns.plain_cut_rules(
        [("127.0.0.13", "127.0.0.11"), ("127.0.0.1", "127.0.0.13")],
        keep=[("127.0.0.13", 21903)],
    )
    assert rules == [
        [
            *("-I", "INPUT", "1", "-p", "tcp", "-d", "127.0.0.13", "--dport", "21903"),
            *("-j", "ACCEPT", "-m", "comment", "--comment", "hexmq-faults keep 127.0.0.13:21903"),
        ],
        [
            *("-I", "INPUT", "1", "-p", "tcp", "-s", "127.0.0.13", "--sport", "21903"),
            *("-j", "ACCEPT", "-m", "comment", "--comment", "hexmq-faults keep 127.0.0.13:21903"),
        ],
        [
            *("-A", "INPUT", "-s", "127.0.0.13", "-d", "127.0.0.11", "-j", "DROP"),
            *("-m", "comment", "--comment", "hexmq-faults plain 127.0.0.13->127.0.0.11"),
        ],
        [
            *("-A", "INPUT", "-s", "127.0.0.1", "-d", "127.0.0.13", "-j", "DROP"),
            *("-m", "comment", "--comment", "hexmq-faults plain 127.0.0.1->127.0.0.13"),
        ],
    ]


def test_the_random_campaign_draws_the_new_nemeses() -> None:
    for nodes in (3, 5):
        assert {"intra-node", "plain-cut"} <= set(nemesis.kinds_for(nodes))
    drawn = {f.kind for seed in range(3000, 3100) for f in schedule(seed, nemesis.kinds_for(3), 45)}
    assert {"intra-node", "plain-cut"} <= drawn
