"""A master reads at most SNAPSHOT_READS_AT_ONCE snapshots from Redis at once: a join asks for
many partitions together, and unbounded reads exhausted redis-py's connection pool, which
stopped the partition service (services/partition/peers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

from services.partition import peers
from services.partition.replication import SnapshotRead


class CountingStore:
    def __init__(self) -> None:
        self.reading = 0
        self.most = 0
        self.reads = 0

    async def snapshot_chunks(self, p: int, chunk_ops: int) -> AsyncIterator[list[Any]]:
        self.reading += 1
        self.most = max(self.most, self.reading)
        try:
            await asyncio.sleep(0.01)
            yield []
            self.reads += 1
        finally:
            self.reading -= 1


async def test_snapshot_reads_wait_for_a_slot() -> None:
    store = CountingStore()
    driver = peers.ReplicationDriver(
        cast(Any, SimpleNamespace()),
        cast(Any, store),
        cast(Any, SimpleNamespace(on_durable=None)),
        on_failure=lambda exc: None,
    )
    reads = [SnapshotRead("n2", p, (1, 1), p) for p in range(64)]
    await asyncio.gather(*(driver._read_snapshot(r) for r in reads))
    assert store.reads == 64
    assert store.most == peers.SNAPSHOT_READS_AT_ONCE
