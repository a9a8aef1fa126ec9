"""The verdict's rules on made-up runs (tests/faults/verdict.py): each failure it must name,
and the kills, takeovers, refusals and cuts it must excuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.faults.observe import handed_over
from tests.faults.verdict import disconnects, judge, majority_served, node_of
from tests.support.workload import Connection, Publisher

N1, N2, N3 = "127.0.0.11", "127.0.0.12", "127.0.0.13"


def conn(
    client: str,
    host: str,
    started: float,
    ended: float | None,
    cause: str = "",
    purpose: str = "",
) -> Connection:
    return Connection(client, host, 1883, started, ended, cause=cause, purpose=purpose)


def fault(
    index: int, kind: str, start: float, end: float, nodes: list[int], **targets: Any
) -> dict[str, Any]:
    return {
        "index": index,
        "kind": kind,
        "start": start,
        "end": end,
        "targets": {
            "nodes": nodes,
            "groups": targets.get("groups", []),
            "one_way": targets.get("one_way", []),
            "minority": targets.get("minority", []),
        },
    }


def clean_result(**changes: Any) -> dict[str, Any]:
    result: dict[str, Any] = {
        "counts": {
            "lost": 0,
            "unexpected": 0,
            "duplicated_qos2": 0,
            "order_violations": 0,
        },
        "shared_group": {
            "lost": [],
            "duplicates_qos2": [],
            "unexpected": [],
            "order_violations": [],
        },
        "epoch_conflicts": [],
        "convergence": {"converged": True, "reason": ""},
        "divergence": {"differing": [], "stale_copies": []},
        "retained": {"converged": True},
        "unreconnected": [],
        "split_subscriptions": [],
        "faults": [],
        "timing": {"end": 100.0},
    }
    result.update(changes)
    return result


def test_node_numbers_come_from_the_address() -> None:
    assert node_of("127.0.0.12:21884") == 2


def test_a_clean_run_passes() -> None:
    verdict = judge(clean_result(), [conn("s", N1, 1.0, None)], [], 0.0, 10.0)
    assert verdict["ok"], verdict


def test_every_broken_rule_is_named() -> None:
    result = clean_result(
        counts={"lost": 2, "unexpected": 1, "duplicated_qos2": 3, "order_violations": 4},
        shared_group={
            "lost": ["a:1"],
            "duplicates_qos2": [],
            "unexpected": [],
            "order_violations": [],
        },
        epoch_conflicts=[{"partition": 3, "epoch": 7, "masters": {"n1": 1.0, "n2": 2.0}}],
        convergence={"converged": False, "reason": "partition 4 in sync [n1] of [n1, n2]"},
        divergence={"differing": [{"partition": 1, "node": "n2", "keys": ["hx:1:meta"]}]},
        retained={"converged": False},
        unreconnected=["s1-x-n1"],
        split_subscriptions=[{"granted": True, "delivered": False}],
    )
    failures = judge(result, [], [], 0.0, 10.0)["failures"]
    assert failures == [
        "2 acknowledged message(s) lost",
        "1 message(s) nobody published",
        "3 QoS 2 duplicate(s)",
        "4 order violation(s)",
        "shared group: 1 lost",
        "1 partition epoch(s) with two masters",
        "not converged after the heal: partition 4 in sync [n1] of [n1, n2]",
        "1 replica(s) differ from their master",
        "retained messages differ between nodes or are older than acknowledged",
        "subscribers that could not reconnect: ['s1-x-n1']",
        "1 subscription(s) granted during a split are missing",
    ]


def test_a_shared_group_may_be_out_of_order_only_by_as_many_messages_as_were_handed_over() -> None:
    """Seed 1505 (joins-and-leaves): a member's connection ended at a leave, 3 of its messages
    went to the other member, one arriving after that member's own later message."""
    late = ["p2-x-n3:407 after p2-x-n3:408", "p1-x-n1:9 after p1-x-n1:10"]

    def judged(handed: int) -> dict[str, Any]:
        group = {**clean_result()["shared_group"], "order_violations": late}
        group["handed_over"] = handed
        return judge(clean_result(shared_group=group), [], [], 0.0, 10.0)

    verdict = judged(3)
    assert verdict["ok"], verdict
    assert verdict["warnings"] == [
        "shared group: 2 message(s) out of order at a member, of 3 handed over from a member "
        "whose connection ended"
    ]
    assert judged(1)["failures"] == [
        "shared group: 2 order violations (1 messages handed between members)"
    ]
    assert judged(0)["failures"] == [
        "shared group: 2 order violations (0 messages handed between members)"
    ]


def test_handed_over_counts_the_edges_log_lines_of_that_group_only(tmp_path: Path) -> None:
    def line(n: int, tag: str) -> str:
        return (
            f"2026-11-27 17:57:36,584 INFO edge[n1] hexmq.edge: handing {n} messages of shared "
            f"group $share/g/f/{tag}/# over from partition 9 to partition 0"
        )

    for node, lines in (("node1", [line(3, "t1")]), ("node2", [line(2, "t1"), line(5, "t2")])):
        (tmp_path / node).mkdir()
        (tmp_path / node / "edge.log").write_text("\n".join(lines) + "\n")
    # Given to a member in the same partition (the partition service's line).
    (tmp_path / "node2" / "partition.log").write_text(
        "2026-11-27 17:57:36,590 INFO partition[n2] hexmq.partition: handing 4 messages of "
        "shared group $share/g/f/t1/# over from g2-x to a member in partition 5\n"
    )
    assert handed_over(tmp_path, "$share/g/f/t1/#") == 9
    assert handed_over(tmp_path, "$share/g/f/t3/#") == 0


