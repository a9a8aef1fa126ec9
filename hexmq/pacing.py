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

Lazy items. Some items wait on nothing: a QoS 1 delivery acknowledgement only removes a
message the client has, and the session's window has room. Each used to pay a whole round on
its own: its frame from the edge, a MULTI/EXEC, a replication frame to each follower and
their acknowledgements, about a third of the frames of a message at 3 nodes and RF 3 (issue
14). A stage whose queue holds only lazy items waits up to `lazy_linger()` (default 10 ms,
`--ack-linger-us`) for an item that someone waits on, and they all leave together; after the
linger they leave on their own. Their order against other items never changes.
"""

from __future__ import annotations

import argparse
import asyncio
import math
from dataclasses import dataclass, field
from typing import Protocol

# Interval per stage unless configured: at most 250 batches a second per stream; a message
# waits at most this long at one hop (seconds). 4 ms rather than 1: on one node at 1,000 msg/s
# it took 63% of the 2 cores against 104% (p50 6.5 against 2.1 ms, p99 about the same), and at
# 3 nodes RF 3 p99 54-79 against 390-411 ms (docs/benchmarks.md, "Fewer costs per batch").
DEFAULT_INTERVAL = 0.004
_interval = DEFAULT_INTERVAL
# How long lazy items wait for company at most (seconds).
DEFAULT_LAZY_LINGER = 0.010
_lazy_linger = DEFAULT_LAZY_LINGER


def configure(interval: float) -> None:
    """The interval of every pacer this process makes from now on (a service's
    --batch-interval-us, set once at start)."""
    global _interval
    if interval < 0:
        raise ValueError(f"the batch interval must be 0 or more, not {interval!r}")
    _interval = interval


def configured() -> float:
    return _interval


def configure_lazy_linger(linger: float) -> None:
    """How long this process's stages hold lazy items at most (--ack-linger-us)."""
    global _lazy_linger
    if linger < 0:
        raise ValueError(f"the lazy linger must be 0 or more, not {linger!r}")
    _lazy_linger = linger


def lazy_linger() -> float:
    return _lazy_linger


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
    interval: float = field(default_factory=configured)
    full: int = 256
    # When the last batch left (the stage's clock; -inf: never).
    last: float = -math.inf

    def __post_init__(self) -> None:
        if self.interval < 0:
            raise ValueError(f"the batch interval must be 0 or more, not {self.interval!r}")
        if self.full < 1:
            raise ValueError(f"a full batch has at least 1 item, not {self.full!r}")

    def delay(self, now: float, queued: int) -> float:
        """Seconds to wait before sending the `queued` items waiting now (0: send now)."""
        if queued >= self.full:
            return 0.0
        wait = self.last + self.interval - now
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
    configure(args.batch_interval_us / 1_000_000)
    configure_lazy_linger(args.ack_linger_us / 1_000_000)
