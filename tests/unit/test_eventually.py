"""tests/support/eventually.py: it returns once the predicate holds, and fails saying what it
waited for when it never does."""

from __future__ import annotations

import pytest

from tests.support.eventually import eventually, eventually_sync


async def test_eventually_returns_once_the_predicate_holds() -> None:
    calls = iter([False, False, True])
    took = await eventually(lambda: next(calls), 1.0, interval=0.01)
    assert 0.015 <= took < 1.0


async def test_eventually_fails_naming_what_it_waited_for() -> None:
    with pytest.raises(AssertionError, match=r"not within 0\.05 s: the moon"):
        await eventually(lambda: False, 0.05, "the moon", interval=0.01)


def test_eventually_sync_does_the_same_off_the_loop() -> None:
    assert eventually_sync(lambda: True, 0.1) == pytest.approx(0, abs=0.01)
    with pytest.raises(AssertionError, match="the sun"):
        eventually_sync(lambda: False, 0.05, "the sun", interval=0.01)
