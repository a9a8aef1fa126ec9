"""A partition as its master loads it from Redis (services/partition/store.py reads it;
services/partition/roles.py activates it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb


@dataclass(slots=True)
class StoredSession:
    record: pb.SessionRecord
    subscriptions: list[pb.SubscriptionSpec]
    queue: list[pb.QueuedMessage] = field(default_factory=list)
    qos2_inbound: dict[int, pb.Qos2Inbound] = field(default_factory=dict)


@dataclass(slots=True)
class StoredPartition:
    """A partition as a master loads it (RedisStore.load_partitions)."""

    sessions: list[StoredSession] = field(default_factory=list)
    retained: list[common_pb.Message] = field(default_factory=list)
    seen: list[tuple[bytes, int]] = field(default_factory=list)
    handoffs: list[pb.SharedHandoff] = field(default_factory=list)
