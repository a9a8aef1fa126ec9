"""UnreachableMasters: which live connections have waited too long for their session's master
(issue 30; DESIGN.md G9: a client that stays connected through a fault either gets every
acknowledged message within a bound after the heal, or is disconnected with a reason).

A connection waits while its session is not attached at a master the edge can reach: the
master is not in the edge's view, the link to it is down, or the re-attach that follows a move
is not answered (its master cannot take it, or the edge's view is behind). Such a connection
gets nothing: its commands are held (and refused past `--failover-hold`), its deliveries stop.
Within `--unreachable-disconnect` it stays connected (G7: never disconnected merely because its
node is on the minority side of a short split; most waits end with a re-attach). Past it the
edge ends it (5.0: DISCONNECT 0x89 Server busy with a Reason String; 3.1.1: a close), so that
the client reconnects, possibly through another node, and gets its queue there.

Pure: no asyncio, no I/O; `now` in seconds is passed in. The edge (services/edge/server.py)
sweeps every SWEEP_S seconds: it names the connections waiting then (`waits_for_master` on
each session of a partition PartitionCommands.unsettled() names), and ends those `sweep`
returns. A wait is counted from the first sweep that saw it, so a connection is ended between
the bound and the bound plus one sweep after its wait began.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

# How often the edge looks (and refreshes the metrics that show the waits and the links).
SWEEP_S = 1.0
# --unreachable-disconnect, when not given: this many times --failover-hold, and at least
# DEFAULT_FLOOR_S (a short hold is asked for to refuse publishes soon, not to end connections).
DEFAULT_HOLDS = 3
DEFAULT_FLOOR_S = 30.0

K = TypeVar("K", bound=Hashable)


def default_bound(failover_hold: float) -> float:
    return max(DEFAULT_HOLDS * failover_hold, DEFAULT_FLOOR_S)


def check_bound(bound: float, failover_hold: float) -> None:
    """0 (never) or at least the failover hold: a connection is not ended while its session's
    commands are still held and may yet be placed."""
    if bound != 0 and not bound >= failover_hold:
        raise ValueError(
            f"--unreachable-disconnect must be 0 (never) or at least --failover-hold "
            f"({failover_hold:g} s), not {bound:g}"
        )


class UnreachableMasters(Generic[K]):
    """The connections (by key) waiting for an unreachable master, since when."""

    def __init__(self, bound: float) -> None:
        if bound < 0:
            raise ValueError(f"the bound must be 0 (never) or more seconds, not {bound!r}")
        # 0: connections wait as long as it takes (the waits are still counted).
        self.bound = bound
        self._since: dict[K, float] = {}
        # Per key, the partition of the session waiting (the log and the reason name it).
        self._partition: dict[K, int] = {}

    def __len__(self) -> int:
        return len(self._since)

    def sweep(self, now: float, waiting: Mapping[K, int]) -> list[tuple[K, int, float]]:
        """`waiting`: the connections waiting now, each with its session's partition. Returns
        (connection, partition, seconds waited) for those that have waited `bound` seconds or
        more, oldest wait first, and forgets them; the others are remembered from the first
        sweep that saw them, and a connection not waiting now is forgotten (its next wait
        counts afresh)."""
        since = self._since
        for key in [k for k in since if k not in waiting]:
            del since[key]
            del self._partition[key]
        for key, partition in waiting.items():
            if key not in since:
                since[key] = now
            self._partition[key] = partition
        if not self.bound:
            return []
        deadline = now - self.bound
        due = sorted(((t, k) for k, t in since.items() if t <= deadline), key=_first)
        ended = []
        for started, key in due:
            ended.append((key, self._partition.pop(key), now - started))
            del since[key]
        return ended

    def longest(self, now: float) -> float:
        """How long the oldest wait has lasted (0 without any)."""
        return now - min(self._since.values()) if self._since else 0.0


def _first(pair: tuple[float, object]) -> float:
    return pair[0]
