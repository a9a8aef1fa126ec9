"""FlushPacer: when a batching stage sends its next batch, so that batches follow the load.

Every hop of a message (an edge's link frame, a partition's answer frame, a replication frame,
a group commit) has a fixed cost per batch: a gRPC message costs each of the two processes tens
of microseconds here whatever it carries (one stream moves 8-10k unbatched messages a second on
a core, ../shared/STACK.md), a MULTI/EXEC tens of us before its first command. Sent as
soon as something waits, a stage at a few thousand messages a second sends one message per
batch and pays that cost per message (issue 14: a 3-node cluster at 5,000 msg/s burnt as much
CPU as at 29,000). Paced, it sends at most one batch per `interval`:

- a batch goes at once if the last one left at least `interval` ago: a lone message after a
  quiet spell (or at any rate below 1/interval) waits for nothing;
- otherwise it waits until `interval` after the last one, and whatever arrives meanwhile joins
  it: a stream carrying 5,000 messages a second sends about 5 per frame with a 1 ms interval
  instead of 1, and the wait any message sees at this stage is at most `interval`;
- a batch of `full` items or more goes at once (the load is high enough that waiting buys
  nothing more).

Pure: the clock is passed in and the pacer only says how long to wait; the stages await it
(asyncio.sleep) and count what they waited (`Linger`, exported as hexmq_batch_* metrics).

The interval follows how contended the machine is (`Contention`). A process's batches cost
CPU in every process they reach, so when the cores are short, fewer and fuller batches are
what lowers everyone's latency; where they are not (one node at 1,000 msg/s), a long interval
is only latency. The signal is the run-queue wait of the process's event-loop thread, the time
it was ready to run and had no core (Linux's /proc/thread-self/schedstat): its share of wall
time, smoothed, moves the interval from `--batch-interval-us` (at 12% and less) to
`--batch-interval-max-us` (at 40% and more), in proportion in between. With a fixed 4 ms, a
3-node RF 3 cluster on 2 cores at 1,000 msg/s showed 13-23% and one node 4-8%. Against the
fixed interval, at 3 nodes RF 3 it took 137% of the cores at 1,000 msg/s instead of 176-178%
(p99 42-45 against 90-94 ms), and at 5,000 msg/s p99 was 71-73 against 229-341 ms
(docs/benchmarks.md, "An interval that follows contention"). `--batch-interval-max-us` at or
under `--batch-interval-us` keeps the interval fixed.

Lazy items. Some items wait on nothing: a QoS 1 delivery acknowledgement only removes a
message the client has, and the session's window has room. Each used to pay a whole round on
its own: its frame from the edge, a MULTI/EXEC, a replication frame to each follower and
their acknowledgements, about a third of the frames of a message at 3 nodes and RF 3 (issue
14). A stage whose queue holds only lazy items waits up to `lazy_linger()` (default 10 ms,
`--ack-linger-us`) for an item that someone waits on, and they all leave together; after the
linger they leave on their own. Their order against other items never changes.

Deferred writes. At the master, a QoS 1 message's removal (its client acknowledged it) waits
longer: up to `removal_linger()` (default 100 ms, the partition's `--removal-linger-us`) in
the group commit for the next write, and goes with it: its MULTI/EXEC, its replication entry
to each follower and their acknowledgements, and its answer to the edge in the frame of the
answers and deliveries that batch releases (issue 28). Nothing waits on it: the session's
window has room as soon as the acknowledgement arrives, and a removal lost with its master is
a redelivery after a failover, which QoS 1 allows (the edge carries the acknowledgement again
when it re-attaches the session, until the answer comes).
"""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

# Interval per stage unless configured: at most 250 batches a second per stream; a message
# waits at most this long at one hop (seconds). 4 ms rather than 1: on one node at 1,000 msg/s
# it took 63% of the 2 cores against 104% (p50 6.5 against 2.1 ms, p99 about the same), and at
# 3 nodes RF 3 p99 54-79 against 390-411 ms (docs/benchmarks.md, "Fewer costs per batch").
DEFAULT_INTERVAL = 0.004
_interval = DEFAULT_INTERVAL
# The configured interval, which the adapted one never goes under, and its ceiling.
_base = DEFAULT_INTERVAL
_ceiling = DEFAULT_INTERVAL
# The interval's ceiling when the cores are short (seconds; see the module docstring).
DEFAULT_MAX_INTERVAL = 0.016
# How long lazy items wait for company at most (seconds).
DEFAULT_LAZY_LINGER = 0.010
_lazy_linger = DEFAULT_LAZY_LINGER
# How long deferred writes (QoS 1 removals) wait for company at most (seconds): one
# replication tick. At 50-200 msg/s over 3 masters the next write comes within it most of the
# time (docs/benchmarks.md, "Fewer stream messages per publish").
DEFAULT_REMOVAL_LINGER = 0.100
_removal_linger = DEFAULT_REMOVAL_LINGER


