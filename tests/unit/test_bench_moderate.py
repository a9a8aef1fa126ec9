"""The moderate-load benchmark's own arithmetic (bench/moderate.py, bench/shapes.py,
bench/batches.py): where clients go, what a run's figures derive to, and how the batching
counters read."""

from __future__ import annotations

import argparse

import pytest

from bench import moderate
from bench.batches import batching, per_publish
from bench.shapes import layout


def test_split_pairs_put_every_publisher_on_node_1_and_every_subscriber_on_node_2() -> None:
    plan = layout("split", 20, [1883, 1884, 1885], "bench/r1")
    assert {p["port"] for p in plan.publishers} == {1883}
    assert {s["port"] for s in plan.subscribers} == {1884}
    assert [s["publishers"] for s in plan.subscribers] == [[i] for i in range(20)]
    assert plan.deliveries_per_publish == 1
    one = layout("split", 3, [1883], "bench/r1")
    assert {c["port"] for c in [*one.publishers, *one.subscribers]} == {1883}


def run(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {
        "rate": 5000,
        "delivered_per_s": 5000.0,
        "offered_per_s": 5000.0,
        "drain_s": 0.01,
        "drain_timed_out": False,
        "cpu": {"broker_pct": 50.0},
    }
    base.update(fields)
    return base


def test_deliveries_per_cpu_second_count_every_process_of_the_broker() -> None:
    derived = moderate.derive(run(), "3n-rf3")
    assert derived["topology"] == "3n-rf3"
    assert derived["deliveries_per_cpu_s"] == 10000.0  # 5,000/s on half a core
    assert derived["behind"] is False
    assert moderate.derive(run(cpu={"broker_pct": 0.0}), "1n")["deliveries_per_cpu_s"] is None


@pytest.mark.parametrize(
    "fields",
    [
        # Held back at the window: the publishers sent what they could, short of the rate.
        {"delivered_per_s": 3000.0, "offered_per_s": 3000.0},
        {"drain_s": 2.5},
        {"drain_timed_out": True},
    ],
)
def test_a_run_short_of_its_rate_or_with_a_backlog_fell_behind(fields: dict[str, object]) -> None:
    assert moderate.derive(run(**fields), "1n")["behind"] is True


def test_batching_is_the_difference_of_the_counters_per_stage() -> None:
    before = {"edge_link": {"batches": 10.0, "batched_items": 40.0, "batch_linger_seconds": 0.01}}
    after = {
        "edge_link": {"batches": 110.0, "batched_items": 540.0, "batch_linger_seconds": 0.03},
        "group_commit": {"batches": 5.0, "batched_items": 50.0},
        "idle": {"batches": 0.0},
    }
    assert batching(before, after) == {
        "edge_link": {"batches": 100, "items_per_batch": 5.0, "linger_us_per_batch": 200.0},
        "group_commit": {"batches": 5, "items_per_batch": 10.0, "linger_us_per_batch": 0.0},
    }


def test_per_publish_counts_stream_messages_and_redis_transactions_over_what_was_sent() -> None:
    batches = {
        "edge_link": 200,
        "partition_link": 300,
        "replication_feed": 400,
        "replication_acks": 400,
        "group_commit": 300,
        "replica_write": 300,
    }
    run = {"sent": 100, "batching": {stage: {"batches": n} for stage, n in batches.items()}}
    assert per_publish(run) == {"stream_messages": 13.0, "redis_transactions": 6.0}
    assert per_publish({"sent": 100}) is None  # (mosquitto, or a hexmq without them)
    assert per_publish({"sent": 0, "batching": run["batching"]}) is None


def test_the_options_parse_and_bad_ones_are_refused() -> None:
    args = moderate.build_parser().parse_args(
        ["--topologies", "1n,3n-rf3", "--rates", "1000,5000", "--profile", "3n-rf3@5000"]
    )
    assert args.topologies == ["1n", "3n-rf3"]
    assert args.rates == [1000, 5000]
    assert args.profile == [("3n-rf3", 5000)]
    for bad in (["--topologies", "5n"], ["--rates", "0"], ["--profile", "3n-rf3"]):
        with pytest.raises((SystemExit, argparse.ArgumentTypeError)):
            moderate.build_parser().parse_args(bad)


def test_the_memory_table_shows_the_fresh_and_the_warm_figure() -> None:
    doc = {
        "memory": {
            "hexmq": {
                "connections": 1000,
                "fresh": {"mib_per_1000": {"edge": 3.29, "redis": 0.4}},
                "again": {"mib_per_1000": {"edge": 1.02, "redis": None}},
            },
            # A result file from before the second wave: its one figure, no warm one.
            "old": {"connections": 1000, "mib_per_1000": {"edge": 3.57}},
            "broken": {"connections": 1000, "error": "refused"},
        }
    }
    headers, rows = moderate.memory_rows(doc)
    assert headers[-2:] == ["MiB per 1,000 fresh", "again (warm)"]
    assert rows == [
        ["hexmq", "1,000", "edge", "3.29", "1.02"],
        ["hexmq", "1,000", "redis", "0.40", "-"],
        ["old", "1,000", "edge", "3.57", "-"],
        ["broken", "1000", "failed", "refused", ""],
    ]


def test_each_topology_also_runs_colocated_as_hexmq_colo_unless_told_not_to() -> None:
    args = moderate.build_parser().parse_args(["--topologies", "3n-rf3", "--no-plain"])
    suite = moderate.ModerateSuite(args, {"machine": {}, "runs": []}, "stem")
    variants = suite.hexmqs(3, 3)
    assert [(h.name, h.colocated, h.insecure) for h in variants] == [
        ("hexmq", False, False),
        ("hexmq-colo", True, False),
    ]
    args = moderate.build_parser().parse_args(["--no-plain", "--no-colocated"])
    suite = moderate.ModerateSuite(args, {"machine": {}, "runs": []}, "stem")
    assert [h.name for h in suite.hexmqs(1, 1)] == ["hexmq"]
