"""What a run reports: machine facts, the stdout tables and the JSON file under bench/results/."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.batches import per_publish
from bench.stats import DISTURBED_PCT

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, cwd=REPO, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def machine_facts() -> dict[str, Any]:
    commit = _run("git", "rev-parse", "HEAD")
    # Uncommitted changes: the figures belong to the tree as it was, not exactly to `commit`.
    dirty = bool(_run("git", "status", "--porcelain"))
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": _cpu_model(),
        "mem_total_gib": _mem_total_gib(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "hexmq_commit": commit or "unknown",
        "hexmq_tree_dirty": dirty,
        "redis_server": _run("redis-server", "--version"),
        "loadavg_before": loadavg(),
        "started_utc": utc_now(),
    }


def _ms(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us / 1000:.2f}" if us < 100_000 else f"{us / 1000:.0f}"


def _count(n: float | None) -> str:
    return "-" if n is None else f"{n:,.0f}"


def _table(headers: list[str], rows: list[list[str]]) -> str:
    """Fixed-width columns: the first three (names) left-aligned, the figures right-aligned."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    head = line(headers)
    return "\n".join([head, "-" * len(head), *(line(r) for r in rows)])


def runs_table(runs: list[dict[str, Any]]) -> str:
    headers = [
        "broker",
        "scenario",
        "mode",
        "target/s",
        "offered/s",
        "deliv/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "deliv %",
        "lost",
        "dup",
        "cpu broker",
        "cpu gen",
        "cpu other",
    ]
    rows = []
    for run in runs:
        lat = run.get("latency", {})
        cpu = run.get("cpu", {})
        rows.append(
            [
                run.get("label", run["broker"]),
                run["scenario"],
                run["mode"],
                _count(run.get("rate")),
                _count(run.get("offered_per_s")),
                _count(run.get("delivered_per_s")),
                _ms(lat.get("p50_us")),
                _ms(lat.get("p99_us")),
                _ms(lat.get("max_us")),
                "-"
                if run.get("delivered_fraction") is None
                else f"{run['delivered_fraction'] * 100:.2f}",
                str(run.get("lost", "-")),
                str(run.get("duplicates", "-")),
                f"{cpu.get('broker_pct', 0):.0f}%",
                f"{cpu.get('generator_pct', 0):.0f}%",
                f"{cpu.get('others_pct', 0):.0f}%",
            ]
        )
    return _table(headers, rows)


def ratios_table(ratios: list[dict[str, Any]]) -> str:
    headers = ["scenario", "mode", "broker", "throughput", "p50", "p99"]
    ratios = sorted(ratios, key=lambda r: (r["scenario"], r["mode"] != "saturated"))
    rows = []
    for r in ratios:

        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}x"

        rows.append(
            [
                r["scenario"],
                r["mode"],
                r.get("label", "hexmq"),
                fmt(r.get("throughput")),
                fmt(r.get("p50")),
                fmt(r.get("p99")),
            ]
        )
    return _table(headers, rows)


