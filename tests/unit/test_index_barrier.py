"""IndexBarrier: a SUBACK waits for every linked edge's IndexAck, but not for closed links,
links that already acknowledged, or (past the timeout) a hung edge."""

from __future__ import annotations

import asyncio

import pytest

from services.partition import index_barrier
from services.partition.index_barrier import IndexBarrier
from services.partition.links import EdgeLink


def links(*names: str) -> list[EdgeLink]:
    return [EdgeLink(name, 1) for name in names]


async def test_released_once_every_edge_acknowledged() -> None:
    barrier = IndexBarrier()
    a, b = links("a", "b")
    released: list[str] = []
    seq = barrier.next_seq()
    barrier.wait(seq, [a, b], lambda: released.append("suback"))
    barrier.acked(a, seq)
    assert released == []
    barrier.acked(b, seq)
    assert released == ["suback"]


async def test_a_later_ack_covers_earlier_updates_and_known_acks_do_not_wait() -> None:
    barrier = IndexBarrier()
    (a,) = links("a")
    first, second = barrier.next_seq(), barrier.next_seq()
    released: list[int] = []
    barrier.wait(first, [a], lambda: released.append(first))
    barrier.acked(a, second)
    assert released == [first]
    barrier.wait(second, [a], lambda: released.append(second))  # already acknowledged
    assert released == [first, second]


async def test_a_closed_link_does_not_hold_a_suback() -> None:
    barrier = IndexBarrier()
    a, b = links("a", "b")
    released: list[str] = []
    seq = barrier.next_seq()
    barrier.wait(seq, [a, b], lambda: released.append("suback"))
    barrier.acked(a, seq)
    b.close()
    barrier.link_closed(b)
    assert released == ["suback"]
    c = EdgeLink("c", 1)
    c.close()
    barrier.wait(barrier.next_seq(), [c], lambda: released.append("closed"))
    assert released == ["suback", "closed"]


async def test_a_hung_edge_is_waited_for_only_until_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(index_barrier, "TIMEOUT_S", 0.05)
    barrier = IndexBarrier()
    (a,) = links("a")
    released = asyncio.Event()
    barrier.wait(barrier.next_seq(), [a], released.set)
    await asyncio.wait_for(released.wait(), 2)
    assert barrier.timeouts == 1
