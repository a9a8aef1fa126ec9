"""SIGTERM is a service's leave signal, SIGINT its plain stop (hexmq.service.run_service;
docs/operations.md, "Leaving")."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

PROGRAM = """
import asyncio, sys
from hexmq.service import run_service

async def main(stop):
    print("ready", flush=True)
    await stop.wait()
    first = "leave" if stop.leave else "plain"
    try:
        await asyncio.wait_for(stop.plain.wait(), 5)
        then = "cut short"
    except TimeoutError:
        then = "not cut short"
    print(first, then, flush=True)
    return 0

sys.exit(run_service(main))
"""


@pytest.mark.parametrize(
    ("signals", "said"),
    [
        ([signal.SIGINT], "plain cut short"),
        ([signal.SIGTERM, signal.SIGINT], "leave cut short"),
    ],
)
def test_sigterm_asks_for_a_leave_and_sigint_cuts_it_short(
    signals: list[signal.Signals], said: str
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=20)
        assert out.strip() == said
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