def result_stem(machine: dict[str, Any]) -> str:
    """The name shared by a run's files under bench/results/: start time and commit."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{machine.get('hexmq_commit', 'unknown')[:10]}"


def write_json(doc: dict[str, Any], path: Path | None, stem: str) -> Path:
    if path is None:
        path = RESULTS_DIR / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def print_run(run: dict[str, Any]) -> None:
    if run.get("error"):
        return
    lat = run["latency"]
    print(
        f"bench:   {run['delivered_per_s']:,.0f} msg/s delivered, p50 "
        f"{lat.get('p50_us', 0) / 1000:.2f} ms, p99 {lat.get('p99_us', 0) / 1000:.2f} ms, "
        f"delivered {run['delivered_unique']:,}/{run.get('expected_deliveries', run['sent']):,}, "
        f"lost {run['lost']}, "
        f"dup {run['duplicates']}",
        file=sys.stderr,
    )


SHAPE_NAMES = {"fanin": "fan-in", "fanout": "fan-out", "pairs": "pairs"}


def _clients(run: dict[str, Any]) -> str:
    c = run.get("clients") or {}
    pubs, subs = c.get("publishers", 0), c.get("subscribers", 0)
    if run.get("shape") == "pairs":
        return f"{pubs} x 1->1"
    return f"{pubs}->{subs}"


def cluster_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The cluster suite: per shape, each replication factor and mosquitto, saturated and
    paced side by side, with the ratio to mosquitto after each figure."""
    runs = [r for r in doc["runs"] if r.get("suite") == "cluster" and not r.get("error")]
    by_key = {(r["shape"], r["label"], r["mode"]): r for r in runs}
    ratios = {
        (r["shape"], r["label"], r["mode"]): r for r in doc["ratios"] if r["suite"] == "cluster"
    }
    # Each replication factor's hexmqs together (hexmq, hexmq-2e, -base, -colo, -plain), then
    # mosquitto.
    rf = {r["label"]: r.get("rf") or 0 for r in runs}
    labels = sorted(rf, key=lambda label: (label == "mosquitto", rf[label], label))
    headers = [
        "shape",
        "broker",
        "clients",
        "deliv/s",
        "x",
        "p50 ms",
        "x",
        "p99 ms",
        "x",
        "paced at/s",
        "p50 ms",
        "x",
        "p99 ms",
        "x",
        "lost",
        "cpu other",
    ]

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    rows = []
    for shape in SHAPE_NAMES:
        for label in labels:
            sat = by_key.get((shape, label, "saturated"))
            paced = by_key.get((shape, label, "paced"))
            if sat is None and paced is None:
                continue
            rs = ratios.get((shape, label, "saturated"), {})
            rp = ratios.get((shape, label, "paced"), {})
            s_lat = (sat or {}).get("latency", {})
            p_lat = (paced or {}).get("latency", {})
            both = [r for r in (sat, paced) if r is not None]
            rows.append(
                [
                    SHAPE_NAMES[shape],
                    label,
                    _clients(both[0]),
                    _count((sat or {}).get("delivered_per_s")),
                    fmt(rs.get("throughput")),
                    _ms(s_lat.get("p50_us")),
                    fmt(rs.get("p50")),
                    _ms(s_lat.get("p99_us")),
                    fmt(rs.get("p99")),
                    _count((paced or {}).get("rate")),
                    _ms(p_lat.get("p50_us")),
                    fmt(rp.get("p50")),
                    _ms(p_lat.get("p99_us")),
                    fmt(rp.get("p99")),
                    str(sum(r.get("lost", 0) for r in both)),
                    f"{max(r.get('cpu', {}).get('others_pct', 0) for r in both):.0f}%",
                ]
            )
    return headers, rows


def per_publish_rows(runs: list[dict[str, Any]]) -> list[list[str]]:
    """Per run with batching counters (a hexmq that has them): stream messages and Redis
    transactions per publish (bench.batches.per_publish)."""
    rows = []
    for run in runs:
        each = per_publish(run)
        if each is not None:
            rows.append(
                [
                    run.get("label", run["broker"]),
                    run["scenario"],
                    run["mode"],
                    f"{each['stream_messages']:.2f}",
                    f"{each['redis_transactions']:.2f}",
                ]
            )
    return rows


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cells) + " |"

    return "\n".join([line(headers), line(["---"] * len(headers)), *(line(r) for r in rows)])


