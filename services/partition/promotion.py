"""The adapter that loads promoted partitions from this node's Redis, then hands each to the
pure activation (services/partition/roles.py `activate`) and serves them.

A failover promotes many partitions at once: they are loaded LOAD_BATCH at a time (two Redis
round trips per batch, not per partition), and activated at most ACTIVATE_AT_ONCE sessions plus
queued messages between two turns of the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import redis.asyncio as redis

from hexmq.ranges import ranges
from services.partition import roles
from services.partition.commit_queue import StorageFailed
from services.partition.state import PartitionState
from services.partition.stored import StoredPartition

log = logging.getLogger(__name__)

# Partitions loaded together after a promotion.
LOAD_BATCH = 32
# Sessions plus queued messages made live between two turns of the event loop while promoted
# partitions are activated: a failover or a restore promotes a node's share of every session at
# once, and activating them in one go stalled the loop past the agents' probe timeout (the node
# was then removed as silent, and the flapping went on under load).
ACTIVATE_AT_ONCE = 2000


class PartitionReader(Protocol):
    """What a promotion reads (services/partition/store.py RedisStore)."""

    async def load_partitions(self, partitions: Sequence[int]) -> dict[int, StoredPartition]: ...


class PromotionLoader:
    def __init__(
        self,
        state: PartitionState,
        store: PartitionReader,
        serve: Callable[[Sequence[int]], None],
        on_failure: Callable[[BaseException], None],
        clock: Callable[[], int],
    ) -> None:
        self.state = state
        self.store = store
        # Called with partitions activated: they serve from now on (the adapter announces them
        # and handles the commands that waited for them).
        self._serve = serve
        self._on_failure = on_failure
        self._clock = clock
        # Partitions promoted (roles.promote) and not taken by a load yet.
        self._to_load: set[int] = set()
        self._task: asyncio.Task[None] | None = None

    def load(self, p: int) -> None:
        """Load p (promoted, and loading at its epoch), soon."""
        self._to_load.add(p)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._load(), name="loader")

    def drop(self, partitions: Sequence[int]) -> None:
        """These partitions are no longer to be loaded (demoted)."""
        self._to_load.difference_update(partitions)

    async def _load(self) -> None:
        loading = self.state.roles.loading
        while self._to_load:
            batch = sorted(self._to_load)[:LOAD_BATCH]
            self._to_load.difference_update(batch)
            epochs = {p: loading[p] for p in batch if p in loading}
            started = time.monotonic()
            try:
                loaded = await self.store.load_partitions(list(epochs))
            except (redis.RedisError, OSError) as exc:
                self._on_failure(StorageFailed(f"redis read of partitions {batch} failed: {exc}"))
                return
            served: list[int] = []
            serving: list[int] = []
            work = 0
            for p, epoch in epochs.items():
                # (Not activated if demoted, or promoted anew, meanwhile or while yielding.)
                part = loaded[p]
                if not roles.activate(self.state, p, epoch, part, self._clock()):
                    continue
                serving.append(p)
                work += len(part.sessions) + sum(len(s.queue) for s in part.sessions)
                if work >= ACTIVATE_AT_ONCE:
                    self._serve(serving)
                    served += serving
                    serving, work = [], 0
                    await asyncio.sleep(0)
            if serving:
                self._serve(serving)
                served += serving
            if served:
                log.info(
                    "master of partitions %s from now on (%d sessions loaded in %.0f ms)",
                    ranges(served),
                    sum(len(loaded[p].sessions) for p in served),
                    (time.monotonic() - started) * 1000,
                )
