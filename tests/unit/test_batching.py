"""Batches that follow the load (issue 14): the pacer every batching stage asks when to send
(hexmq/pacing.py)."""

from __future__ import annotations

import math

import pytest

from hexmq.pacing import FlushPacer, Linger

# ----- the pacer ----------------------------------------------------------------------------


def test_a_lone_batch_goes_at_once() -> None:
    pacer = FlushPacer(interval=0.001, full=10)
    assert pacer.delay(100.0, 1) == 0.0  # never sent before
    pacer.sent(100.0)
    # A quiet spell longer than the interval: the next one goes at once too.
    assert pacer.delay(100.0015, 1) == 0.0


def test_a_batch_soon_after_the_last_waits_out_the_interval() -> None:
    pacer = FlushPacer(interval=0.001, full=10)
    pacer.sent(100.0)
    assert math.isclose(pacer.delay(100.0004, 3), 0.0006)
    assert pacer.delay(100.001, 3) == 0.0


def test_a_full_batch_does_not_wait() -> None:
    pacer = FlushPacer(interval=0.001, full=10)
    pacer.sent(100.0)
    assert pacer.delay(100.0001, 10) == 0.0
    assert pacer.delay(100.0001, 9) > 0


def test_interval_zero_never_waits() -> None:
    pacer = FlushPacer(interval=0.0, full=10)
    pacer.sent(100.0)
    assert pacer.delay(100.0, 1) == 0.0


def test_bad_pacer_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        FlushPacer(interval=-0.001)
    with pytest.raises(ValueError, match="full"):
        FlushPacer(full=0)


def test_the_pacer_caps_batches_per_interval_whatever_the_rate() -> None:
    """A stage fed one item every 200 us (5,000/s) sends at most one batch per 1 ms interval,
    each of about five items, and no item waits longer than the interval."""
    pacer = FlushPacer(interval=0.001, full=1000)
    linger = Linger()
    now, waiting, due = 0.0, 0, 0.0
    first_waiting = 0.0
    worst = 0.0
    for i in range(5000):
        arrival = i * 0.0002
        if waiting and due <= arrival:
            pacer.sent(due)
            linger.record(waiting, due - now)
            worst = max(worst, due - first_waiting)
            waiting = 0
        if not waiting:
            first_waiting = now = arrival
            due = arrival + pacer.delay(arrival, 1)
        waiting += 1
    assert linger.batches <= 1000 + 1
    assert 4 <= linger.items / linger.batches <= 6
    assert worst <= 0.001 + 1e-9


def test_linger_exports_to_its_counters() -> None:
    class Count:
        def __init__(self) -> None:
            self.value = 0.0

        def inc(self, amount: float = 1) -> None:
            self.value += amount

    batches, items, seconds = Count(), Count(), Count()
    linger = Linger(exported=(batches, items, seconds))
    linger.record(3, 0.0005)
    linger.record(1, 0.0)
    assert (linger.batches, linger.items) == (2, 4)
    assert (batches.value, items.value, seconds.value) == (2, 4, 0.0005)