def print_summary(doc: dict[str, Any], path: Path) -> None:
    m = doc["machine"]
    c = doc["config"]
    cc = c.get("cluster", {})
    print()
    print(
        f"hexmq {m['hexmq_commit'][:10]}{' (dirty tree)' if m['hexmq_tree_dirty'] else ''} | "
        f"{m['nproc']} CPUs ({m['cpu_model']}) | Python {m['python']} | "
        f"load avg before {m['loadavg_before'][0]}, after {m['loadavg_after'][0]}"
    )
    variants = []
    if c.get("colocated"):
        variants.append(
            "hexmq-colo: co-located, one hexmq node process per node (its cpu: that process, "
            "Redis and the agreement server)"
        )
    base = c.get("baseline_checkout")
    if base:
        variants.append(
            f"hexmq-base: {base['checkout']} at {base['commit'][:10]} ({base['python']})"
        )
    if variants:
        print("beside hexmq (a process per service): " + "; ".join(variants))
    runs = [r for r in doc["runs"] if not r.get("error")]
    single = [r for r in runs if r.get("suite", "single") == "single"]
    cluster = [r for r in runs if r.get("suite") == "cluster"]
    if single:
        print(
            f"single: one hexmq node; fan-in: {c['publishers']} publishers -> 1 subscriber on a "
            f"'+' wildcard, {c['payload_bytes']}-byte payloads, MQTT level "
            f"{c['mqtt_protocol_level']}; warm-up {c['warmup_s']:g} s, window {c['window_s']:g} s; "
            f"QoS 1 window {c['qos1_inflight_per_publisher']} per publisher; "
            f"{c['generator_processes']} generator process(es)"
        )
    if cluster:
        print(
            f"cluster: {cc['nodes']}-node hexmq clusters at rf {', '.join(map(str, cc['rf']))}; "
            f"QoS 1; fan-in {cc['fanin_publishers']} -> 1, fan-out 1 -> "
            f"{cc['fanout_subscribers']}, {cc['pairs']} pairs; clients round robin over the "
            f"nodes (mosquitto: its one port); warm-up {cc['warmup_s']:g} s, window "
            f"{cc['window_s']:g} s"
        )
    print(
        "saturated: each publisher keeps at most the window outstanding (QoS 1: unacknowledged; "
        "QoS 0: not yet seen by the subscriber), latency includes queueing. paced: open loop at "
        "target/s (the latency figure). flood: QoS 0 with no window.\n"
        "offered/s: sent by the publishers in the window; deliv/s: received by the subscribers "
        "in the window (fan-out: every copy). lost: QoS 1 acknowledged but never delivered; "
        "QoS 0 not delivered.\n"
        "cpu: % of one core during the window; 'other' is everything else on the machine "
        "(other people's work): above ~25% the figures are disturbed."
    )
    for title, chosen in (("single", single), ("cluster", cluster)):
        if chosen:
            print(f"\n{title}:")
            print(runs_table(chosen))
    for r in doc["runs"]:
        name = f"{r.get('label', r['broker'])} {r['scenario']} {r['mode']}"
        if r.get("error"):
            print(f"FAILED {name}: {r['error']}")
        for f in r.get("failures", []):
            print(f"client failure in {name}: {f}")
        if r.get("drain_timed_out") and r.get("qos"):
            print(
                f"note: {name}: deliveries still missing after the {r['drain_s']:g} s drain; "
                "'lost' counts them (raise --drain-timeout to tell a backlog from a loss)"
            )
    redone = [r for r in runs if r.get("disturbed_attempts")]
    disturbed = [r for r in runs if r.get("cpu", {}).get("others_pct", 0) > DISTURBED_PCT]
    if redone or disturbed:
        print(
            f"\n{len(redone)} run(s) redone after a disturbed attempt; {len(disturbed)} still "
            f"above {DISTURBED_PCT:g}% cpu other (read those with care)"
        )
    single_ratios = [r for r in doc["ratios"] if r.get("suite", "single") == "single"]
    if single_ratios:
        print()
        print("hexmq / mosquitto (throughput: higher is better for hexmq; latency: lower is)")
        print(ratios_table(single_ratios))
    if cluster:
        print()
        print(
            "cluster against mosquitto: x = hexmq / mosquitto (throughput: higher is better for "
            "hexmq; latency: lower is); paced at the same rate for every broker of a shape"
        )
        print(_table(*cluster_rows(doc)))
    each = per_publish_rows(runs)
    if each:
        print()
        print(
            "per publish over each run (warm-up, window and drain; from the batching stages' "
            "counters): gRPC stream messages (edge links, replication feed and acknowledgements) "
            "and Redis transactions (group commits, replica writes)"
        )
        print(_table(["broker", "scenario", "mode", "stream msgs", "redis tx"], each))
    profile = doc.get("profile")
    if profile:
        print()
        if "error" in profile:
            print(f"profile: unavailable: {profile['error']}")
        else:
            print(
                f"profile of {profile['broker']} node 1 in {profile['scenario']}: {profile['file']}"
            )
            for role, result in profile["processes"].items():
                if "error" in result:
                    print(f"  {role}: {result['error']}")
                    continue
                print(f"  {role} ({result['samples']} samples), self time:")
                for entry in result["self"][:8]:
                    print(f"    {entry['pct']:5.1f}%  {entry['function']}")
    print_findings(doc)
    print(f"\nresults: {path}")


def print_findings(doc: dict[str, Any]) -> None:
    """The warning and error lines found in the brokers' logs."""
    for name, info in doc["brokers"].items():
        for log, found in info["findings"].items():
            print(f"\n{name} log {log}: {found['count']} warning/error line(s), first:")
            for line in found["first"]:
                print(f"    {line}")


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.report FILE.json`: a results file's cluster table as Markdown."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m bench.report RESULTS.json", file=sys.stderr)
        return 2
    doc = json.loads(Path(args[0]).read_text())
    print(markdown_table(*cluster_rows(doc)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
