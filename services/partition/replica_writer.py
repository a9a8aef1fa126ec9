"""The follower's writes: what the state machine asks this node to persist as a follower
(`Persist`: entries and snapshot chunks of the partitions it follows, with their positions)
goes to this node's Redis by one writer task, many frames per MULTI/EXEC, and each is
reported durable to the state machine once written."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import redis.asyncio as redis

from hexmq import telemetry
from hexmq.pacing import FlushPacer
from services.partition.commit_queue import StorageFailed
from services.partition.redis_tx import TransactionClient, timed_execute
from services.partition.replication import Persist, Replicator
from services.partition.store import RedisStore
from services.partition.write_batch import apply_ops, put_position

# Replication frames' writes that make a follower's MULTI/EXEC worth sending without waiting out
# the pacing interval.
FULL_PERSIST = 64
# A follower writes at most about this many storage ops in one MULTI/EXEC (whole Persists:
# each is one transaction) and hands the state machine a frame's items in slices of about as
# many. redis-py packs a transaction's commands and reads its replies without yielding to the
# event loop: a node joining a loaded cluster, catching up on a hundred partitions at once, put
# every pending frame's writes in one transaction and stalled its loop for about a second, long
# enough for every agent's health probe to time out, and was removed as silent right after its
# admission.
MAX_OPS_PER_WRITE = 4096


def persists_within(persists: Sequence[Persist], max_ops: int) -> int:
    """How many of the first `persists` one transaction takes: as many as fit in `max_ops`
    storage ops, and at least one."""
    ops = 0
    for i, persist in enumerate(persists):
        ops += len(persist.ops)
        if ops > max_ops and i > 0:
            return i
    return len(persists)


class ReplicaWriter:
    """Writes the state machine's (`core`) Persists through `writer` (the store's client if
    None; with the service's transaction writer, services/partition/redis_tx.py, each
    MULTI/EXEC has `write_timeout` in all); `process` carries out what the core decided once
    they are durable (ReplicationDriver.process), `on_failure` hears a failed write (the
    service stops, and nothing more is written)."""

    def __init__(
        self,
        core: Replicator,
        store: RedisStore,
        process: Callable[[], None],
        on_failure: Callable[[BaseException], None],
        *,
        writer: TransactionClient | None = None,
        write_timeout: float | None = None,
    ) -> None:
        self._core = core
        self._store = store
        self._process = process
        self._on_failure = on_failure
        self._writer = writer
        self._write_timeout = write_timeout
        self._persist: list[Persist] = []
        self._wake = asyncio.Event()

    def add(self, persists: list[Persist]) -> None:
        """More to write, after what is waiting."""
        self._persist.extend(persists)
        self._wake.set()

    async def run(self) -> None:
        """Write what `add` hands over until cancelled or a write fails."""
        client = self._writer if self._writer is not None else self._store.client
        loop = asyncio.get_running_loop()
        pacer, linger = FlushPacer(full=FULL_PERSIST), telemetry.METRICS.linger("replica_write")
        while True:
            await self._wake.wait()
            self._wake.clear()
            # One MULTI/EXEC in flight, at most one per pacing interval (hexmq/pacing.py): the
            # frames that arrive meanwhile join it, up to MAX_OPS_PER_WRITE a transaction.
            delay = pacer.delay(loop.time(), len(self._persist))
            if delay:
                await asyncio.sleep(delay)
            pacer.sent(loop.time())
            while self._persist:
                count = persists_within(self._persist, MAX_OPS_PER_WRITE)
                batches = self._persist[:count]
                del self._persist[:count]
                linger.record(len(batches), delay)
                delay = 0.0
                if not await self._write(client, batches):
                    return

    async def _write(self, client: TransactionClient, batches: list[Persist]) -> bool:
        """One transaction of follower writes; False if it failed (the service stops)."""
        core = self._core
        timeout = self._write_timeout
        pipe = client.pipeline(transaction=True)
        try:
            for persist in batches:
                if persist.clear and len(pipe):
                    # Read what to drop only after the writes before it are in.
                    await timed_execute(pipe, timeout)
                    pipe = client.pipeline(transaction=True)
                for p in persist.clear:
                    pipe.delete(*await self._store.partition_keys(p))
                apply_ops(pipe, persist.ops)
                for p, pos in persist.positions.items():
                    put_position(pipe, p, pos, persist.histories.get(p))
            await timed_execute(pipe, timeout)
        except (redis.RedisError, OSError) as exc:
            self._on_failure(StorageFailed(f"redis write of replicated entries failed: {exc}"))
            return False
        for persist in batches:
            core.follower_durable(persist.id)
        self._process()
        return True
