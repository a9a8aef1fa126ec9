"""Results of many fault runs: one summary line per run, and the table for docs/faults.md."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def summary_line(result: dict[str, Any]) -> str:
    verdict = result.get("verdict", {})
    counts = result.get("counts", {})
    kinds = ",".join(sorted({f["kind"] for f in result.get("faults", [])})) or "-"
    gap = result.get("ack", {}).get("longest_gap_s", "-")
    state = "PASS" if verdict.get("ok") else "FAIL"
    return (
        f"{state} {result.get('name')} seed={result.get('seed')} faults={kinds} "
        f"acked={counts.get('acknowledged', '-')} lost={counts.get('lost', '-')} "
        f"dup1={counts.get('duplicated_qos1', '-')} dup2={counts.get('duplicated_qos2', '-')} "
        f"order={counts.get('order_violations', '-')} silent={silent_count(result)} "
        f"unreachable_ends={accepted_ends(result)} gap={gap}s"
        + ("" if verdict.get("ok") else f" failures={verdict.get('failures')}")
    )


def silent_count(result: dict[str, Any]) -> int | str:
    """G9: times a subscriber connected through a heal was still missing messages (- where the
    run did not judge it)."""
    silence = result.get("silence")
    return "-" if silence is None else len(silence.get("silent", []))


def accepted_ends(result: dict[str, Any]) -> int:
    """Connections ended past --unreachable-disconnect that the verdict accepted."""
    ends = result.get("verdict", {}).get("unreachable_disconnects", [])
    return sum(1 for e in ends if e.get("accepted"))


def catch_up(result: dict[str, Any]) -> float:
    """The longest a subscriber connected through a heal took to have what it was owed."""
    silence = result.get("silence") or {}
    return float(silence.get("longest_catch_up", {}).get("seconds", 0.0))


def load(dirs: Iterable[Path]) -> list[dict[str, Any]]:
    results = []
    for d in dirs:
        for path in sorted(d.rglob("result.json")):
            doc = json.loads(path.read_text())
            doc["_path"] = str(path)
            results.append(doc)
    return results


COLUMNS = (
    "nemesis",
    "runs",
    "faults",
    "acknowledged",
    "lost",
    "silent",
    "dup QoS 1",
    "dup QoS 2",
    "order violations",
    "two masters",
    "longest ack gap (s)",
    "unreachable ends",
    "longest catch-up (s)",
    "failed runs",
)


def _row(name: str, runs: Sequence[dict[str, Any]], kind: str | None) -> list[str]:
    def total(key: str) -> int:
        return sum(int(r.get("counts", {}).get(key, 0)) for r in runs)

    faults = sum(1 for r in runs for f in r.get("faults", []) if kind is None or f["kind"] == kind)
    gap = max((float(r.get("ack", {}).get("longest_gap_s", 0.0)) for r in runs), default=0.0)
    failed = [r for r in runs if not r.get("verdict", {}).get("ok")]
    silent = [silent_count(r) for r in runs]
    judged = [n for n in silent if isinstance(n, int)]
    return [
        name,
        str(len(runs)),
        str(faults),
        str(total("acknowledged")),
        str(total("lost")),
        str(sum(judged)) if judged else "-",
        str(total("duplicated_qos1")),
        str(total("duplicated_qos2")),
        str(total("order_violations")),
        str(sum(len(r.get("epoch_conflicts", [])) for r in runs)),
        f"{gap:.1f}",
        str(sum(accepted_ends(r) for r in runs)),
        f"{max((catch_up(r) for r in runs), default=0.0):.1f}",
        str(len(failed)),
    ]


def table_markdown(dirs: Iterable[Path]) -> str:
    results = load(dirs)
    kinds = sorted({f["kind"] for r in results for f in r.get("faults", [])})
    rows = [list(COLUMNS), ["---"] * len(COLUMNS)]
    for kind in kinds:
        runs = [r for r in results if any(f["kind"] == kind for f in r.get("faults", []))]
        rows.append(_row(kind, runs, kind))
    rows.append(_row("**all runs**", results, None))
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    failed = [r for r in results if not r.get("verdict", {}).get("ok")]
    if failed:
        lines += ["", "Failed runs (replay with `python -m tests.faults run --seed S ...`):", ""]
        for r in failed:
            config = r.get("config", {})
            lines.append(
                f"- seed {r.get('seed')} ({config.get('nodes', '?')} nodes, kinds "
                f"{','.join(config.get('kinds') or [])}): "
                f"{'; '.join(r.get('verdict', {}).get('failures', []))}"
            )
    machine = results[0].get("machine", {}) if results else {}
    lines += [
        "",
        f"{len(results)} runs; machine: {machine.get('cpus')} CPUs, kernel "
        f"{machine.get('kernel')}, Python {machine.get('python')}",
    ]
    return "\n".join(lines)
