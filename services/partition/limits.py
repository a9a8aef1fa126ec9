"""The limits a partition master keeps (issue 25), and what they turned away."""

from __future__ import annotations

from dataclasses import dataclass

# A session's queue (issue 25): 1,000 messages as mosquitto's and EMQX's default, and a byte
# cap besides (a 16 KB message each time is 16 MB; a count alone let 1 MB messages grow one
# offline session to a gigabyte on every replica).
DEFAULT_MAX_QUEUED = 1_000
DEFAULT_MAX_QUEUED_BYTES = 16 * 1024 * 1024
# Subscriptions one session may hold (a client's 20,000 filters cost every edge and replica).
DEFAULT_MAX_SUBSCRIPTIONS = 1_000
# Retained messages of the whole cluster: each is held in memory and Redis on RF nodes.
DEFAULT_MAX_RETAINED_MESSAGES = 1_000_000
DEFAULT_MAX_RETAINED_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How many QoS >= 1 messages one session may hold (sent and unsent), and how many bytes
    (payload and topic), and which one goes when it is full: the newest is not queued
    (mosquitto's behaviour) or the oldest ones are dropped. Also the other limits a partition
    master keeps: subscriptions per session, and the cluster's retained messages (by count
    and bytes, shared among the nodes as their share of the partitions they master)."""

    max_queued_messages: int = DEFAULT_MAX_QUEUED
    drop_oldest: bool = False
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_retained_messages: int = DEFAULT_MAX_RETAINED_MESSAGES
    max_retained_bytes: int = DEFAULT_MAX_RETAINED_BYTES


@dataclass(slots=True)
class LimitCounts:
    """What the limits turned away, for $SYS and metrics (hexmq_limit_refusals_total)."""

    queued_messages: int = 0
    queued_bytes: int = 0
    subscriptions: int = 0
    retained_messages: int = 0
    retained_bytes: int = 0

    def counters(self) -> dict[str, int]:
        return {f"limits/{name}": getattr(self, name) for name in self.__slots__}
