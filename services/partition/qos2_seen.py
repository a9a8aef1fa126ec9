"""SeenOrigins: the QoS 2 routings a target partition has stored, by the claim's origin id.

An inbound QoS 2 message is claimed at its publisher's session partition, which gives the claim
an origin id (Qos2Inbound.origin). Every attempt at routing that claim (the first one, and a
resend that takes the claim over after the first attempt's edge died) carries the same origin
id in its Publish commands. A target partition remembers the origin ids it stored, in memory
and in hx:{p}:q2seen, written in the same batch as the enqueues (so replicated with them); a
Publish with a remembered origin is not stored again in that partition. So a retried routing
reaches each subscriber once. This class is the memory half; PartitionNode writes each change
to the batch (RedisStore.put_qos2_seen / delete_qos2_seen).

Once the claim is routed no attempt can be retried, and the edge tells the targets to forget the
origin (Qos2Forget). A forget that is lost (its edge died, its link dropped) leaves the origin
until the age sweep, after `retention_ms`; a retry later than that would be stored again.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_RETENTION_S = 24 * 3600.0


class SeenOrigins:
    """Per partition mastered here: origin id -> when it was stored (unix ms), oldest first."""

    def __init__(self, retention_ms: int = int(DEFAULT_RETENTION_S * 1000)) -> None:
        self.retention_ms = retention_ms
        self._by_partition: dict[int, dict[bytes, int]] = {}
        # Origins forgotten by Qos2Forget and by the sweep (for the metrics and tests).
        self.forgotten = 0
        self.swept = 0

    def __len__(self) -> int:
        return sum(len(seen) for seen in self._by_partition.values())

    def load(self, p: int, entries: Iterable[tuple[bytes, int]]) -> None:
        """Partition p's stored origins (as RedisStore.load_partitions gives them, oldest first)."""
        self._by_partition[p] = dict(entries)

    def unload(self, p: int) -> None:
        """Partition p is no longer mastered here."""
        self._by_partition.pop(p, None)

    def remembers(self, p: int, origin: bytes) -> bool:
        seen = self._by_partition.get(p)
        return seen is not None and origin in seen

    def admit(self, origin: bytes, partitions: Iterable[int], now_ms: int) -> set[int]:
        """The partitions among `partitions` that have not stored `origin` yet; each of them
        remembers it from now on (the caller writes that with the enqueues)."""
        fresh = set()
        for p in partitions:
            seen = self._by_partition.get(p)
            if seen is None:
                seen = self._by_partition[p] = {}
            elif origin in seen:
                continue
            seen[origin] = now_ms
            fresh.add(p)
        return fresh

    def forget(self, p: int, origin: bytes) -> bool:
        """No routing of `origin` can be retried: partition p lets it go. False if it did not
        remember it."""
        seen = self._by_partition.get(p)
        if seen is None or seen.pop(origin, None) is None:
            return False
        self.forgotten += 1
        return True

    def sweep(self, now_ms: int) -> list[tuple[int, bytes]]:
        """Let go of every origin stored more than `retention_ms` ago (the backstop for
        forgets that never came); returns them as (partition, origin)."""
        cutoff = now_ms - self.retention_ms
        gone: list[tuple[int, bytes]] = []
        for p, seen in self._by_partition.items():
            for origin, stamp in seen.items():
                if stamp > cutoff:
                    break  # oldest first: the rest are younger
                gone.append((p, origin))
        for p, origin in gone:
            del self._by_partition[p][origin]
        self.swept += len(gone)
        return gone
