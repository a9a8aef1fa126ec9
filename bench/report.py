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
        "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
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
                run["broker"],
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
    headers = ["scenario", "mode", "", "throughput", "p50", "p99"]
    rows = []
    for r in ratios:

        def fmt(x: float | None) -> str:
            return "-" if x is None else f"{x:.2f}x"

        rows.append(
            [
                r["scenario"],
                r["mode"],
                "",
                fmt(r.get("throughput")),
                fmt(r.get("p50")),
                fmt(r.get("p99")),
            ]
        )
    return _table(headers, rows)


def write_json(doc: dict[str, Any], path: Path | None) -> Path:
    if path is None:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        commit = doc.get("machine", {}).get("hexmq_commit", "unknown")[:10]
        path = RESULTS_DIR / f"{stamp}-{commit}.json"
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
        f"delivered {run['delivered_unique']:,}/{run['sent']:,}, lost {run['lost']}, "
        f"dup {run['duplicates']}",
        file=sys.stderr,
    )


def print_summary(doc: dict[str, Any], path: Path) -> None:
    m = doc["machine"]
    c = doc["config"]
    print()
    print(
        f"hexmq {m['hexmq_commit'][:10]}{' (dirty tree)' if m['hexmq_tree_dirty'] else ''} | "
        f"{m['nproc']} CPUs ({m['cpu_model']}) | Python {m['python']} | "
        f"load avg before {m['loadavg_before'][0]}, after {m['loadavg_after'][0]}"
    )
    print(
        f"fan-in: {c['publishers']} publishers -> 1 subscriber on a '+' wildcard, "
        f"{c['payload_bytes']}-byte payloads, MQTT level {c['mqtt_protocol_level']}; warm-up "
        f"{c['warmup_s']:g} s, window {c['window_s']:g} s; QoS 1 window "
        f"{c['qos1_inflight_per_publisher']} per publisher; {c['generator_processes']} generator "
        f"process(es)"
    )
    print(
        "saturated: each publisher keeps at most the window outstanding (QoS 1: unacknowledged; "
        "QoS 0: not yet seen by the subscriber), latency includes queueing. paced: open loop at "
        "target/s (the latency figure). flood: QoS 0 with no window.\n"
        "offered/s: sent by the publishers in the window; deliv/s: received by the subscriber "
        "in the window. lost: QoS 1 acknowledged but never delivered; QoS 0 not delivered.\n"
        "cpu: % of one core during the window; 'other' is everything else on the machine "
        "(other people's work): above ~25% the figures are disturbed."
    )
    print()
    ok = [r for r in doc["runs"] if not r.get("error")]
    if ok:
        print(runs_table(ok))
    for r in doc["runs"]:
        if r.get("error"):
            print(f"FAILED {r['broker']} {r['scenario']} {r['mode']}: {r['error']}")
        for f in r.get("failures", []):
            print(f"client failure in {r['broker']} {r['scenario']} {r['mode']}: {f}")
        if r.get("drain_timed_out") and r.get("qos"):
            print(
                f"note: {r['broker']} {r['scenario']} {r['mode']}: deliveries still missing after "
                f"the {r['drain_s']:g} s drain; 'lost' counts them (raise --drain-timeout to tell "
                "a backlog from a loss)"
            )
    if doc["ratios"]:
        print()
        print("hexmq / mosquitto (throughput: higher is better for hexmq; latency: lower is)")
        print(ratios_table(doc["ratios"]))
    for name, info in doc["brokers"].items():
        for log, found in info["findings"].items():
            print(f"\n{name} log {log}: {found['count']} warning/error line(s), first:")
            for line in found["first"]:
                print(f"    {line}")
    print(f"\nresults: {path}")
