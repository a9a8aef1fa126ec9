"""Blocked queries waiting for a change their Watch matches (the memdb watch sets of Consul's
blockingQuery): the adapter notifies the hub of every change the state records."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from services.membership.consul_dev.model import Change, Watch


@dataclass(slots=True)
class _Waiter:
    watch: Watch
    woken: asyncio.Future[None]


class WatchHub:
    """Blocked queries waiting for a change their Watch matches."""

    def __init__(self) -> None:
        self._waiters: list[_Waiter] = []
        self.closed = False

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, watch: Watch, within: float) -> bool:
        """True if a matching change came within `within` seconds; False on timeout or
        shutdown."""
        if self.closed:
            return False
        waiter = _Waiter(watch, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await asyncio.wait({waiter.woken}, timeout=within)
        finally:
            self._waiters.remove(waiter)
        return waiter.woken.done() and not self.closed

    def notify(self, changes: list[Change]) -> None:
        for waiter in self._waiters:
            if not waiter.woken.done() and any(waiter.watch.matches(c) for c in changes):
                waiter.woken.set_result(None)

    def close(self) -> None:
        """Shutdown: every blocked query answers its current result now."""
        self.closed = True
        for waiter in self._waiters:
            if not waiter.woken.done():
                waiter.woken.set_result(None)
