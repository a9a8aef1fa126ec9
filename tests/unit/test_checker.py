"""The workload checker's rules on hand-made histories (tests/support/checker.py): each rule
flags what it must and nothing else."""

from __future__ import annotations

import pytest

from tests.support.checker import ack_stats, check, check_shared, overlaps, retained_check
from tests.support.workload import Connection, Publisher, Subscriber


def publisher(
    name: str,
    sent: int,
    *,
    acked: list[int] | None = None,
    refused: list[int] | None = None,
) -> Publisher:
    """A publisher's record: `sent` messages, acknowledged ones at t = counter seconds."""
    pub = Publisher(name, 1883, f"t/{name}")
    pub.sent = sent
    pub.sent_at = {n: n - 0.1 for n in range(1, sent + 1)}
    pub.acked = {n: float(n) for n in (acked if acked is not None else range(1, sent + 1))}
    pub.refused = dict.fromkeys(refused or [], "Unspecified error")
    pub.unanswered = set(range(1, sent + 1)) - set(pub.acked) - set(pub.refused)
    return pub


def subscriber(name: str, got: list[str], qos: int = 1) -> Subscriber:
    sub = Subscriber(name, 1883, "t/#", qos=qos)
    sub.received = [(m, False, qos) for m in got]
    return sub


def test_a_clean_history_has_no_problems() -> None:
    pub = publisher("a", 3)
    report = check([pub], [subscriber("s", ["a:1", "a:2", "a:3"])])
    assert report.problems() == {}
    assert report.counts() == {
        "attempted": 3,
        "acknowledged": 3,
        "refused": 0,
        "delivered": 3,
        "lost": 0,
        "unexpected": 0,
        "duplicated_qos1": 0,
        "duplicated_qos2": 0,
        "recovered": 0,
        "order_violations": 0,
        "late_unanswered": 0,
        "refused_delivered": 0,
    }


def test_lost_unexpected_and_recovered() -> None:
    pub = publisher("a", 4, acked=[1, 2, 3])  # 4 sent, never answered
    report = check([pub], [subscriber("s", ["a:1", "a:3", "a:4", "b:1"])])
    assert report.lost == {"s": ["a:2"]}
    assert report.unexpected == {"s": ["b:1"]}
    assert report.recovered == 1  # a:4 arrived though never acknowledged: allowed
    assert set(report.problems()) == {"lost", "unexpected"}


def test_duplicates_are_counted_at_qos_1_and_an_error_at_qos_2() -> None:
    pub = publisher("a", 2)
    q1 = check([pub], [subscriber("s1", ["a:1", "a:1", "a:2"], qos=1)])
    assert q1.duplicates_qos1 == {"s1": ["a:1"]}
    assert q1.problems() == {}
    q2 = check([pub], [subscriber("s2", ["a:1", "a:2", "a:2"], qos=2)])
    assert q2.duplicates_qos2 == {"s2": ["a:2"]}
    assert set(q2.problems()) == {"QoS 2 duplicates"}


def test_an_answered_message_after_a_later_one_is_an_order_violation() -> None:
    pub = publisher("a", 3, acked=[1, 3], refused=[2])
    report = check([pub], [subscriber("s", ["a:1", "a:3", "a:2"])])
    assert report.order_violations == {"s": ["a:2 after a:3"]}
    assert report.refused_delivered == 1
    # A redelivery of an earlier message is a duplicate, not a violation.
    again = check([pub], [subscriber("s", ["a:1", "a:2", "a:3", "a:2"])])
    assert again.order_violations == {"s": []}


def test_an_unanswered_message_after_later_ones_is_late_not_a_violation() -> None:
    # a:2 was sent on a connection that broke before its answer; a:3 went on a new one.
    pub = publisher("a", 3, acked=[1, 3])
    report = check([pub], [subscriber("s", ["a:1", "a:3", "a:2"])])
    assert report.order_violations == {"s": []}
    assert report.late_unanswered == 1


def test_a_shared_group_needs_each_acknowledged_message_once_in_the_group() -> None:
    pub = publisher("a", 4)
    m1 = subscriber("m1", ["a:1", "a:3"], qos=2)
    m2 = subscriber("m2", ["a:2", "a:3"], qos=2)
    group = check_shared([pub], "g", [m1, m2])
    assert group.lost == ["a:4"]
    assert group.duplicates_qos2 == ["a:3"]
    assert group.delivered == 3
    assert group.order_violations == []
    disordered = check_shared([pub], "g", [subscriber("m", ["a:2", "a:1", "a:3", "a:4"])])
    assert disordered.order_violations == ["a:1 after a:2"]


def conn(client: str, port: int, started: float, ended: float | None) -> Connection:
    return Connection(client, "127.0.0.1", port, started, ended)


def test_overlapping_connections_of_one_client_id() -> None:
    history = [
        conn("c", 1, 0.0, 5.0),
        conn("c", 2, 5.0, 9.0),  # a move: the first ended as the second began
        conn("c", 3, 8.9, None),  # a takeover seen 0.1 s late on the client side
        conn("d", 1, 0.0, 20.0),
        conn("d", 2, 10.0, 12.0),  # two live connections for 2 s
    ]
    found = overlaps(history, end=30.0, tolerance=0.25)
    assert [(o.client_id, o.first, o.second, round(o.seconds, 3)) for o in found] == [
        ("d", "127.0.0.1:1", "127.0.0.1:2", 2.0)
    ]
    assert len(overlaps(history, end=30.0)) == 2  # without a tolerance the takeover counts


def test_ack_stats_find_the_longest_gap_from_the_start_to_the_end() -> None:
    a = publisher("a", 4, acked=[1, 2, 3, 4])  # acknowledged at t = 1, 2, 3, 4
    b = publisher("b", 0)
    b.acked = {1: 9.0}
    b.sent_at = {1: 8.5}
    b.sent = 1
    stats = ack_stats([a, b], start=0.0, end=10.0)
    assert stats.count == 5
    assert stats.longest_gap == pytest.approx(5.0)  # from 4 to 9
    assert stats.longest_gap_at == pytest.approx(4.0)
    assert stats.max == pytest.approx(0.5)
    assert ack_stats([a], start=0.0, end=20.0).longest_gap == pytest.approx(16.0)


def test_retained_convergence() -> None:
    writer = publisher("r", 3, acked=[1, 2])  # update 3 sent, its acknowledgement lost
    same = {"n1": {"ret/x": "r:3"}, "n2": {"ret/x": "r:3"}}
    assert retained_check({"ret/x": writer}, same).converged
    older = {"n1": {"ret/x": "r:1"}, "n2": {"ret/x": "r:1"}}
    stale = retained_check({"ret/x": writer}, older)
    assert not stale.converged
    assert stale.stale == {"ret/x": ("r:1", "r:2")}
    split = retained_check({"ret/x": writer}, {"n1": {"ret/x": "r:2"}, "n2": {}})
    assert split.diverged == {"ret/x": {"n1": "r:2", "n2": None}}
    assert not split.converged
