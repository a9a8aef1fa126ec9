"""GroupCommit: the asyncio and Redis side of the group commit. Its core, the CommitQueue
(commit_queue.py), gathers the writes of many commands and the effects waiting on them and says
when a batch is due; this adapter waits as it says, writes each sealed batch in one MULTI/EXEC
with the partitions' new positions, hands the durable batch to replication and carries out
what the core releases.

Durability: Redis runs with appendonly yes and appendfsync everysec. Redis writes the AOF buffer
to the file before it replies, so an acknowledged write survives the Redis process being killed;
a machine crash can lose up to a second, which replication across nodes covers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, TypeAlias

import redis.asyncio as redis

from hexmq import telemetry
from hexmq.pacing import lazy_linger, removal_linger, wait_for_company
from hexmq.service import cancel_and_wait
from services.partition.commit_queue import (
    AnswerMoved,
    AnswerOks,
    AwaitCompany,
    AwaitPacing,
    CommitQueue,
    Released,
    Sealed,
)
from services.partition.redis_tx import TransactionClient, timed_execute
from services.partition.write_batch import apply_ops, put_position

if TYPE_CHECKING:
    from services.partition.effects import Effect
    from services.partition.replication import Entry, Replicator

log = logging.getLogger(__name__)

# Called with a batch's entries, its release token, the partitions it could not write and
# whether the batch was lazy, once durable here (the replication driver: it hands the token
# back to `release` once followers have it).
OnDurable: TypeAlias = "Callable[[list[Entry], object, frozenset[int], bool], None]"


def carry_out_released(released: Iterable[Released], carry_out: Callable[[Effect], None]) -> None:
    """Carry out, in order, what CommitQueue.release yields: answers are sent, effects go to
    `carry_out` (PartitionNode.carry_out)."""
    for item in released:
        if isinstance(item, AnswerOks):
            for sink, request_id, _scope in item.oks:
                sink(request_id)
        elif isinstance(item, AnswerMoved):
            item.reply(item.event)
        else:
            carry_out(item)


def release_batches(
    queue: CommitQueue,
    carry_out: Callable[[Effect], None],
    tokens: Iterable[tuple[object, frozenset[int]]],
) -> None:
    """Carry out the effects of batches that are now replicated (their tokens, each with the
    partitions aborted meanwhile), in order (CommitQueue.release). Needs only the queue and
    `carry_out`, so the replication driver is given it when built, before the GroupCommit,
    which needs the driver (for `on_durable`)."""
    carry_out_released(queue.release(tokens), carry_out)


class GroupCommit:
    """Commits the batches `queue` seals, strictly one after another (one MULTI/EXEC in flight),
    through `client`, with `replicator` sequencing each partition's writes as one log entry;
    hands each durable batch to `on_durable` (default: release it at once, without followers)
    and carries out what a release yields with `carry_out`. A failed write or a bug in the
    commit reports StorageFailed to `on_failure` and commits nothing more."""

    def __init__(
        self,
        queue: CommitQueue,
        client: TransactionClient,
        replicator: Replicator,
        carry_out: Callable[[Effect], None],
        on_failure: Callable[[BaseException], None],
        *,
        on_durable: OnDurable | None = None,
        write_timeout: float | None = None,
    ) -> None:
        self._queue = queue
        self._client = client
        self._replicator = replicator
        self._carry_out = carry_out
        self._on_failure = on_failure
        self._on_durable: OnDurable = on_durable or self._release_at_once
        # Set when `client` has no per-reply timeout (redis_tx.RedisTransactions): each
        # MULTI/EXEC then has this long in all.
        self._write_timeout = write_timeout
        # Set when something is gathered; `company` while something gathered is waited on.
        self._wake = asyncio.Event()
        self._company = asyncio.Event()
        queue.listen(self._gathered)
        self._linger = telemetry.METRICS.linger("group_commit")
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.commands = 0

    def _gathered(self, company: bool) -> None:
        if company:
            self._company.set()
        self._wake.set()

    def _release_at_once(
        self, _entries: list[Entry], token: object, aborted: frozenset[int], _lazy: bool
    ) -> None:
        self.release([(token, aborted)])

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        """Commit what is gathered, then stop."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            if not self._queue.failed:
                await self._commit(self._queue.seal())

    def release(self, tokens: Iterable[tuple[object, frozenset[int]]]) -> None:
        """Carry out the effects of batches that are now replicated (`release_batches`)."""
        release_batches(self._queue, self._carry_out, tokens)

    async def _run(self) -> None:
        queue = self._queue
        while True:
            await self._wake.wait()
            self._wake.clear()
            sealed = await self._due()
            if sealed is None:
                continue  # woken for what the last batch already took
            if not queue.company:
                self._company.clear()
            self._linger.record(sealed.gathered, sealed.lingered)
            try:
                await self._commit(sealed)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Memory may now be ahead of the store: stop, and reload from Redis on restart
                # (a commit task that died silently left the node taking writes it never made).
                log.exception("group commit failed")
                self._on_failure(queue.fail(f"group commit failed: {exc!r}"))
                return
            if queue.failed:
                # A write failed: later batches must not be written, nor their entries sent to
                # followers after the lost one (a gap in the log) while the service stops.
                return

    async def _due(self) -> Sealed | None:
        """Wait as the queue says until it hands over a batch (None: it has none)."""
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            step = queue.next(loop.time(), lazy_linger(), removal_linger())
            if isinstance(step, Sealed):
                return step
            if isinstance(step, AwaitCompany):
                if not queue.company:
                    # (Set by a lazy write that ends a wait for deferred ones sooner: the queue
                    # has given the new deadline.)
                    self._company.clear()
                await wait_for_company(self._company, step.until - loop.time())
            elif isinstance(step, AwaitPacing):
                await asyncio.sleep(step.until - loop.time())
            else:
                return None

    async def _commit(self, sealed: Sealed) -> None:
        entries: list[Entry] = []
        aborted: frozenset[int] = frozenset()
        if sealed.batch is not None:
            entries, aborted = self._replicator.propose(sealed.batch.ops, sealed.batch.origins)
        if entries:
            pipe = self._client.pipeline(transaction=True)
            for entry in entries:
                apply_ops(pipe, entry.ops)
                put_position(pipe, entry.partition, (entry.epoch, entry.seq), entry.history)
            self.commands += len(pipe)
            self.batches += 1
            try:
                await timed_execute(pipe, self._write_timeout)
            except (redis.RedisError, OSError) as exc:
                self._on_failure(self._queue.fail(f"redis write failed: {exc!r}"))
                return
        token = self._queue.durable(sealed, entries, aborted, time.time_ns())
        if token is not None:
            self._on_durable(entries, token, aborted, sealed.lazy)
