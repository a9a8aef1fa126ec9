"""The edge's limits on clients: open connections, new connections per second, topic length
and levels.

The cap on open client connections (--max-connections) keeps one edge process from running
out of file descriptors (STACK.md: the open-file limit is 20,000 and cannot be raised).

Every client socket counts, on every listener, from the moment the ClientConnection starts (for
TLS: once the handshake is done; handshakes are bounded by the CONNECT timeout). Up to
--max-connections, clients are served. The next REFUSAL_SLOTS sockets are kept just long enough
to answer their CONNECT with CONNACK 0x97 Quota exceeded (5.0) or 3 Server unavailable (3.1.1);
beyond those, a new socket is closed as soon as it is accepted.
"""

from __future__ import annotations

import enum
import logging
import resource
import time
from dataclasses import dataclass

log = logging.getLogger("hexmq.edge")

# File descriptors kept for what is not a client: listening sockets, partition links (gRPC),
# logs, the metrics server, sockets still in their TLS handshake.
RESERVED_FDS = 256
# Connections over --max-connections that are held just long enough to read their CONNECT and
# answer why (CONNACK 0x97 / 3); past these, a new socket is closed as soon as it is accepted.
REFUSAL_SLOTS = 64


def fd_limit() -> int:
    """This process's open-file limit, raised to the hard limit when that is higher."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_ceiling() -> int:
    """The most client connections the open-file limit leaves room for."""
    return max(1, fd_limit() - RESERVED_FDS - REFUSAL_SLOTS)


class Admission(enum.Enum):
    ADMITTED = 1
    REFUSE = 2  # over the limit: answer the CONNECT with 0x97 (5.0) / 3 (3.1.1), then close
    DROP = 3  # far over: close at once


class ConnectionLimit:
    """Open client sockets, across every listener, against --max-connections."""

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.open = 0
        self.refused = 0
        self._warned_at = -1e9

    def admit(self) -> Admission:
        """Count a new socket (`release` uncounts it, whatever the verdict)."""
        self.open += 1
        if self.open <= self.maximum:
            return Admission.ADMITTED
        self.refused += 1
        now = time.monotonic()
        if now - self._warned_at >= 10:
            self._warned_at = now
            log.warning(
                "--max-connections %d reached: refusing new clients (%d refused so far)",
                self.maximum,
                self.refused,
            )
        if self.open <= self.maximum + REFUSAL_SLOTS:
            return Admission.REFUSE
        return Admission.DROP

    def release(self) -> None:
        self.open -= 1


class ConnectionRate:
    """New CONNECTs per second on this edge (--max-connection-rate): a token bucket holding up
    to one second's worth, so a burst of that size is served at once and the rate holds after.
    Over it, a client gets CONNACK 0x9F Connection rate exceeded (5.0) or 3 (3.1.1)."""

    def __init__(self, per_second: float) -> None:
        self.per_second = per_second
        self._tokens = per_second
        self._stamp: float | None = None

    def allow(self, now: float) -> bool:
        """Whether a CONNECT at `now` (monotonic seconds) is within the rate."""
        stamp = now if self._stamp is None else self._stamp
        self._tokens = min(self.per_second, self._tokens + (now - stamp) * self.per_second)
        self._stamp = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


# Levels of a topic name or filter (issue 25): 128, as EMQX's max_topic_levels. A filter of
# 32,000 levels cost every edge about 9 MiB in the subscription index, and its partition as
# much again; no real topic tree is this deep.
DEFAULT_MAX_TOPIC_LEVELS = 128


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """--max-topic-length (bytes of UTF-8) and --max-topic-levels (0: any number), for topic
    names and filters alike; the MQTT maximum of 65,535 bytes the codec already enforces."""

    max_length: int = 65535
    max_levels: int = DEFAULT_MAX_TOPIC_LEVELS

    def refusal(self, topic: str) -> str | None:
        """Why `topic` is over a limit, or None."""
        return self.which(topic)[1]

    def which(self, topic: str) -> tuple[str, str | None]:
        """(the limit's name for hexmq_limit_refusals_total, why `topic` is over it), or
        ("", None) when it is within both."""
        # A character is at most 4 bytes of UTF-8: short topics need no encoding.
        if len(topic) * 4 > self.max_length and len(topic.encode()) > self.max_length:
            return "topic_length", f"topic longer than {self.max_length} bytes"
        if self.max_levels and topic.count("/") >= self.max_levels:
            return "topic_levels", f"topic with more than {self.max_levels} levels"
        return "", None
