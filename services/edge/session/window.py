"""InflightWindow: messages in flight one way on one connection, in count and in bytes.

MQTT's Receive Maximum bounds how many QoS 1 and 2 publishes may be unacknowledged in each
direction (3.3.4); a broker also bounds the bytes it holds for one client. One type serves both
directions: inbound (the client's publishes being stored, against our Receive Maximum and a
byte bound; services/edge/session/inbound.py) and outbound (our deliveries in flight to the
client, against the client's Receive Maximum; services/edge/session/outbound.py).
"""

from __future__ import annotations


class InflightWindow:
    """A count and a byte total against a maximum of each (0 bytes: no byte bound)."""

    __slots__ = ("bytes", "count", "max_bytes", "max_count")

    def __init__(self, max_count: int, max_bytes: int = 0) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.count = 0
        self.bytes = 0

    def add(self, size: int) -> None:
        self.count += 1
        self.bytes += size

    def remove(self, size: int) -> None:
        self.count -= 1
        self.bytes -= size

    @property
    def over(self) -> bool:
        """More in flight than the maximum count allows (a peer that broke Receive Maximum)."""
        return self.count > self.max_count

    @property
    def full(self) -> bool:
        """At the maximum count or past the byte bound: take no more for now."""
        return self.count >= self.max_count or (0 < self.max_bytes <= self.bytes)

    @property
    def low(self) -> bool:
        """Down to half of both bounds: time to take more again."""
        return self.count <= self.max_count // 2 and (
            not self.max_bytes or self.bytes <= self.max_bytes // 2
        )
