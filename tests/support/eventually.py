"""Waiting for behaviour, not for time: `eventually(predicate, timeout)` polls until the
predicate holds and fails the test, saying what it waited for, if it does not in time. The
async form for tests on the event loop; `eventually_sync` for threads and subprocesses."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

INTERVAL = 0.05


async def eventually(
    predicate: Callable[[], bool], timeout: float, what: str = "", interval: float = INTERVAL
) -> float:
    """Until `predicate()` holds (checked at once, then every `interval`); the seconds it
    took. AssertionError naming `what` after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        if loop.time() - start >= timeout:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        await asyncio.sleep(interval)
    return loop.time() - start


def eventually_sync(
    predicate: Callable[[], bool], timeout: float, what: str = "", interval: float = INTERVAL
) -> float:
    """`eventually` for code off the event loop (it sleeps the thread)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start >= timeout:
            raise AssertionError(f"not within {timeout:g} s: {what or predicate}")
        time.sleep(interval)
    return time.monotonic() - start
