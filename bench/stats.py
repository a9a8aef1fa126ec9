"""Latency percentiles and CPU accounting from /proc: plain functions, no I/O beyond /proc."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# A run in whose window everything else on the machine took more than this (percent of one
# core, `others_pct`) is disturbed: read it with care, or redo it (--redo-disturbed).
DISTURBED_PCT = 25.0


def percentile(ordered: list[int], pct: float) -> int:
    """Nearest-rank percentile of an ascending list (no interpolation: a real sample)."""
    if not ordered:
        raise ValueError("no samples")
    rank = max(1, -(-len(ordered) * pct // 100))  # ceil(n * pct / 100), at least 1
    return ordered[int(rank) - 1]


def latency_summary(samples_ns: Iterable[int]) -> dict[str, Any]:
    """Count, mean, percentiles and max, in microseconds; ``{"count": 0}`` without samples."""
    ordered = sorted(samples_ns)
    if not ordered:
        return {"count": 0}
    summary: dict[str, Any] = {
        "count": len(ordered),
        "mean_us": round(sum(ordered) / len(ordered) / 1000, 1),
    }
    for pct in PERCENTILES:
        summary[f"p{pct:g}_us"] = round(percentile(ordered, pct) / 1000, 1)
    summary["max_us"] = round(ordered[-1] / 1000, 1)
    return summary


def process_ticks(pid: int) -> int | None:
    """User + system CPU time of a process so far, in clock ticks; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def machine_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from the first line of /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    # guest and guest_nice (fields 9, 10) are already counted in user and nice.
    total = sum(values[:8])
    return total - idle, total


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    at_ns: int
    processes: dict[str, int | None]
    machine_busy: int
    machine_total: int


def cpu_snapshot(pids: Mapping[str, int], at_ns: int) -> CpuSnapshot:
    busy, total = machine_ticks()
    return CpuSnapshot(at_ns, {name: process_ticks(pid) for name, pid in pids.items()}, busy, total)


def cpu_usage(before: CpuSnapshot, after: CpuSnapshot) -> dict[str, Any]:
    """CPU use between two snapshots, in percent of one core (100 = one core busy).

    ``machine_pct`` is the whole machine (200 = both cores busy on 2 cores); ``others_pct``
    is what the machine did besides the processes we track: other people's work, the kernel
    on our behalf (softirq for loopback TCP), and noise.
    """
    seconds = (after.at_ns - before.at_ns) / 1e9
    if seconds <= 0:
        return {}
    per_process: dict[str, float | None] = {}
    ours = 0.0
    for name, start in before.processes.items():
        end = after.processes.get(name)
        if start is None or end is None:
            per_process[name] = None
            continue
        pct = (end - start) / CLOCK_TICKS / seconds * 100
        per_process[name] = round(pct, 1)
        ours += pct
    machine = (after.machine_busy - before.machine_busy) / CLOCK_TICKS / seconds * 100
    return {
        "processes_pct": per_process,
        "machine_pct": round(machine, 1),
        "others_pct": round(max(0.0, machine - ours), 1),
    }
