"""The latency plot of a fault run, drawn the way Jepsen draws its latency-raw plots: every
publish as a point (x: when it was sent, y: how long its acknowledgement took; refusals and
unanswered publishes marked apart), the faults as shaded bars across the top, and the longest
stretch without any acknowledgement marked."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: draw to a file
import matplotlib.pyplot as plt

from tests.support.workload import Publisher

COLORS = {1: "#1f77b4", 2: "#2ca02c"}
FAULT_COLORS = {
    "network": "#ff7f0e",
    "kill": "#d62728",
    "pause": "#9467bd",
    "agreement": "#8c564b",
    "redis": "#e377c2",
    "clock": "#17becf",
}


def fault_family(kind: str) -> str:
    if kind.startswith("kill"):
        return "kill"
    if kind in ("isolate", "halves", "ring", "cut-agreement", "one-way", "intra-node", "plain-cut"):
        return "network"
    return {"pause": "pause", "agreement-restart": "agreement", "redis-kill": "redis"}.get(
        kind, "clock"
    )


def draw(
    path: Path,
    *,
    title: str,
    publishers: Sequence[Publisher],
    t0: float,
    faults: Sequence[dict[str, Any]],
    gap: tuple[float, float],
    end: float,
) -> None:
    """`faults`: {"kind", "start", "end", "label"} in seconds after t0; `gap`: (start, length)
    of the longest stretch without an acknowledgement."""
    fig, ax = plt.subplots(figsize=(14, 6), dpi=100)
    top = 0.001
    for qos in (1, 2):
        xs, ys = [], []
        for p in publishers:
            if p.qos != qos:
                continue
            for n, acked in p.acked.items():
                xs.append(p.sent_at[n] - t0)
                ys.append(max(acked - p.sent_at[n], 0.0005))
        top = max([top, *ys])
        ax.scatter(xs, ys, s=3, c=COLORS[qos], label=f"QoS {qos} acknowledged", alpha=0.6)
    for marker, attr, label, color in (
        ("x", "refused", "refused (PUBACK/PUBREC >= 0x80)", "#d62728"),
        ("^", "unanswered", "unanswered (connection ended)", "#ff7f0e"),
    ):
        xs, ys = [], []
        for p in publishers:
            for n in getattr(p, attr):
                if n in p.sent_at and n in p.answered_at:
                    xs.append(p.sent_at[n] - t0)
                    ys.append(max(p.answered_at[n] - p.sent_at[n], 0.0005))
        if xs:
            ax.scatter(xs, ys, s=18, marker=marker, c=color, label=label)
            top = max([top, *ys])
    ax.set_yscale("log")
    ax.set_xlim(0, end)
    ax.set_ylim(0.0005, top * 3)
    ax.set_xlabel("time since the workload started (s)")
    ax.set_ylabel("latency: publish -> acknowledgement (s)")
    seen: set[str] = set()
    for fault in faults:
        family = fault_family(fault["kind"])
        color = FAULT_COLORS[family]
        ax.axvspan(
            fault["start"],
            fault["end"],
            color=color,
            alpha=0.15,
            label=None if family in seen else f"nemesis: {family}",
        )
        seen.add(family)
        ax.text(
            fault["start"],
            top * 2,
            fault["label"],
            fontsize=7,
            rotation=0,
            va="center",
            color=color,
        )
    if gap[1] > 0:
        ax.hlines(top * 1.4, gap[0], gap[0] + gap[1], colors="#d62728", linewidth=3)
        ax.text(gap[0], top * 1.15, f"longest ack gap {gap[1]:.1f} s", fontsize=8, color="#d62728")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=7, markerscale=2)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
