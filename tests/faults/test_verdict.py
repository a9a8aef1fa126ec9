"""The verdict's rules on made-up runs (tests/faults/verdict.py): each failure it must name,
and the kills, takeovers, refusals and cuts it must excuse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hexmq.hashring import partition_of
from tests.faults.observe import handed_over
from tests.faults.verdict import (
    Arrivals,
    Reachability,
    disconnects,
    judge,
    links_problems,
    links_unshown,
    majority_served,
    node_of,
    nothing_silent,
    plain_blocks,
    restarts,
)
from tests.support.workload import Connection, Publisher

N1, N2, N3 = "127.0.0.11", "127.0.0.12", "127.0.0.13"


def conn(
    client: str,
    host: str,
    started: float,
    ended: float | None,
    cause: str = "",
    purpose: str = "",
    requested: float | None = None,
) -> Connection:
    return Connection(
        client, host, 1883, started, ended, cause=cause, purpose=purpose, requested=requested
    )


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
            "own": targets.get("own", []),
            "plain": targets.get("plain", []),
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
        "convergence": {"converged": True, "reason": "", "view_epoch": 140},
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


def test_a_takeover_explains_a_close_that_came_while_its_connect_was_answered() -> None:
    # Campaign seed 4024 (load 10-14): the old connection closed at 45.08, the takeover's
    # CONNACK came at 46.21: its CONNECT had been sent before the close, so the close is the
    # takeover's. A CONNECT sent only after a close does not explain it.
    history = [
        conn("s1", N3, 30.6, 45.08, "server"),
        conn("s1", N1, 46.21, None, purpose="takeover", requested=44.9),
        conn("s2", N3, 30.6, 45.08, "server"),
        conn("s2", N1, 46.21, None, purpose="takeover", requested=45.2),
        conn("s3", N3, 30.6, 45.08, "server"),  # a record without the CONNECT's time
        conn("s3", N1, 46.21, None, purpose="takeover"),
    ]
    found = disconnects(history, [], {}, 0.0, 10.0)
    assert [d["client_id"] for d in found] == ["s2", "s3"]


def test_a_takeover_that_was_refused_still_explains_the_close_it_caused() -> None:
    # Replay of seed 4041 at load 33: a takeover's CONNECT at 26.4 s took the session over
    # (the old connection closed at 28.8 s) but never reached its client as accepted; the
    # harness records only accepted connections, so the close is explained by the attempt
    # (judge reads them from the run's moves). An attempt after the close explains nothing.
    history = [conn("s1", N3, -0.2, 28.8, "server"), conn("s2", N3, -0.2, 28.8, "server")]
    attempts = {"s1": [26.4], "s2": [29.0]}
    found = disconnects(history, [], {}, 0.0, 10.0, takeover_attempts=attempts)
    assert [d["client_id"] for d in found] == ["s2"]
    moves = [
        {"client_id": "s1", "how": "takeover", "at": 26.4, "session_present": None},
        {"client_id": "s2", "how": "move", "at": 26.4, "session_present": None},
    ]
    verdict = judge(clean_result(moves=moves), history, [], 0.0, 10.0)
    assert [d["client_id"] for d in verdict["unexpected_disconnects"]] == ["s2"]


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


# ----- G9: nothing silent, the unreachable-disconnects, the links after the final heal -------

# Every view names n3 master of partition 0, n1 of partition 1 (32 partitions).
MASTERS = ["n3", "n1", *(["n2"] * 30)]


def views(*changes: tuple[float, list[str]]) -> list[dict[str, Any]]:
    return [{"at": at, "masters": masters} for at, masters in changes]


def test_a_master_is_unreachable_while_a_fault_cuts_it_off_and_for_a_while_after() -> None:
    faults = [
        fault(0, "isolate", 10.0, 20.0, [3], groups=[[3], [1, 2, 0]], minority=[3]),
        fault(1, "kill-majority", 40.0, 50.0, [1, 3]),
    ]
    reach = Reachability(faults, views((0.0, MASTERS)))
    assert reach.why_not(1, 0, 5.0) == ""
    assert reach.why_not(1, 0, 12.0) == "n1 cut from its master n3: fault 0 (isolate)"
    assert reach.why_not(3, 0, 12.0) == ""  # n3's own edge reaches n3
    assert reach.why_not(1, 0, 29.0) != ""  # links back within 10 s of the heal
    assert reach.why_not(1, 0, 31.0) == ""
    assert reach.why_not(2, 1, 45.0) == "its master n1 down: fault 1 (kill-majority)"
    assert reach.why_not(2, 5, 45.0) == ""  # n2 masters it
    # A view without a master for the partition, and one that moved it while n3 could not see.
    moved = views((0.0, MASTERS), (11.0, ["n1", "", *MASTERS[2:]]))
    reach = Reachability(faults, moved)
    assert reach.why_not(2, 1, 12.0) == "the view names no master"
    assert reach.why_not(3, 0, 12.0) == "n3 cut from its master n1: fault 0 (isolate)"
    blind = [fault(0, "cut-agreement", 10.0, 20.0, [3], one_way=[(3, 0), (0, 3)])]
    reach = Reachability(blind, moved)
    assert reach.why_not(3, 0, 12.0) == (
        "n3 cut from the view that made n1 its master: fault 0 (cut-agreement)"
    )
    assert reach.why_not(2, 0, 12.0) == ""
    # A master without the agreement server may wait for an in-sync change (seed 4051).
    away = [
        fault(0, "agreement-restart", 10.0, 20.0, []),
        fault(1, "cut-agreement", 40.0, 50.0, [3], one_way=[(3, 0), (0, 3)]),
    ]
    reach = Reachability(away, views((0.0, MASTERS)))
    assert reach.why_not(2, 1, 15.0) == (
        "its master n1 without the agreement server: fault 0 (agreement-restart)"
    )
    assert reach.why_not(2, 0, 45.0) == (
        "its master n3 without the agreement server: fault 1 (cut-agreement)"
    )
    assert reach.why_not(2, 1, 45.0) == ""  # n1 keeps the agreement server
    # Without recorded masters nothing can be told: reachable.
    assert Reachability(faults, [{"at": 0.0}]).why_not(1, 0, 12.0) == ""


def test_own_cuts_and_plain_rules_in_the_reachability_of_masters() -> None:
    own = [fault(0, "intra-node", 10.0, 20.0, [3], own=["partition"])]
    reach = Reachability(own, views((0.0, MASTERS)))
    assert reach.why_not(3, 0, 15.0) == (
        "n3's edge cut from its own partition service: fault 0 (intra-node)"
    )
    assert reach.why_not(1, 0, 15.0) == ""
    # n3 cannot hear (nodes only): others cannot reach n3's servers, n3 reaches theirs.
    hear = [fault(0, "plain-cut", 10.0, 20.0, [3], plain=[(1, 3), (2, 3), (0, 3)])]
    reach = Reachability(hear, views((0.0, MASTERS)))
    assert (
        reach.why_not(1, 0, 15.0) == "plain rules between n1 and its master n3: fault 0 (plain-cut)"
    )
    assert reach.why_not(3, 1, 15.0) == ""
    assert reach.why_not(3, 0, 15.0) == ""
    # n3 cannot send, 127.0.0.1 included: nobody reaches n3's servers, n3 itself neither.
    send = [fault(0, "plain-cut", 10.0, 20.0, [3], plain=[(3, 1), (3, 2), (3, 0), (3, -1)])]
    reach = Reachability(send, views((0.0, MASTERS)))
    assert reach.why_not(3, 0, 15.0) != ""
    assert reach.why_not(1, 0, 15.0) != ""
    assert reach.why_not(3, 1, 15.0) != ""
    assert reach.why_not(1, 1, 15.0) == ""


def test_plain_rules_stop_what_a_node_opens_and_its_servers_replies() -> None:
    assert plain_blocks({(1, 2)}, 1, 2)
    assert not plain_blocks({(1, 2)}, 2, 1)  # n2's connections to n1 carry on
    assert plain_blocks({(1, -1)}, 2, 1)  # n1's replies to n2 reach INPUT as to 127.0.0.1
    assert plain_blocks({(1, -1)}, 1, 1)
    assert not plain_blocks({(-1, 1)}, 2, 1)  # only the clients' packets to n1 stop


def server_busy(client: str, host: str, started: float, ended: float, p: int) -> Connection:
    c = conn(client, host, started, ended, "server")
    c.code = 0x89
    c.reason = (
        f"DISCONNECT Server busy: partition {p} of this session had no reachable master for "
        "30 s: the link to its master n3 is down; connect again"
    )
    return c


def test_an_unreachable_disconnect_is_accepted_only_after_the_bound_without_a_master() -> None:
    # kill-majority on 3 nodes whose restart took 60 s: n2's clients of n3's partitions wait.
    faults = [fault(0, "kill-majority", 10.0, 70.0, [1, 3])]
    result = clean_result(faults=faults, views={"changes": views((0.0, MASTERS))})
    busy = server_busy("s2-x-n2", N2, 1.0, 41.5, 0)
    verdict = judge(result, [busy], [], 0.0, 10.0)
    assert verdict["ok"], verdict
    (end,) = verdict["unreachable_disconnects"]
    assert end["accepted"]
    assert end["unreachable_s"] >= 31.0
    assert end["why"] == "its master n3 down: fault 0 (kill-majority)"
    assert verdict["warnings"] == [
        "1 connection(s) ended past --unreachable-disconnect (30 s): accepted, their session's "
        "partition had no master reachable from their node for that long (G9)"
    ]
    # Ended 15 s into it: its master had not been unreachable for 30 s.
    early = server_busy("s2-x-n2", N2, 1.0, 25.0, 0)
    verdict = judge(result, [early], [], 0.0, 10.0)
    assert verdict["failures"] == [
        "1 client(s) disconnected unexpectedly",
        "1 connection(s) ended as if their master were unreachable for 30 s, though it was "
        "reachable from their node for part of that time (G9)",
    ]
    assert verdict["unexpected_disconnects"][0]["unreachable_s"] == 15.0
    # A 3.1.1 client is closed without a word: accepted on the same grounds, by its client id.
    quiet = conn("s1-x-n2", N2, 1.0, 41.5, "server")
    p = partition_of("s1-x-n2", 32)
    ok = judge(
        clean_result(faults=faults, views={"changes": views((0.0, ["n3"] * 32))}),
        [quiet],
        [],
        0.0,
        10.0,
        versions={"s1-x-n2": 4},
    )
    assert ok["ok"], ok
    assert ok["unreachable_disconnects"][0]["partition"] == p
    # ... and a 3.1.1 close the model does not explain is left to the other rules.
    assert judge(
        result, [conn("s1-x-n2", N2, 1.0, 5.0, "server")], [], 0.0, 10.0, versions={"s1-x-n2": 4}
    )["failures"] == ["1 client(s) disconnected unexpectedly"]


def arrivals_of(client: str, got: dict[str, float]) -> Arrivals:
    return Arrivals(client, dict(got), sorted(got.values()))


def silence_of(
    subscribers: list[Arrivals],
    connections: list[Connection],
    acked: list[tuple[float, str]],
    faults: list[dict[str, Any]],
    heals: list[tuple[str, float]] | None = None,
    end: float = 200.0,
) -> dict[str, Any]:
    return nothing_silent(
        heals if heals is not None else [(f"fault {f['index']}", f["end"]) for f in faults],
        subscribers,
        connections,
        acked,
        Reachability(faults, views((0.0, MASTERS))),
        partition_of=lambda cid: 0,  # every session in partition 0, mastered by n3
        t0=0.0,
        end=end,
    )


SPLIT = [fault(0, "isolate", 10.0, 30.0, [3], groups=[[3], [1, 2, 0]], minority=[3])]
# Published through n1 before, during and after the split, acknowledged at once.
ACKED = [(t, f"p:{i}") for i, t in enumerate([5.0, 12.0, 20.0, 29.0, 35.0], start=1)]


def test_a_subscriber_connected_through_a_heal_that_receives_nothing_after_it_is_silent() -> None:
    # The issue: on n1, its session mastered by n3 (cut off), it got p:1 and then nothing.
    stuck = arrivals_of("s", {"p:1": 5.1})
    found = silence_of([stuck], [conn("s", N1, 1.0, None)], ACKED, SPLIT)
    (silent,) = found["silent"]
    # Its deadline: 20 s after the heal at 30 (no later fault on its path).
    assert (silent["client_id"], silent["heal"], silent["deadline"]) == ("s", "fault 0", 50.0)
    assert (silent["owed"], silent["missing"], silent["received_in_between"]) == (3, 3, 0)
    assert silent["examples"] == ["p:2", "p:3", "p:4"]
    result = clean_result(faults=SPLIT, silence=found)
    assert judge(result, [], [], 0.0, 10.0)["failures"] == [
        "1 time(s) a subscriber stayed connected through a heal and was still missing messages "
        "acknowledged before it 20 s later (G9: nothing silent): s"
    ]


def test_a_subscriber_that_catches_up_in_time_or_was_disconnected_is_not_silent() -> None:
    caught_up = arrivals_of("a", {"p:1": 5.1, "p:2": 41.0, "p:3": 41.1, "p:4": 41.2})
    # Ended by the server (0x89) before its deadline: it reconnects and gets them there.
    ended = arrivals_of("b", {"p:1": 5.1, "p:2": 70.0, "p:3": 70.0, "p:4": 70.0})
    # Moved by the run (a client close) before its deadline: not judged for this heal.
    moved = arrivals_of("c", {"p:1": 5.1})
    # Taken over by the run (3.1.1: the server just closes the old connection).
    taken = arrivals_of("d", {"p:1": 5.1})
    connections = [
        conn("a", N1, 1.0, None),
        server_busy("b", N1, 1.0, 45.0, 0),
        conn("b", N2, 46.0, None),
        conn("c", N1, 1.0, 45.0, "client"),
        conn("c", N2, 45.5, None),
        conn("d", N1, 1.0, 40.0, "server"),
        conn("d", N3, 40.0, None, purpose="takeover"),
    ]
    found = silence_of([caught_up, ended, moved, taken], connections, ACKED, SPLIT)
    assert found["silent"] == []
    assert (found["judged"], found["caught_up"], found["disconnected"], found["moved"]) == (
        1,
        1,
        1,
        2,
    )
    # The records end 5 s after the heal: caught up by then, or not judged.
    early = silence_of([caught_up, moved], connections, ACKED, SPLIT, end=42.0)
    assert (early["judged"], early["caught_up"], early["silent"]) == (1, 1, [])
    assert found["longest_catch_up"] == {"seconds": 11.2, "client_id": "a", "heal": "fault 0"}


def test_a_later_fault_on_the_subscribers_path_stops_its_clock() -> None:
    # The split heals at 30; its master n3 is paused 45-55.
    faults = [*SPLIT, fault(1, "pause", 45.0, 55.0, [3])]
    late = arrivals_of("s", {"p:1": 5.1, **dict.fromkeys(["p:2", "p:3", "p:4", "p:5"], 59.0)})
    found = silence_of([late], [conn("s", N1, 1.0, None)], ACKED, faults)
    # 30-45 and 55-60 reachable: the deadline of the split's heal is 60, the pause's 75.
    assert found["silent"] == []
    assert (found["judged"], found["caught_up"]) == (2, 2)
    # A later fault off its path (n2's own services) does not stop the clock.
    elsewhere = [*SPLIT, fault(1, "intra-node", 45.0, 55.0, [2], own=["partition"])]
    found = silence_of([late], [conn("s", N1, 1.0, None)], ACKED, elsewhere)
    assert [(s["heal"], s["deadline"], s["arrived_later"]) for s in found["silent"]] == [
        ("fault 0", 50.0, 3)
    ]


def test_the_links_must_be_up_soon_after_the_final_heal() -> None:
    up = {"links_clear_s": 4.5, "waiting_clear_s": 6.0, "last": {}}
    assert links_problems(up) == []
    assert links_problems(None) == []
    down = {
        "links_clear_s": None,
        "waiting_clear_s": 30.5,
        "last": {"n1": {"down": ["edge edge n3"], "unanswered": []}, "n2": {"down": []}},
    }
    flapping = {**up, "down_again": {"n3 partition replication n1": 37, "n2 edge edge n3": 2}}
    assert links_problems(flapping) == [
        "links down again after they were all up after the final heal: n3 partition "
        "replication n1 (37 looks) (G9)"
    ]
    assert links_problems(down) == [
        "links not all up 10 s after the final heal (never; at the last look: "
        "{'n1': ['edge edge n3']}) (G9)",
        "connections still waiting for a master 20 s after the final heal (only 30.5 s) (G9)",
    ]


def test_an_overlap_across_a_plain_cut_or_an_own_cut_is_excused() -> None:
    plain = [fault(0, "plain-cut", 10.0, 20.0, [2], plain=[(2, -1), (-1, 2)])]
    across = [conn("s", N2, 1.0, 21.0, "takeover"), conn("s", N1, 12.0, None, purpose="takeover")]
    verdict = judge(clean_result(faults=plain), across, [], 0.0, 10.0)
    assert verdict["ok"], verdict
    assert verdict["g5_overlaps"][0]["excused"] == "n2 cut by plain rules, fault 0"


def test_an_overlap_begun_as_a_cut_heals_is_excused_until_the_links_are_back() -> None:
    # Seed 4047: n2's edge cut from its own services until 20 s; a takeover through n1 answered
    # at 20.1 s, by a master that had no link to n2's edge to kick the old connection through;
    # n2's edge closed it at 22 s, when its re-attach was answered "taken over".
    own = [fault(0, "intra-node", 10.0, 20.0, [2], own=[2])]
    healing = [conn("s", N2, 1.0, 22.0, "server"), conn("s", N1, 20.1, None, purpose="takeover")]
    verdict = judge(clean_result(faults=own), healing, [], 0.0, 10.0)
    assert verdict["ok"], verdict
    assert verdict["g5_overlaps"][0]["excused"] == (
        "n2 cut from its own services by fault 0 (begun 0.1 s after its heal, ended within 10 s)"
    )
    # Links are back within LINK_SLACK_S of the heal: an old connection still live after that,
    # or a second connection begun after that, is a failure.
    for late in (
        [conn("s", N2, 1.0, 31.0, "server"), conn("s", N1, 20.1, None, purpose="takeover")],
        [conn("s", N2, 1.0, 34.0, "server"), conn("s", N1, 30.5, None, purpose="takeover")],
    ):
        verdict = judge(clean_result(faults=own), late, [], 0.0, 10.0)
        assert "1 client id(s) with two live connections (G5)" in verdict["failures"], late


def test_a_long_cut_should_show_a_link_down_within_seconds() -> None:
    split = fault(0, "isolate", 10.0, 30.0, [3], groups=[[3], [1, 2, 0]], minority=[3])
    short = fault(1, "one-way", 40.0, 50.0, [2], one_way=[(2, 1), (2, 3)])
    shown = {"changes": [{"at": 22.0, "node": "n1", "down": ["edge edge n3"]}]}
    assert links_unshown([split, short], shown) == []
    late = {"changes": [{"at": 27.0, "node": "n1", "down": ["edge edge n3"]}]}
    assert links_unshown([split, short], late) == [
        "fault 0 (isolate): no link shown down within 16 s (G9)"
    ]
    at_the_node = {"changes": [{"at": 20.0, "node": "n3", "down": ["partition membership n3"]}]}
    assert links_unshown([split], at_the_node) == []
    assert links_unshown([split], None) == []


def test_a_restart_after_a_redis_kill_of_its_node_is_explained_any_other_is_a_failure() -> None:
    # Seed 4063: n2's partition service noticed its lost Redis 12 s after the fault healed.
    faults = [fault(0, "redis-kill", 40.0, 51.0, [2])]
    records = [
        {"node": 2, "at": 63.2, "exited": ["partition"], "start_failed": ""},
        {"node": 1, "at": 63.2, "exited": ["partition"], "start_failed": ""},  # not its Redis
        {"node": 2, "at": 120.0, "exited": ["partition"], "start_failed": ""},  # long after
        {"node": 2, "at": 45.0, "exited": ["edge"], "start_failed": ""},  # Redis explains no edge
    ]
    explained, unexplained = restarts(records, faults)
    assert explained == [
        "n2: partition exited, started again at 63.2 s (its Redis killed by fault 0)"
    ]
    assert unexplained == [
        "n1: partition exited, started again at 63.2 s, no fault explains it",
        "n2: partition exited, started again at 120.0 s, no fault explains it",
        "n2: edge exited, started again at 45.0 s, no fault explains it",
    ]
    verdict = judge(clean_result(faults=faults, restarts=records[:1]), [], [], 0.0, 10.0)
    assert verdict["ok"], verdict
    assert explained[0] in verdict["warnings"]
    verdict = judge(clean_result(faults=faults, restarts=records[1:2]), [], [], 0.0, 10.0)
    assert unexplained[0] in verdict["failures"]


def test_replicas_compared_only_once_the_cluster_settled_again() -> None:
    settled = {"converged": True, "seconds": 1.0, "reason": "", "view_epoch": 160}
    verdict = judge(clean_result(settled=settled), [], [], 0.0, 10.0)
    assert verdict["ok"], verdict
    assert (
        "the view moved on after convergence (view 140, then 160 when the replicas were compared)"
        in verdict["warnings"]
    )
    unsettled = {**settled, "converged": False, "reason": "n3's agent is on view 158, not 160"}
    assert judge(clean_result(settled=unsettled), [], [], 0.0, 10.0)["failures"] == [
        "not converged again before the replicas were compared: n3's agent is on view 158, not 160"
    ]
