"""A test's own child processes ended: the signal, a grace period, then SIGKILL. The one place
tests and their support end a process they started (by its Popen, never by name)."""

from __future__ import annotations

import signal
import subprocess


def end(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, grace: float = 10) -> None:
    """Signal `process`, give it `grace` seconds to exit, then kill it."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=grace)
