"""Time bounds for tests that start clusters (or the Spark JVM), following how long starts
take on this machine.

Every cluster start of the test fixtures (`hexmq cluster up`, `start`, `add`) runs through
`run_start`, which times it; tests/spark/conftest.py times its JVM starts. `pace()` is the
slowest of the last few successful starts over what the same start takes on a quiet machine
here (a cluster `start` or `add` waits for the whole cluster: it counts as an `up` of the
cluster's size), never below 1; the fixed bounds of tests that start things are multiplied by
it:

- `step_timeout()`: the `--timeout` (each startup step) given to `hexmq cluster up/start/add`,
  the CLI's default 30 s times the pace; the command as a whole gets 6 times that;
- each such test's pytest timeout (its mark, else the configured 120 s), by tests/conftest.py
  as the test begins;
- `scaled(seconds)`: any other fixed wait of theirs that depends on the machine's speed.

And a start does not count against the running test's timeout: it runs
`outside_test_timeout`, which sets pytest-timeout's alarm (the signal method's ITIMER_REAL) to
the start's own bound meanwhile and gives the test afterwards what it had left, times the
change of pace the start showed. So the start that first shows the machine is slow, which the
pace did not know when the test began, neither eats the time of the test that waits for it nor
leaves it a quiet machine's time (make test at load 5-30: a start took more than the 60 s its
test allowed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence

import pytest

STEP_TIMEOUT_S = 30.0  # `hexmq cluster up --timeout`'s default
# A start of N nodes on a quiet machine here (2 cores, 2026-11-28): about 2 s + 1.2 s a node
# (up: 1 node 3.0 s, 2 nodes 3.9 s, 3 nodes 4.8 s, 4 nodes 7.9 s; at `stress-ng --cpu 2`
# beside it, 2 to 2.5 times that).
QUIET_BASE_S = 2.0
QUIET_PER_NODE_S = 1.2
QUIET_JVM_START_S = 10.0  # the Spark tests' local SparkSession (10-13 s seen here)
# The pace follows the last few starts: the machine's load now, not an hour ago.
RECENT_STARTS = 5

_recent: deque[float] = deque(maxlen=RECENT_STARTS)  # each start's time over its quiet time


def quiet_start_s(nodes: int) -> float:
    return QUIET_BASE_S + QUIET_PER_NODE_S * nodes


def record_start(seconds: float, quiet_seconds: float) -> None:
    """A start took `seconds` where a quiet machine takes `quiet_seconds`."""
    _recent.append(seconds / quiet_seconds)


def pace() -> float:
    return max([1.0, *_recent])


def step_timeout() -> float:
    return STEP_TIMEOUT_S * pace()


def scaled(seconds: float) -> float:
    return seconds * pace()


def configured_timeout(item: pytest.Item) -> float | None:
    """The item's timeout as pytest-timeout finds it (its mark, else --timeout, PYTEST_TIMEOUT,
    the ini file); None if it has none."""
    marker = item.get_closest_marker("timeout")
    value = None
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    if value is None:
        value = (
            item.config.getoption("timeout", None)
            or os.environ.get("PYTEST_TIMEOUT")
            or item.config.getini("timeout")
        )
    return float(value) if value and float(value) > 0 else None


@contextlib.contextmanager
def outside_test_timeout(bound: float) -> Iterator[None]:
    """Run the block (a start) on a timeout of its own, `bound` seconds (pytest-timeout's
    alarm, so a hang still ends as the test's timeout), and give the running test afterwards
    the time it had left before, times the change of pace. Nothing changes where no alarm runs
    (no timeout, or pytest-timeout's thread method)."""
    left, _ = signal.getitimer(signal.ITIMER_REAL)
    before = pace()
    if left:
        signal.setitimer(signal.ITIMER_REAL, bound)
    try:
        yield
    finally:
        if left:
            signal.setitimer(signal.ITIMER_REAL, left * pace() / before)


def run_start(
    argv: Sequence[str],
    nodes: int,
    env: Mapping[str, str] | None = None,
    at_least: float = 0,
) -> subprocess.CompletedProcess[str]:
    """Run a cluster start (argv carries its `--timeout`, `step_timeout()` unless the test
    means another) to its end, outside the test's timeout; record how long it took if it
    succeeded. `nodes`: how many nodes it starts; the command gets 6 step timeouts (the
    agreement server, four layers of services, the MQTT wait), or `at_least` seconds if more."""
    bound = max(6 * step_timeout(), at_least)
    started = time.monotonic()
    with outside_test_timeout(bound + 60):  # the subprocess's own bound ends it first
        result = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            timeout=bound,
            check=False,
        )
        if result.returncode == 0:
            record_start(time.monotonic() - started, quiet_start_s(nodes))
    return result
