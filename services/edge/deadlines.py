"""Deadlines: the timers of every connection of an edge on one heap and one loop timer.

A connection asks to be ticked at one moment at a time (the CONNECT timeout, then its next
keepalive check; services/edge/session/keepalive.py). A loop TimerHandle each cost an idle
connection about 530 bytes of the edge's memory (the handle, uvloop's timer and its libuv
handle, the bound method; tracemalloc with 1,000 idle clients), a sixth of what the edge kept
per connection (issue 14: at most 3 MiB per 1,000). Here a deadline is one small list on a heap
(the heapq documentation's priority queue with removable entries), and the edge has one loop
timer, at the earliest deadline.

- `set` replaces the owner's deadline; `cancel` removes it. A later deadline than the owner's
  live one reuses its entry: the entry comes to the top at the earlier time and goes back on
  the heap at the later one (a CONNECT timeout followed by the keepalive costs one entry, not a
  removed one and a new one). An earlier deadline, or a cancel, marks the entry removed; it
  stays on the heap until it comes to the top or the heap is compacted (when removed entries
  outnumber live ones): a closed connection is not held for its whole keepalive.
- `pop_due(now)` takes the owners whose deadline is at or before `now`, earliest first.
- `next_at()` is when to look next: the earliest live deadline, or an earlier moment at which a
  postponed entry comes to the top (the loop timer then wakes once for nothing).

Pure (the clock is passed in); `LoopDeadlines` runs it on the asyncio loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any, Generic, TypeAlias, TypeVar

__all__ = ["Deadline", "Deadlines", "LoopDeadlines"]

T = TypeVar("T")

# An entry: [at, sequence, owner, due]: on the heap at `at`, the owner due at `due` (at or
# after `at`); owner None once removed. The sequence keeps owners out of the comparison of
# equal deadlines.
Deadline: TypeAlias = list[Any]

# Removed entries kept before a compaction is considered (a few are normal: a keepalive check
# that found a packet read re-arms, leaving none; a connection closing leaves one).
_COMPACT_FLOOR = 64


class Deadlines(Generic[T]):
    __slots__ = ("_heap", "_removed", "_sequence")

    def __init__(self) -> None:
        self._heap: list[Deadline] = []
        self._removed = 0
        self._sequence = itertools.count()

    def __len__(self) -> int:
        """Live deadlines."""
        return len(self._heap) - self._removed

    def set(self, owner: T, at: float, previous: Deadline | None) -> Deadline:
        """`owner` is due at `at` instead of its `previous` entry's deadline (if any): the
        entry to pass back to `set` or `cancel` (the previous one itself when `at` is not
        earlier than where it sits on the heap)."""
        if previous is not None and previous[2] is not None:
            if at >= previous[0]:
                previous[3] = at
                return previous
            self.cancel(previous)
        entry: Deadline = [at, next(self._sequence), owner, at]
        heapq.heappush(self._heap, entry)
        return entry

    def cancel(self, entry: Deadline | None) -> None:
        if entry is None or entry[2] is None:
            return
        entry[2] = None
        self._removed += 1
        heap = self._heap
        if self._removed > _COMPACT_FLOOR and self._removed * 2 > len(heap):
            self._heap = [e for e in heap if e[2] is not None]
            heapq.heapify(self._heap)
            self._removed = 0

    def next_at(self) -> float | None:
        """When to look next (None: no deadline)."""
        heap = self._heap
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
            self._removed -= 1
        return heap[0][0] if heap else None

    def pop_due(self, now: float) -> list[T]:
        """The owners due at `now`, earliest first; their entries are gone."""
        due: list[T] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            owner = entry[2]
            if owner is None:
                self._removed -= 1
            elif entry[3] > entry[0]:  # postponed: back on the heap at its deadline
                entry[0] = entry[3]
                heapq.heappush(heap, entry)
            else:
                entry[2] = None
                due.append(owner)
        return due


class LoopDeadlines(Generic[T]):
    """Deadlines on the running asyncio loop: `tick(owner)` is called for each owner when its
    deadline comes, from one loop timer kept at the earliest deadline."""

    __slots__ = ("_at", "_handle", "_tick", "deadlines")

    def __init__(self, tick: Callable[[T], object]) -> None:
        self.deadlines: Deadlines[T] = Deadlines()
        self._tick = tick
        self._handle: asyncio.TimerHandle | None = None
        self._at: float | None = None  # when the loop timer fires

    def set(self, owner: T, at: float, previous: Deadline | None) -> Deadline:
        entry = self.deadlines.set(owner, at, previous)
        if self._at is None or at < self._at:
            self._arm(at)
        return entry

    def cancel(self, entry: Deadline | None) -> None:
        # (The loop timer stays: firing with nothing due costs one wake-up, and re-arms.)
        self.deadlines.cancel(entry)

    def _arm(self, at: float | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._at = at
        if at is not None:
            self._handle = asyncio.get_running_loop().call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._at = None
        for owner in self.deadlines.pop_due(asyncio.get_running_loop().time()):
            self._tick(owner)
        # (A tick may have set a new deadline and armed the timer already.)
        at = self.deadlines.next_at()
        if at is not None and (self._at is None or at < self._at):
            self._arm(at)

    def close(self) -> None:
        """Stop the loop timer (the edge stops)."""
        self._arm(None)
