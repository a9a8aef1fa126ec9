"""The schedule of a backend that reads its source again and again (a members file, a DNS
name): when to read next, which results are news, and what to say in the log. Sans-IO: the
clock comes in, decisions come out; `poll_listings` is the thin asyncio loop around it.

- Read at once, then every `interval` seconds.
- A read that fails (a timeout, a broken file) keeps the last listing: a source that hiccups
  must not change who may join. It is retried sooner (from `interval / 8`, doubling, up to
  `interval`), and logged once when the failures start and once when they end.
- Only a listing that differs from the last one is published.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from services.membership.discovery.model import Listing

log = logging.getLogger("hexmq.membership")


@dataclass(frozen=True, slots=True)
class Outcome:
    publish: Listing | None = None  # a new listing to hand the agent
    log_error: str = ""  # a failure after a success (or the first one): log it
    log_recovered: bool = False  # reads work again after failing


class PollSchedule:
    def __init__(self, interval_s: float, now: float) -> None:
        if not interval_s > 0:
            raise ValueError(f"a discovery interval must be more than 0 seconds: {interval_s}")
        self.interval_s = interval_s
        self.last: Listing | None = None
        self.failures = 0
        self.next_at = now

    def due_in(self, now: float) -> float:
        """Seconds until the next read (0: now)."""
        return max(0.0, self.next_at - now)

    def succeeded(self, listing: Listing, now: float) -> Outcome:
        recovered = self.failures > 0
        self.failures = 0
        self.next_at = now + self.interval_s
        if listing == self.last:
            return Outcome(log_recovered=recovered)
        self.last = listing
        return Outcome(publish=listing, log_recovered=recovered)

    def failed(self, error: str, now: float) -> Outcome:
        self.failures += 1
        retry = min(self.interval_s, self.interval_s / 8 * 2 ** (self.failures - 1))
        self.next_at = now + retry
        return Outcome(log_error=error if self.failures == 1 else "")


async def poll_listings(
    name: str,
    read: Callable[[], Awaitable[Listing]],
    interval_s: float,
    errors: tuple[type[BaseException], ...],
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[Listing]:
    """Listings from `read()` on the schedule above; `errors` are the failures of a read
    (anything else is a bug and ends the iterator)."""
    schedule = PollSchedule(interval_s, clock())
    while True:
        await asyncio.sleep(schedule.due_in(clock()))
        try:
            outcome = schedule.succeeded(await read(), clock())
        except errors as exc:
            outcome = schedule.failed(str(exc) or type(exc).__name__, clock())
        if outcome.log_error:
            log.warning(
                "discovery %s: %s; keeping the last listing (%s) and retrying",
                name,
                outcome.log_error,
                schedule.last.describe() if schedule.last is not None else "none yet",
            )
        if outcome.log_recovered:
            log.info("discovery %s: reading again", name)
        if outcome.publish is not None:
            yield outcome.publish
