"""`--profile`: sample broker processes with py-spy during a run and rank their functions.

py-spy is not a project dependency (`pip install py-spy` into the venv). It attaches to a
running process from outside (ptrace, `--nonblocking`: the target is never paused), so the
services need no instrumentation. It samples only Python frames: time in native code (uvloop,
the gRPC core, hiredis) shows as self time of the Python frame that called it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RATE_HZ = 200
# `func (path/to/file.py:123)`: the line is dropped when ranking, so one function is one entry.
_LINE = re.compile(r":\d+\)$")
# Frames that only start a process, a thread or the event loop: under every sample of their
# thread, so they would top the inclusive ranking and say nothing. Their self time (the event
# loop's native code, gRPC's threads) still counts.
_ENTRY = re.compile(
    r"\((<frozen runpy>|threading\.py|hexmq/cli\.py|hexmq_cli/(cli|__main__)\.py|hexmq/service\.py"
    r"|asyncio/runners\.py|services/\w+/main\.py)\)$"
)


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (pip-installed into the venv)."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.exists():
        return str(beside)
    return shutil.which("py-spy")


@dataclass
class Sampler:
    """py-spy processes recording the given pids for `duration` seconds, into raw files."""

    binary: str
    outdir: Path
    stem: str
    rate_hz: int = RATE_HZ
    # Native frames too (py-spy --native): time in C (the garbage collector, protobuf, gRPC's
    # core) shows under its own name instead of as the calling Python frame's self time. The
    # target is paused for each sample then (py-spy cannot read native stacks otherwise).
    native: bool = False
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    def start(self, pids: dict[str, int], duration: float) -> None:
        self.outdir.mkdir(parents=True, exist_ok=True)
        for role, pid in pids.items():
            out = self.outdir / f"{self.stem}-{role}.raw"
            log = self.outdir / f"{self.stem}-{role}.log"
            self.files[role] = out
            self.logs[role] = log
            with log.open("wb") as errors:
                self.processes[role] = subprocess.Popen(
                    [
                        self.binary,
                        "record",
                        "--pid",
                        str(pid),
                        "--duration",
                        str(max(1, round(duration))),
                        "--rate",
                        str(self.rate_hz),
                        "--format",
                        "raw",
                        "--output",
                        str(out),
                        # --native needs the target paused while it reads its stack.
                        *(["--native"] if self.native else ["--nonblocking"]),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=errors,
                    stderr=subprocess.STDOUT,
                )

    def finish(self, timeout: float = 30) -> dict[str, Any]:
        """Wait for every sampler; their ranked functions by role (or why there are none)."""
        results: dict[str, Any] = {}
        for role, process in self.processes.items():
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            out = self.files[role]
            if process.returncode != 0 or not out.exists():
                why = self.logs[role].read_text(errors="replace").strip()[-500:]
                results[role] = {"error": f"py-spy exited {process.returncode}: {why}"}
                continue
            results[role] = rank(out.read_text(errors="replace"))
            results[role]["raw"] = str(out)
        return results


def rank(collapsed: str, top: int = 25) -> dict[str, Any]:
    """Self time (the leaf frame of each sample) and inclusive time (every distinct frame of a
    sample, entry frames left out) per function, from py-spy's collapsed stacks
    ("frame;frame;... count"). py-spy leaves out idle samples (a thread waiting in a system
    call), so the percentages are of the time the process was busy."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_LINE.sub(")", frame) for frame in stack.split(";") if frame]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            if not _ENTRY.search(frame):
                inclusive[frame] += count

    def table(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"function": name, "samples": n, "pct": round(100 * n / total, 1)}
            for name, n in counter.most_common(top)
        ]

    return {"samples": total, "self": table(own), "inclusive": table(inclusive)}


def format_report(
    results: dict[str, Any], header: str, top: int = 25, rate_hz: int = RATE_HZ
) -> str:
    lines = [header, ""]
    for role, result in results.items():
        if "error" in result:
            lines += [f"== {role}: no profile ({result['error']})", ""]
            continue
        lines.append(f"== {role}: {result['samples']} samples at {rate_hz} Hz ({result['raw']})")
        for kind in ("self", "inclusive"):
            lines.append(f"-- {kind} time")
            lines += [
                f"{entry['pct']:6.1f}%  {entry['samples']:7d}  {entry['function']}"
                for entry in result[kind][:top]
            ]
        lines.append("")
    return "\n".join(lines)