def configure(interval: float, ceiling: float | None = None) -> None:
    """The interval of every pacer of this process (a service's --batch-interval-us, set once
    at start), and how far `follow_contention` may raise it (--batch-interval-max-us; under
    `interval`, or None: it stays fixed)."""
    global _interval, _base, _ceiling
    if interval < 0:
        raise ValueError(f"the batch interval must be 0 or more, not {interval!r}")
    _interval = _base = interval
    _ceiling = max(interval, ceiling if ceiling is not None else interval)


def configured() -> float:
    """The interval pacers of this process wait now (adapted by `follow_contention`)."""
    return _interval


@dataclass(slots=True)
class Contention:
    """The pacing interval from how much of the time the event-loop thread waited for a core.

    Pure: `observe` is given the run-queue wait and the wall time since the last observation
    and returns the interval. The share of wall time waited is smoothed (a quarter the new
    share, three quarters the old: about two seconds to follow a change at the service's
    period of half a second) so that one busy moment does not lengthen every batch, then
    mapped: `base` up to `low`, `ceiling` from `high`, in proportion in between."""

    base: float
    ceiling: float
    low: float = 0.12
    high: float = 0.40
    smoothed: float = 0.0

    def __post_init__(self) -> None:
        if self.base < 0 or self.ceiling < self.base:
            raise ValueError(
                f"the interval's ceiling ({self.ceiling!r}) must be at least its base "
                f"({self.base!r}), and the base 0 or more"
            )

    def observe(self, waited: float, elapsed: float) -> float:
        share = min(max(waited / elapsed, 0.0), 1.0) if elapsed > 0 else 0.0
        self.smoothed += (share - self.smoothed) / 4
        position = (self.smoothed - self.low) / (self.high - self.low)
        position = min(max(position, 0.0), 1.0)
        return self.base + position * (self.ceiling - self.base)


SCHEDSTAT = "/proc/thread-self/schedstat"
# How often the interval is adapted (seconds).
CONTENTION_PERIOD = 0.5


def read_runqueue_wait(path: str = SCHEDSTAT) -> float | None:
    """Seconds the calling thread has waited on a run queue since it started (None where the
    kernel does not say)."""
    try:
        with open(path, "rb") as f:
            fields = f.read().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


async def follow_contention(
    show: Callable[[float], object] = lambda interval: None,
    period: float = CONTENTION_PERIOD,
    read: Callable[[], float | None] = read_runqueue_wait,
) -> None:
    """Adapt this process's interval between its base and its ceiling (`configure`) every
    `period` seconds, until cancelled, and `show` each value (the hexmq_batch_interval_seconds
    gauge). Run on the event loop's thread: it is the thread whose waiting delays the batches.
    Returns at once (the interval stays at its base) where the run-queue wait cannot be read,
    or when the ceiling is the base."""
    global _interval
    base, ceiling = _base, _ceiling
    show(base)
    waited = read() if ceiling > base else None
    if waited is None:
        return
    contention = Contention(base, ceiling)
    loop = asyncio.get_running_loop()
    then = loop.time()
    try:
        while True:
            await asyncio.sleep(period)
            now, waited_now = loop.time(), read()
            if waited_now is None:
                return
            _interval = contention.observe(waited_now - waited, now - then)
            show(_interval)
            then, waited = now, waited_now
    finally:
        _interval = base


def _linger(linger: float, what: str) -> float:
    if linger < 0:
        raise ValueError(f"the {what} must be 0 or more, not {linger!r}")
    return linger


def configure_lazy_linger(linger: float) -> None:
    """How long this process's stages hold lazy items at most (--ack-linger-us)."""
    global _lazy_linger
    _lazy_linger = _linger(linger, "lazy linger")


def lazy_linger() -> float:
    return _lazy_linger


def configure_removal_linger(linger: float) -> None:
    """How long this process's group commit holds deferred writes at most
    (--removal-linger-us)."""
    global _removal_linger
    _removal_linger = _linger(linger, "removal linger")


