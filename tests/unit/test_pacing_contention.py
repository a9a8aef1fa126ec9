"""The batch interval that follows how contended the machine is (hexmq/pacing.py): the base
interval while the event loop's thread gets a core when it wants one, the ceiling while it
waits for one much of the time, smoothed; and the loop that reads the kernel's figure and
drives every pacer of the process."""

from __future__ import annotations

import asyncio
import math

import pytest

from hexmq import pacing
from hexmq.pacing import Contention, FlushPacer, read_runqueue_wait


@pytest.fixture(autouse=True)
def _restore_interval():
    saved = (pacing._interval, pacing._base, pacing._ceiling)
    yield
    pacing._interval, pacing._base, pacing._ceiling = saved


def steady(c: Contention, share: float, rounds: int = 60) -> float:
    interval = c.base
    for _ in range(rounds):
        interval = c.observe(share * 0.5, 0.5)
    return interval


def test_an_uncontended_process_keeps_its_base_interval() -> None:
    assert steady(Contention(0.004, 0.016), 0.0) == 0.004
    assert steady(Contention(0.004, 0.016), 0.08) == 0.004  # one node at 1,000/s: 4-8%


def test_a_contended_process_goes_to_the_ceiling() -> None:
    assert steady(Contention(0.004, 0.016), 0.45) == 0.016
    assert steady(Contention(0.004, 0.016), 1.0) == 0.016


def test_in_between_the_interval_is_in_proportion() -> None:
    assert math.isclose(steady(Contention(0.004, 0.016), 0.26), 0.010, rel_tol=1e-3)


def test_one_busy_moment_moves_the_interval_only_part_way() -> None:
    c = Contention(0.004, 0.016)
    steady(c, 0.0)
    once = c.observe(0.5 * 0.5, 0.5)  # half of one period waiting
    assert 0.004 < once < 0.016
    assert c.observe(0.0, 0.5) < once  # and it comes back


def test_odd_readings_are_bounded() -> None:
    c = Contention(0.004, 0.016)
    assert c.observe(-1.0, 0.5) == 0.004  # (a counter that went back)
    assert c.observe(1.0, 0.0) == 0.004  # (no time passed)


def test_a_ceiling_under_the_base_is_refused() -> None:
    with pytest.raises(ValueError, match="ceiling"):
        Contention(0.004, 0.002)


def test_pacers_follow_the_process_interval_unless_given_their_own() -> None:
    pacing.configure(0.004, 0.016)
    follows, fixed = FlushPacer(), FlushPacer(interval=0.001)
    follows.sent(10.0)
    fixed.sent(10.0)
    assert math.isclose(follows.delay(10.0, 1), 0.004)
    pacing._interval = 0.016
    assert math.isclose(follows.delay(10.0, 1), 0.016)
    assert math.isclose(fixed.delay(10.0, 1), 0.001)


def test_the_kernel_tells_this_thread_its_run_queue_wait(tmp_path) -> None:
    waited = read_runqueue_wait()
    assert waited is not None  # (Linux with schedstat: this machine, CI)
    assert waited >= 0
    assert read_runqueue_wait(str(tmp_path / "absent")) is None
    (tmp_path / "odd").write_text("1 2\n")
    assert read_runqueue_wait(str(tmp_path / "odd")) == 2e-9


async def test_the_loop_raises_the_interval_while_contended_and_restores_it() -> None:
    pacing.configure(0.004, 0.016)
    clock = {"waited": 0.0}
    shown: list[float] = []

    def read() -> float:
        return clock["waited"]

    task = asyncio.create_task(pacing.follow_contention(shown.append, period=0.01, read=read))
    await asyncio.sleep(0.05)
    assert pacing.configured() == 0.004  # no waiting
    for _ in range(30):  # then waiting all the time
        clock["waited"] += 0.01
        await asyncio.sleep(0.01)
    assert pacing.configured() > 0.012
    assert shown[0] == 0.004
    assert max(shown) == pacing.configured()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pacing.configured() == 0.004  # stopped: back to the base


async def test_a_fixed_interval_or_no_reading_leaves_the_base() -> None:
    pacing.configure(0.004, 0.004)
    shown: list[float] = []
    await pacing.follow_contention(shown.append, period=0.01, read=lambda: 0.0)
    assert shown == [0.004]
    pacing.configure(0.004, 0.016)
    await pacing.follow_contention(shown.append, period=0.01, read=lambda: None)
    assert pacing.configured() == 0.004
