"""Clock jumps of one node with libfaketime (apt package faketime).

Every process of a node runs with libfaketime preloaded, reading the node's offset from a
file (FAKETIME_TIMESTAMP_FILE, re-read every second); a jump writes a new offset there. Only
the wall clock (CLOCK_REALTIME: time.time()) jumps, as when NTP steps a machine's clock:
FAKETIME_DONT_FAKE_MONOTONIC=1. Checked here before use (`why_unavailable`):

- with the monotonic clock faked too, a jump back stalls every asyncio timer for the jump's
  length (the loop waits for monotonic time to catch up): that is a pause, which the SIGSTOP
  nemesis already does, not a clock jump;
- with libfaketime 0.9.10 (Debian bookworm) and FAKETIME_DONT_FAKE_MONOTONIC=1, Python's
  time.sleep() fails with EINVAL (it sleeps with clock_nanosleep(TIMER_ABSTIME) on the
  monotonic clock); asyncio, threading waits and gRPC are unaffected, and no hexmq service
  calls time.sleep(), so the services run; the probe checks exactly what they use.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
import asyncio, time
t0 = time.time()
async def main():
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.sleep(0.2)
    return loop.time() - start
slept = asyncio.run(main())
print(round(t0), round(slept, 2))
"""


def find_libfaketime() -> str | None:
    for path in sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")) + sorted(
        glob.glob("/usr/lib/faketime/libfaketime.so.1")
    ):
        if os.path.exists(path):
            return path
    return None


def environment(library: str, offset_file: str) -> dict[str, str]:
    return {
        "LD_PRELOAD": library,
        "FAKETIME_TIMESTAMP_FILE": offset_file,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "FAKETIME_CACHE_DURATION": "1",
    }


def why_unavailable() -> str | None:
    """Why clock jumps cannot be made here (None: they can): a Python process under
    libfaketime with a +1 day offset must see the wall clock a day ahead and its asyncio
    timers run in real time."""
    library = find_libfaketime()
    if library is None:
        return "libfaketime not found (Debian: apt-get install faketime)"
    with tempfile.TemporaryDirectory() as tmp:
        offset = Path(tmp) / "offset"
        offset.write_text("+86400s\n")
        env = {**os.environ, **environment(library, str(offset))}
        try:
            done = subprocess.run(
                [sys.executable, "-c", PROBE],
                env=env,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"a Python process under libfaketime did not run: {exc}"
    import time

    if done.returncode != 0:
        return f"a Python process under libfaketime failed: {done.stderr.strip()[-300:]}"
    try:
        seen, slept = done.stdout.split()
    except ValueError:
        return f"unexpected output from the libfaketime probe: {done.stdout!r}"
    ahead = int(seen) - time.time()
    if not 86000 < ahead < 86800:
        return f"libfaketime did not move the wall clock (+{ahead:.0f} s instead of +86400 s)"
    if not 0.15 < float(slept) < 2.0:
        return f"asyncio timers under libfaketime are off (slept {slept} s for 0.2 s)"
    return None


class Clocks:
    """The offset files of a run's nodes (all +0 until a jump)."""

    def __init__(self, directory: Path, nodes: int, library: str) -> None:
        self.dir = directory
        self.library = library
        directory.mkdir(parents=True, exist_ok=True)
        for node in range(1, nodes + 1):
            self.set(node, 0)

    def path(self, node: int | str) -> Path:
        return self.dir / f"n{node}"

    def wrapper_args(self) -> tuple[str, str]:
        """libfaketime and the offset file, {node} left for hexmq cluster to fill."""
        return self.library, str(self.path("{node}"))

    def set(self, node: int, offset_s: int) -> None:
        tmp = self.path(node).with_suffix(".tmp")
        tmp.write_text(f"{offset_s:+d}s\n")
        tmp.replace(self.path(node))
