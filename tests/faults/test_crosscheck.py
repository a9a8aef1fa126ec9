"""The trace cross-check's rules (tests/faults/crosscheck.py) on hand-made rows."""

from __future__ import annotations

from typing import Any

from tests.faults.crosscheck import deliveries_agree, failovers_agree, losses_agree


def h(name: str) -> str:
    return f"#{name}"


def publish(trace: str, who: str, at: int) -> dict[str, Any]:
    return {"trace_id": trace, "client_id_hash": h(who), "publish_ns": at}


def delivery(
    trace: str,
    sub: str,
    *,
    delivered: bool = True,
    lost: bool = False,
    dup: bool = False,
    qos: int = 1,
) -> dict[str, Any]:
    return {
        "trace_id": trace,
        "subscriber_hash": h(sub),
        "delivered_ns": 1 if delivered else None,
        "lost": lost,
        "duplicated": dup,
        "qos": qos,
    }


MESSAGES = [publish("t2", "p", 20), publish("t1", "p", 10), publish("x", "other", 5)]


def test_matching_publishes_and_deliveries_agree() -> None:
    problems, counts = deliveries_agree(
        {"p": 2},
        {"p": [1, 2]},
        {"s": ["p:1", "p:2", "p:2"]},
        MESSAGES,
        [delivery("t1", "s"), delivery("t2", "s", dup=True)],
        h,
    )
    assert problems == []
    assert counts == {
        "publish_traces": 2,
        "delivered_audit": 2,
        "delivered_clients": 2,
        "duplicated_audit": 1,
        "duplicated_clients": 1,
    }


def test_every_disagreement_is_named() -> None:
    problems, _ = deliveries_agree(
        {"p": 3},  # three sent, two publish spans
        {"p": [1, 2]},
        {"s": ["p:1", "p:1"], "u": ["p:2"]},
        MESSAGES,
        [
            delivery("t2", "s"),  # s never got p:2
            delivery("t1", "u", delivered=False, lost=True),  # acknowledged, lost in the audit
            delivery("t2", "u", qos=2, dup=True),
        ],
        h,
    )
    assert problems == [
        "p: 2 publish spans for 3 messages sent",
        "1 deliveries without a deliver span: [('s', 'p:1')]",
        "1 audited deliveries no client got: [('s', 'p:2')]",
        "the audit loses 1 acknowledged: [('u', 'p:1')]",
        "the audit duplicates 1 at QoS 2: [('u', 'p:2')]",
        "duplicates the audit does not show: [('s', 'p:1')]",
    ]


def change(
    epoch: int,
    moves: list[tuple[int, int, str, str, str]],
    lost: list[str] | None = None,
    at: float = 1.0,
) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "lost": lost or [],
        "at": at,
        "moves": [
            {"partition": p, "epoch": e, "from": a, "to": b, "kind": k} for p, e, a, b, k in moves
        ],
    }


def span(view: int, p: int, epoch: int, old: str, new: str) -> dict[str, Any]:
    return {
        "view_epoch": view,
        "partition": p,
        "new_epoch": epoch,
        "old_master": old,
        "new_master": new,
    }


def test_failover_spans_against_the_views() -> None:
    changes = [
        change(2, [(0, 2, "n1", "n2", "failover"), (1, 2, "n1", "n3", "failover")], ["n1"]),
        change(3, [(0, 3, "n2", "n3", "handover")]),
        change(4, [(0, 4, "n3", "n1", "handover")]),
    ]
    ok, counts = failovers_agree(
        changes,
        [],
        [
            span(2, 0, 2, "n1", "n2"),
            span(2, 1, 2, "n1", "n3"),
            span(4, 0, 4, "n3", "n1"),
            span(9, 5, 9, "n1", "n2"),  # after the last recorded view (the run's `down`)
        ],
    )
    # p0's handover at 3 never served: p0 moved again at 4 first.
    assert ok == []
    assert counts == {"view_moves": 4, "failover_spans": 3, "moves_superseded_before_serving": 1}
    bad, _ = failovers_agree(
        changes,
        [],
        [span(4, 0, 2, "n1", "n2"), span(3, 1, 3, "n1", "n2"), span(4, 0, 4, "n3", "n1")],
    )
    assert bad == [
        "failover (0, 2, 'n1', 'n2') filed under view 4, made by 2",
        "a failover span no view made: (1, 3, 'n1', 'n2')",
        "changes of master without a failover span: [(1, 2, 'n1', 'n3')]",
    ]


def test_a_span_of_a_view_the_recorder_missed_serves_the_change_the_next_view_shows() -> None:
    """splits-3-nodes at 4d79d9f: the recorder saw views 39 and 43, not 40-42; view 43's diff
    carried p0's move made at epoch 40, whose span (filed under view 40) must count for it."""
    changes = [change(43, [(0, 40, "n3", "n1", "handover"), (9, 43, "n2", "n1", "handover")])]
    spans = [span(40, 0, 40, "n3", "n1"), span(43, 9, 43, "n2", "n1")]
    ok, _ = failovers_agree(changes, [40, 41, 42], spans)
    assert ok == []
    # Without the span, the change is still reported.
    bad, _ = failovers_agree(changes, [40, 41, 42], spans[1:])
    assert bad == ["changes of master without a failover span: [(0, 40, 'n3', 'n1')]"]


def test_losses_match_the_views_and_their_doubt_fits_the_fault() -> None:
    t0 = 1_000_000_000_000
    result = {
        "t0_wall_ns": t0,
        "views": {"changes": [change(1, []), change(2, [], ["n2"], at=12.0), change(3, [])]},
        "faults": [{"start": 10.0}],
    }
    s = 1_000_000_000
    fits = {
        "view_epoch": 2,
        "node_lost": "n2",
        "detected_ns": t0 + 11 * s,
        "installed_ns": t0 + 12 * s,
    }
    assert losses_agree(result, [fits])[0] == []
    spurious = {"view_epoch": 3, "node_lost": "n2", "detected_ns": t0, "installed_ns": t0}
    assert losses_agree(result, [fits, spurious])[0] == [
        "nodes lost by view epoch: the views say {2: {'n2'}}, the job says {2: {'n2'}, 3: {'n2'}}"
    ]
    late_agent = {**fits, "installed_ns": t0 + 20 * s}  # an agent that was cut off
    assert losses_agree(result, [late_agent])[0] == []
    early = {**fits, "detected_ns": t0 + 5 * s}
    assert losses_agree(result, [early])[0] == [
        "view 2: first doubt 5.00 s does not fit the fault (10.00 s) and the view (12.00 s)"
    ]
    after = {**fits, "detected_ns": t0 + 13 * s, "installed_ns": t0 + 13 * s}
    assert losses_agree(result, [after])[0] == [
        "view 2: first doubt 13.00 s does not fit the fault (10.00 s) and the view (12.00 s)"
    ]
