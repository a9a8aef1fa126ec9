"""RedisStore: what the partition service reads from its node's Redis (the layout:
services/partition/keys.py): the partitions a master loads, this node's replication positions,
a partition's keys and its state as snapshot chunks for a follower. Writes do not come here:
handlers record them as storage ops on a WriteBatch (write_batch.py) and the group commit
(group_commit.py) or a follower's writer (peers.py) sends them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import cast

import redis.asyncio as redis

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.keys import (
    handoff_key,
    meta_key,
    qos2_seen_key,
    retained_key,
    session_keys,
    sessions_key,
)
from services.partition.redis_access import RedisAccess
from services.partition.replication import HSET, NOWHERE, Op, Stored, history_of
from services.partition.stored import StoredPartition, StoredSession
from services.partition.write_batch import parse_history

# Connections to the node's Redis at most. Reads for snapshots run concurrently with the group
# commit and the loads; after a churn of views a master can owe dozens of snapshots at once.
REDIS_CONNECTIONS = 64

__all__ = ["REDIS_CONNECTIONS", "RedisStore", "StoredPartition", "StoredSession", "redis_client"]


def redis_client(
    url: str,
    timeout: float,
    *,
    max_connections: int = REDIS_CONNECTIONS,
    access: RedisAccess | None = None,
) -> redis.Redis:
    """The partition service's Redis client. Timeouts stated, not redis-py's defaults (none): a
    Redis that stops answering fails a command within `timeout`, and the service stops
    (fail-stop: its partitions fail over). The pool makes a command wait for a free connection
    (up to `timeout` too) rather than fail: redis-py's default pool raises "Too many
    connections" past 100, which stopped a node that owed 127 snapshots after a churn of views
    (fault suite, seed 2001 replayed).

    The two writers of the hot path (the group commit and the follower's writes) use
    redis_tx.RedisTransactions instead, each MULTI/EXEC bounded as a whole (`timed_execute`);
    both take the same `access` (user, password, TLS: services/partition/redis_access.py)."""
    pool = redis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        **(access or RedisAccess()).pool_options(url),
    )
    return redis.Redis.from_pool(pool)  # owns the pool: aclose() closes its connections


class RedisStore:
    """Reads happen when a partition is loaded (master), when a follower drops a partition for
    a snapshot and when a master reads one for a follower."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    async def load_positions(self, partitions: Sequence[int]) -> dict[int, Stored]:
        """This node's replication position and epoch history of each partition (NOWHERE and
        no history if it holds none; data stored before histories existed gets one)."""
        pipe = self.client.pipeline(transaction=False)
        for p in partitions:
            pipe.hmget(meta_key(p), ["epoch", "seq", "history"])
        replies = await pipe.execute()
        stored = {}
        for p, (epoch, seq, history) in zip(partitions, replies, strict=True):
            position = (int(epoch), int(seq)) if epoch is not None and seq else NOWHERE
            stored[p] = Stored(position, history_of(position, parse_history(history)))
        return stored

    async def partition_keys(self, p: int) -> list[str]:
        """Every key partition p has here."""
        cids = cast("list[bytes]", await self.client.hkeys(sessions_key(p)))
        keys = [sessions_key(p), retained_key(p), qos2_seen_key(p), handoff_key(p), meta_key(p)]
        for raw in cids:
            keys += session_keys(p, raw.decode())
        return keys

    async def snapshot_chunks(self, p: int, chunk_ops: int) -> AsyncIterator[list[Op]]:
        """Partition p's stored state as HSET ops, about `chunk_ops` at a time, read with HSCAN
        so that no single read holds a large partition in memory at once."""
        chunk: list[Op] = []
        key = sessions_key(p)
        async for cid, record in self._hscan(key, chunk_ops):
            chunk.append((HSET, key, cid, record))
            for sub_key in session_keys(p, cid.decode()):
                async for fld, value in self._hscan(sub_key, chunk_ops):
                    chunk.append((HSET, sub_key, fld, value))
                    if len(chunk) >= chunk_ops:
                        yield chunk
                        chunk = []
            if len(chunk) >= chunk_ops:
                yield chunk
                chunk = []
        for key in (retained_key(p), qos2_seen_key(p), handoff_key(p)):
            async for fld, value in self._hscan(key, chunk_ops):
                chunk.append((HSET, key, fld, value))
                if len(chunk) >= chunk_ops:
                    yield chunk
                    chunk = []
        if chunk:
            yield chunk

    async def _hscan(self, key: str, count: int) -> AsyncIterator[tuple[bytes, bytes]]:
        async for fld, value in self.client.hscan_iter(key, count=count):
            yield cast("bytes", fld), cast("bytes", value)

    async def load_partitions(self, partitions: Sequence[int]) -> dict[int, StoredPartition]:
        """Everything of these partitions a master holds in memory, in two round trips for the
        lot: sessions with their subscriptions, queues (in id order) and inbound QoS 2 state;
        retained messages; remembered QoS 2 origins (oldest first); stored handoffs."""
        # The client runs with decode_responses off: keys and values are bytes.
        pipe = self.client.pipeline(transaction=False)
        for p in partitions:
            pipe.hgetall(sessions_key(p))
            pipe.hgetall(retained_key(p))
            pipe.hgetall(qos2_seen_key(p))
            pipe.hgetall(handoff_key(p))
        first = await pipe.execute()
        loaded: dict[int, StoredPartition] = {}
        records: list[tuple[int, pb.SessionRecord]] = []
        for i, p in enumerate(partitions):
            sessions_raw, retained_raw, seen_raw, handoffs_raw = first[4 * i : 4 * i + 4]
            records += [(p, pb.SessionRecord.FromString(v)) for v in sessions_raw.values()]
            loaded[p] = StoredPartition(
                retained=[common_pb.Message.FromString(v) for v in retained_raw.values()],
                seen=sorted(((k, int(v)) for k, v in seen_raw.items()), key=lambda kv: kv[1]),
                handoffs=sorted(
                    (pb.SharedHandoff.FromString(v) for v in handoffs_raw.values()),
                    key=lambda h: h.handoff_id,
                ),
            )
        if records:
            pipe = self.client.pipeline(transaction=False)
            for p, record in records:
                for key in session_keys(p, record.client_id):
                    pipe.hgetall(key)
            replies = await pipe.execute()
            for i, (p, record) in enumerate(records):
                subs_raw, queue_raw, q2in_raw = replies[3 * i : 3 * i + 3]
                subs = [pb.SubscriptionSpec.FromString(v) for v in subs_raw.values()]
                queue = sorted(
                    (pb.QueuedMessage.FromString(v) for v in queue_raw.values()),
                    key=lambda qm: qm.message_id,
                )
                q2in = {int(k): pb.Qos2Inbound.FromString(v) for k, v in q2in_raw.items()}
                loaded[p].sessions.append(StoredSession(record, subs, queue, q2in))
        return loaded