def removal_linger() -> float:
    return _removal_linger


async def wait_for_company(company: asyncio.Event, linger: float) -> float:
    """Hold a stage whose queue has only lazy items until `company` is set (an item someone
    waits on joined) or `linger` seconds passed; the seconds it waited."""
    if company.is_set() or linger <= 0:
        return 0.0
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        async with asyncio.timeout(linger):
            await company.wait()
    except TimeoutError:
        pass
    return loop.time() - start


@dataclass(slots=True)
class FlushPacer:
    # None: the process's interval at each batch (`configured`, adapted to contention).
    interval: float | None = None
    full: int = 256
    # When the last batch left (the stage's clock; -inf: never).
    last: float = -math.inf

    def __post_init__(self) -> None:
        if self.interval is not None and self.interval < 0:
            raise ValueError(f"the batch interval must be 0 or more, not {self.interval!r}")
        if self.full < 1:
            raise ValueError(f"a full batch has at least 1 item, not {self.full!r}")

    def delay(self, now: float, queued: int) -> float:
        """Seconds to wait before sending the `queued` items waiting now (0: send now)."""
        if queued >= self.full:
            return 0.0
        interval = self.interval
        wait = self.last + (_interval if interval is None else interval) - now
        return wait if wait > 0 else 0.0

    def sent(self, now: float) -> None:
        """A batch left at `now`."""
        self.last = now


class Count(Protocol):
    """A counter to bump (a prometheus_client Counter child)."""

    def inc(self, amount: float = 1) -> None: ...


@dataclass(slots=True)
class Linger:
    """What a stage's pacing cost and bought: batches sent, items in them, seconds waited; also
    bumped on `exported` (batches, items, seconds: the hexmq_batch_* metrics of the stage)."""

    batches: int = 0
    items: int = 0
    waited: float = 0.0
    exported: tuple[Count, Count, Count] | None = field(default=None, repr=False)

    def record(self, items: int, waited: float) -> None:
        self.batches += 1
        self.items += items
        self.waited += waited
        if self.exported is not None:
            batches, counted, seconds = self.exported
            batches.inc()
            counted.inc(items)
            if waited:
                seconds.inc(waited)


def add_batch_interval_argument(parser: argparse.ArgumentParser) -> None:
    """`--batch-interval-us`, for the services whose stages batch (edge, partition)."""
    parser.add_argument(
        "--batch-interval-us",
        type=int,
        default=round(DEFAULT_INTERVAL * 1_000_000),
        metavar="US",
        help="each batching stage (link frames, replication frames, Redis commits) sends at "
        "most one batch per this many microseconds, and what arrives meanwhile joins it; a "
        "message after a quiet spell goes at once. Higher: fewer, fuller batches and less CPU "
        "per message at moderate load, at up to this much latency per hop; 0: send as soon as "
        "the previous batch is out (default %(default)s)",
    )
    parser.add_argument(
        "--batch-interval-max-us",
        type=int,
        default=round(DEFAULT_MAX_INTERVAL * 1_000_000),
        metavar="US",
        help="while the machine's cores are short (this process's event loop waits for a core "
        "12%% of the time and more), the interval grows towards this many microseconds, "
        "reached at 40%%: fewer batches, less CPU for every process; at or under "
        "--batch-interval-us: a fixed interval (default %(default)s)",
    )
    parser.add_argument(
        "--ack-linger-us",
        type=int,
        default=round(DEFAULT_LAZY_LINGER * 1_000_000),
        metavar="US",
        help="QoS 1 delivery acknowledgements that free no blocked window wait up to this many "
        "microseconds to travel (edge link, group commit, replication) with the next message "
        "someone waits on, instead of paying a frame and a Redis transaction of their own; "
        "0: they go at once (default %(default)s)",
    )


def apply_batch_interval(args: argparse.Namespace) -> None:
    """Configure this process's pacers from `--batch-interval-us` and `--ack-linger-us`
    (ValueError if negative)."""
    if args.batch_interval_us < 0:
        raise ValueError("--batch-interval-us must be 0 or more")
    if args.ack_linger_us < 0:
        raise ValueError("--ack-linger-us must be 0 or more")
    if args.batch_interval_max_us < 0:
        raise ValueError("--batch-interval-max-us must be 0 or more")
    configure(args.batch_interval_us / 1_000_000, args.batch_interval_max_us / 1_000_000)
    configure_lazy_linger(args.ack_linger_us / 1_000_000)
