"""What a SUBSCRIBE's retained messages cost as the retained store grows: `python -m
bench.retained` (`make bench-retained`; `make bench` runs it). Issue 25.

Two measures:

- **The index, in process.** The partition service's retained store (services/partition/
  retained.py, `RetainedMessages`) filled with N retained messages `ret/<group>/<k>` (10 per
  group, 32-byte payloads) for N = 1,000 ... 1,000,000, then the filters of a SUBSCRIBE
  matching 10 of them (`ret/<group>/+`), and one matching 1 (`ret/<group>/3`), answered as
  the RetainedQuery handler answers them: CPU per query, median of many. Beside it, the scan
  it replaced (every stored topic tested with topic_matches), up to 100,000 (at 1,000,000 one
  scan takes seconds; its figure is the 100,000 one times ten, marked so).
- **A real node** (`--cluster`, on by default): `hexmq cluster up --nodes 1`, N retained
  messages published (QoS 0), then 40 SUBSCRIBEs of `ret/<group>/+` each waiting for its 10
  retained messages: the partition service's CPU per SUBSCRIBE (from /proc), for N = 1,000
  and 50,000 (the issue's figure: 12 -> 237 ms before).

Results: bench/results/retained-<stamp>.json, and a table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
from typing import Any

from bench.attacks import store_retained, subscribe_cost
from bench.brokers import Hexmq
from bench.report import RESULTS_DIR, machine_facts, result_stem
from bench.stats import process_ticks
from hexmq.api.common.v1.common_pb2 import Message
from hexmq.topics import topic_matches
from services.partition.retained import RetainedMessages

SIZES = (1_000, 10_000, 100_000, 1_000_000)
SCAN_UP_TO = 100_000
MASTERED = range(256)


def fill(n: int) -> RetainedMessages:
    retained = RetainedMessages()
    for i in range(n):
        topic = f"ret/{i // 10}/{i % 10}"
        retained.put(i % 256, Message(topic=topic, payload=b"r" * 32, retain=True))
    return retained


def cpu_per_call(call: Any, filters_of: Any, rounds: int) -> float:
    """Median CPU (process time) per call, in microseconds."""
    samples = []
    for r in range(rounds):
        filters = filters_of(r)
        t0 = time.process_time_ns()
        found = call(filters)
        samples.append((time.process_time_ns() - t0) / 1000)
        assert found, filters
    return round(statistics.median(samples), 1)


def scan(retained: RetainedMessages, filters: list[str], now: int) -> list[Message]:
    """The query as it was before issue 25: every stored topic tested."""
    return [
        msg
        for topic, (p, msg) in retained.items()
        if p in MASTERED
        and not (msg.expires_at_ms and msg.expires_at_ms <= now)
        and any(topic_matches(f, topic) for f in filters)
    ]


def measure(n: int, now: int) -> dict[str, Any]:
    """One store of `n` retained messages: the index's CPU per query, and the old scan's."""
    retained = fill(n)
    gc.collect()
    groups = n // 10

    def query(filters: list[str]) -> list[Message]:
        return retained.match(filters, now, MASTERED)

    row: dict[str, Any] = {
        "stored": n,
        "index_us_match_10": cpu_per_call(query, lambda r: [f"ret/{(r * 7919) % groups}/+"], 2000),
        "index_us_match_1": cpu_per_call(query, lambda r: [f"ret/{(r * 7919) % groups}/3"], 2000),
    }
    if n <= SCAN_UP_TO:
        row["scan_us_match_10"] = cpu_per_call(
            lambda f: scan(retained, f, now),
            lambda r: [f"ret/{(r * 7919) % groups}/+"],
            max(5, 200_000 // n),
        )
    return row


def in_process(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    rows = []
    now = int(time.time() * 1000)
    for n in sizes:
        row = measure(n, now)
        gc.collect()
        rows.append(row)
        print(f"bench.retained: {row}", file=sys.stderr, flush=True)
    scanned = [r for r in rows if "scan_us_match_10" in r]
    if scanned:
        last_scan = scanned[-1]
        for row in rows:
            if "scan_us_match_10" not in row:
                # Linear in what is stored: the largest measured scan, scaled.
                factor = row["stored"] / last_scan["stored"]
                row["scan_us_match_10_extrapolated"] = round(last_scan["scan_us_match_10"] * factor)
    return rows


async def _on_cluster(broker: Hexmq, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    partition = broker.node_pids[0]["partition"]

    def cpu() -> int:
        return process_ticks(partition) or 0

    rows = []
    stored = 0
    for n in sizes:
        await store_retained(broker.ports[0], stored, n, payload=32, pause_s=0.01, settle_s=3)
        stored = n
        row = await subscribe_cost(broker.ports[0], n, cpu, wait_s=10, strict=True)
        print(f"bench.retained: node: {row}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def on_cluster(sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    broker = Hexmq(1, 1, settings={})
    broker.start()
    try:
        return asyncio.run(_on_cluster(broker, sizes))
    finally:
        broker.stop()
        broker.cleanup(keep=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.retained", description=__doc__)
    parser.add_argument(
        "--sizes",
        default=",".join(str(n) for n in SIZES),
        help="retained messages stored, in process (comma-separated)",
    )
    parser.add_argument(
        "--cluster-sizes",
        default="1000,50000",
        help="retained messages stored on a real node ('' skips it)",
    )
    args = parser.parse_args(argv)
    machine = machine_facts()
    sizes = tuple(int(s) for s in args.sizes.split(",") if s)
    cluster_sizes = tuple(int(s) for s in args.cluster_sizes.split(",") if s)
    doc: dict[str, Any] = {"machine": machine, "in_process": in_process(sizes)}
    if cluster_sizes:
        doc["node"] = on_cluster(cluster_sizes)
    path = RESULTS_DIR / f"retained-{result_stem(machine)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print("| stored | index, match 10 (us) | index, match 1 (us) | scan, match 10 (us) |")
    print("| ---: | ---: | ---: | ---: |")
    for row in doc["in_process"]:
        scanned = row.get("scan_us_match_10")
        scan_text = (
            f"{scanned:,.0f}"
            if scanned is not None
            else (f"~{row['scan_us_match_10_extrapolated']:,} (extrapolated)")
        )
        print(
            f"| {row['stored']:,} | {row['index_us_match_10']} | {row['index_us_match_1']} "
            f"| {scan_text} |"
        )
    for row in doc.get("node", []):
        print(
            f"node, {row['stored']:,} retained: {row['partition_cpu_ms_per_subscribe']} ms of "
            f"partition CPU, {row['wall_ms_per_subscribe']} ms wall per SUBSCRIBE"
        )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