def test_disconnects_by_kill_leave_takeover_and_refusal_are_excused() -> None:
    faults = [fault(0, "kill-master", 10.0, 20.0, [1]), fault(1, "leave-rejoin", 60, 80, [3])]
    pub = Publisher("p2", 1883, "t", qos=2, version=4)
    pub.sent_at = {5: 30.0}
    pub.sent_via = {5: f"{N2}:1883"}
    pub.unanswered = {5}
    history = [
        conn("s1", N1, 1.0, 10.2, "server"),  # its node was killed
        conn("s2", N2, 1.0, 15.0, "takeover"),  # our takeover through n3
        conn("s2", N3, 14.9, None, purpose="takeover"),
        conn("p2", N2, 25.0, 40.5, "server"),  # 3.1.1: PUBLISH held 10.5 s, then closed
        conn("s3", N3, 1.0, 50.0, "client"),  # closed by the client itself
        conn("s4", N3, 1.0, 63.0, "server"),  # its node left (0x9C, another server)
    ]
    assert disconnects(history, faults, {"p2": pub}, 0.0, 10.0) == []
    # A node that leaves sends off only its own clients.
    elsewhere = [conn("s5", N2, 1.0, 63.0, "server")]
    assert [d["client_id"] for d in disconnects(elsewhere, faults, {}, 0.0, 10.0)] == ["s5"]


def test_unexplained_disconnects_are_reported_and_split_ones_are_g7() -> None:
    faults = [fault(0, "isolate", 10.0, 20.0, [2], groups=[[2], [1, 3, 0]], minority=[2])]
    history = [
        conn("s1", N2, 1.0, 12.0, "server"),  # on the minority, during the split
        conn("s1", N1, 12.3, None),  # the client came back at once: not a takeover
        conn("s2", N3, 1.0, 60.0, "server"),  # long after the heal
        conn("s3", N1, 1.0, 61.0, "takeover"),  # 0x8E though we took nothing over
    ]
    found = disconnects(history, faults, {}, 0.0, 10.0)
    assert [(d["client_id"], d["during_split"], d["stale_takeover"]) for d in found] == [
        ("s1", [0], False),
        ("s2", [], False),
        ("s3", [], True),
    ]
    failures = judge(clean_result(faults=faults), history, [], 0.0, 10.0)["failures"]
    assert "1 client(s) disconnected during a network split (G7)" in failures
    assert "2 client(s) disconnected unexpectedly" in failures


def test_a_refusal_needs_the_failover_hold() -> None:
    pub = Publisher("p2", 1883, "t", qos=2, version=4)
    pub.sent_at = {5: 30.0}
    pub.sent_via = {5: f"{N2}:1883"}
    pub.unanswered = {5}
    early = [conn("p2", N2, 25.0, 33.0, "server")]  # closed 3 s after the PUBLISH
    assert len(disconnects(early, [], {"p2": pub}, 0.0, 10.0)) == 1
    five = Publisher("p1", 1883, "t", qos=1, version=5)  # 5.0 refuses with PUBACK 0x80
    five.sent_at, five.sent_via, five.unanswered = pub.sent_at, pub.sent_via, pub.unanswered
    late = [conn("p1", N2, 25.0, 41.0, "server")]
    assert len(disconnects(late, [], {"p1": five}, 0.0, 10.0)) == 1


def test_two_live_connections_are_a_g5_failure_unless_a_cut_kept_them_apart() -> None:
    faults = [fault(0, "isolate", 10.0, 20.0, [2], groups=[[2], [1, 3, 0]], minority=[2])]
    across = [conn("s", N2, 1.0, 21.0, "takeover"), conn("s", N1, 12.0, None, purpose="takeover")]
    verdict = judge(clean_result(faults=faults), across, [], 0.0, 10.0)
    assert verdict["ok"], verdict
    assert verdict["g5_overlaps"][0]["excused"].startswith("n2 and n1 cut apart")
    same_side = [
        conn("s", N1, 1.0, 35.0, "takeover"),
        conn("s", N3, 30.0, None, purpose="takeover"),
    ]
    verdict = judge(clean_result(faults=faults), same_side, [], 0.0, 10.0)
    assert "1 client id(s) with two live connections (G5)" in verdict["failures"]


def test_the_majority_side_must_serve_in_a_long_split() -> None:
    faults = [fault(0, "isolate", 10.0, 30.0, [2], groups=[[2], [1, 3, 0]], minority=[2])]
    pub = Publisher("p1", 1883, "t")
    pub.sent_at = {1: 20.0, 2: 25.0, 3: 26.0}
    pub.sent_via = {1: f"{N1}:1883", 2: f"{N1}:1883", 3: f"{N2}:1883"}
    pub.acked = {1: 20.1}
    assert majority_served(faults, [pub], 0.0) == []  # acknowledged at 20.1 s
    pub.acked = {3: 40.0}  # only what went through the minority node, after the heal
    assert majority_served(faults, [pub], 0.0) == [
        "fault 0 (isolate): nothing sent through the majority side in 18.0-30.0 s was "
        "acknowledged (2 sent)"
    ]
    short = [fault(0, "isolate", 10.0, 15.0, [2], minority=[2])]
    assert majority_served(short, [pub], 0.0) == []
    # Halves with the lone agreement server on the smaller side: only that side can change
    # the view, so the larger one is not expected to serve (every other rule still holds).
    cut_off = [fault(0, "halves", 10.0, 30.0, [2], groups=[[2, 0], [1, 3]], minority=[2])]
    assert majority_served(cut_off, [pub], 0.0) == []
    with_majority = [fault(0, "halves", 10.0, 30.0, [2], groups=[[2], [1, 3, 0]], minority=[2])]
    assert len(majority_served(with_majority, [pub], 0.0)) == 1
