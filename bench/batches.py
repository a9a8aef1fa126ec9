"""The batching stages' counters over a run (hexmq_batches_total and its siblings, per stage,
from every service's /metrics): batches per stage, and what issue 28 counts per publish, gRPC
stream messages and Redis transactions. bench.cli's runs read them around every hexmq run
(Bench), so both the saturated suite and bench.moderate report them."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from typing import Any

from bench.brokers import LOOPBACK

_BATCH_LINE = re.compile(
    r'^hexmq_(batches|batched_items|batch_linger_seconds)_total\{stage="([a-z_]+)"\} (\S+)$'
)

# The stages whose batches are gRPC stream messages (edge link both ways, the replication feed
# and its acknowledgements), and those that are Redis transactions (issue 28 counts both).
STREAM_STAGES = ("edge_link", "partition_link", "replication_feed", "replication_acks")
REDIS_STAGES = ("group_commit", "replica_write")


def batch_counters(ports: list[int]) -> dict[str, dict[str, float]]:
    """The hexmq_batch_* counters of every service, summed per stage (empty for a hexmq that
    has none: the baseline before pacing)."""
    totals: dict[str, dict[str, float]] = {}
    for port in ports:
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}/metrics", timeout=5) as reply:
                text = reply.read().decode()
        except OSError:
            continue
        for line in text.splitlines():
            m = _BATCH_LINE.match(line)
            if m:
                kind, stage, value = m.groups()
                stage_totals = totals.setdefault(stage, {})
                stage_totals[kind] = stage_totals.get(kind, 0.0) + float(value)
    return totals


def batching(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Per stage over a run: batches sent, items per batch, and the mean wait per batch."""
    out: dict[str, Any] = {}
    for stage, end in sorted(after.items()):
        start = before.get(stage, {})
        batches = end.get("batches", 0.0) - start.get("batches", 0.0)
        if batches <= 0:
            continue
        items = end.get("batched_items", 0.0) - start.get("batched_items", 0.0)
        waited = end.get("batch_linger_seconds", 0.0) - start.get("batch_linger_seconds", 0.0)
        out[stage] = {
            "batches": int(batches),
            "items_per_batch": round(items / batches, 2),
            "linger_us_per_batch": round(waited / batches * 1e6, 1),
        }
    return out


def per_publish(run: dict[str, Any]) -> dict[str, float] | None:
    """gRPC stream messages and Redis transactions per message published over a run (the
    counters cover the whole run: warm-up, window and drain, as `sent` does); None without
    batching counters or publishes."""
    stages, sent = run.get("batching"), run.get("sent")
    if not stages or not sent:
        return None
    streams = sum(stages.get(stage, {}).get("batches", 0) for stage in STREAM_STAGES)
    redis = sum(stages.get(stage, {}).get("batches", 0) for stage in REDIS_STAGES)
    return {
        "stream_messages": round(streams / sent, 2),
        "redis_transactions": round(redis / sent, 2),
    }


def describe(run: dict[str, Any], name: str) -> list[str]:
    """A run's batches per stage and, where it published, per publish: the lines both suites
    print under their tables."""
    stages = ", ".join(
        f"{stage} {b['items_per_batch']:.1f}/batch ({b['batches']:,} batches, "
        f"{b['linger_us_per_batch']:.0f} us wait)"
        for stage, b in run["batching"].items()
    )
    lines = [f"  {name}: {stages}"]
    each = per_publish(run)
    if each is not None:
        lines.append(
            f"    per publish: {each['stream_messages']:.2f} gRPC stream messages, "
            f"{each['redis_transactions']:.2f} Redis transactions"
        )
    return lines


def print_batching(runs: list[dict[str, Any]], name: Callable[[dict[str, Any]], str]) -> None:
    """The batching lines of every run that has counters; `name(run)` says which run."""
    batched = [r for r in runs if r.get("batching")]
    if not batched:
        return
    print()
    print("batches per stage over each run (whole run: warm-up, window, drain):")
    for run in batched:
        for line in describe(run, name(run)):
            print(line)
