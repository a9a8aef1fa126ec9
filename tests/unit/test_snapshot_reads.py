"""A master reads at most SNAPSHOT_READS_AT_ONCE snapshots from Redis at once: a join asks for
many partitions together, and unbounded reads exhausted redis-py's connection pool, which
stopped the partition service (services/partition/replication_feeds.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

import pytest

from services.partition import replication_feeds
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
    feeds = replication_feeds.FollowerFeeds(
        cast(Any, SimpleNamespace()),
        cast(Any, store),
        process=lambda: None,
        on_failure=lambda exc: None,
    )
    reads = [SnapshotRead("n2", p, (1, 1), p) for p in range(64)]
    await asyncio.gather(*(feeds.read_snapshot(r) for r in reads))
    assert store.reads == 64
    assert store.most == replication_feeds.SNAPSHOT_READS_AT_ONCE


class BrokenStore:
    async def snapshot_chunks(self, p: int, chunk_ops: int) -> AsyncIterator[list[Any]]:
        raise ValueError("a bug in the read")
        yield []  # pragma: no cover - makes this an async generator


async def test_a_snapshot_read_that_fails_is_started_again() -> None:
    """The follower's repeated joins no longer restart a snapshot under way (a slow read was
    restarted for good), so a read that fails for another reason than Redis must be."""
    lost: list[SnapshotRead] = []
    processed: list[None] = []
    core = SimpleNamespace(snapshot_lost=lost.append)
    feeds = replication_feeds.FollowerFeeds(
        cast(Any, core),
        cast(Any, BrokenStore()),
        process=lambda: processed.append(None),
        on_failure=lambda exc: pytest.fail(f"not a storage failure: {exc}"),
    )
    read = SnapshotRead("n2", 3, (1, 1), 7)
    await feeds.read_snapshot(read)
    assert lost == [read]
    assert processed  # what the state machine decided then is carried out
