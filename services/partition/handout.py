"""Work a partition master hands to an edge because only an edge can route it (a due will to
publish; shared-subscription messages for a member in another partition): which edge gets it,
and handing it out again until that edge confirms.

The edge answers only once the work is done (every target partition stored it); without an
answer the work goes out again after HAND_OUT_RETRY_MS, to whichever edge is linked then. So
the work is done at least once, as QoS 1 wants.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from services.partition.links import EdgeLink

HAND_OUT_RETRY_MS = 10_000

K = TypeVar("K")


def pick_edge(node_id: str, links: dict[str, EdgeLink]) -> EdgeLink | None:
    """This node's own edge if it is linked, else the first linked one (None: no edge)."""
    link = links.get(node_id) or next(
        (links[name] for name in sorted(links) if not links[name].closed), None
    )
    if link is None or link.closed:
        return None
    return link


class HandOutClock(Generic[K]):
    """When each piece of work was last handed out: it goes out again only after
    HAND_OUT_RETRY_MS without an answer."""

    __slots__ = ("_at",)

    def __init__(self) -> None:
        self._at: dict[K, int] = {}

    def due(self, key: K, now_ms: int) -> bool:
        """True (and the hand-out is recorded) if `key` may be handed out now."""
        at = self._at.get(key)
        if at is not None and now_ms - at < HAND_OUT_RETRY_MS:
            return False
        self._at[key] = now_ms
        return True

    def forget(self, key: K) -> None:
        """Answered (or no longer wanted): the next hand-out of `key` is due at once."""
        self._at.pop(key, None)
