"""Keepalive: when a connection that says nothing is ended (MQTT-3.1.2-24), and the CONNECT
timeout before it.

The timer is lazy: the session asks to be ticked at the earliest moment the connection could be
due, and a tick that finds a packet read since then asks again for the new moment, so reading a
packet costs one attribute write and no timer handle.
"""

from __future__ import annotations


class Keepalive:
    __slots__ = ("interval", "last_rx", "server_keep_alive")

    def __init__(self) -> None:
        # When the last bytes were read (monotonic seconds).
        self.last_rx = 0.0
        # The Keep Alive the connection runs on, in seconds (0: none).
        self.interval = 0
        # Set when --max-keepalive overrides the client's Keep Alive (5.0 Server Keep Alive).
        self.server_keep_alive: int | None = None

    def grant(self, asked: int, limit: int, v5: bool) -> bool:
        """Run on the client's Keep Alive within `limit` (--max-keepalive, 0: none): a 5.0
        client asking for more (or for none) is told the maximum as Server Keep Alive
        [MQTT-3.2.2-21]; False for a 3.1.1 client asking for more, which cannot be told."""
        self.interval = asked
        if not limit or 0 < asked <= limit:
            return True
        if not v5:
            return False
        self.interval = self.server_keep_alive = limit
        return True

    @property
    def limit(self) -> float:
        """Seconds without a packet that end the connection: 1.5 x Keep Alive."""
        return self.interval * 1.5

    def first_deadline(self) -> float | None:
        """When the first tick is due after CONNACK (None: Keep Alive 0, never)."""
        return self.last_rx + self.limit if self.interval else None

    def due(self, now: float) -> float | None:
        """None when the connection has been quiet too long; else when to look again."""
        idle = now - self.last_rx
        if idle >= self.limit:
            return None
        return now + self.limit - idle
