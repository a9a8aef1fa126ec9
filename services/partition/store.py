"""The partition's Redis layout and the group commit that makes writes durable in batches.

Keys (p = partition number, cid = client id):
    hx:{p}:sessions      hash  cid -> SessionRecord
    hx:{p}:subs:{cid}    hash  topic filter -> SubscriptionSpec
    hx:{p}:q:{cid}       hash  message id (decimal) -> QueuedMessage
    hx:{p}:retained      hash  topic -> Message (the topic's retained message; p = partition(topic))
Every key of a partition starts with hx:{p}: so a partition can be moved or dropped as a whole.

Durability: Redis runs with appendonly yes and appendfsync everysec. Redis writes the AOF buffer
to the file before it replies, so an acknowledged write survives the Redis process being killed;
a machine crash can lose up to a second, which replication across nodes covers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import redis.asyncio as redis

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb

log = logging.getLogger(__name__)


def sessions_key(p: int) -> str:
    return f"hx:{p}:sessions"


def subs_key(p: int, cid: str) -> str:
    return f"hx:{p}:subs:{cid}"


def queue_key(p: int, cid: str) -> str:
    return f"hx:{p}:q:{cid}"


def retained_key(p: int) -> str:
    return f"hx:{p}:retained"


@dataclass(slots=True)
class StoredSession:
    record: pb.SessionRecord
    subscriptions: list[pb.SubscriptionSpec]
    queue: list[pb.QueuedMessage] = field(default_factory=list)


class StorageFailed(RuntimeError):
    """A batch could not be made durable. The partition stops (fail-stop) so that its memory
    never runs ahead of what Redis holds; on restart it reloads from Redis."""


Action = Callable[[], None]


class GroupCommit:
    """Collects the writes of many commands into one MULTI/EXEC pipeline and runs each
    command's follow-up actions (results, deliveries) only after that pipeline is durable.

    Batches commit strictly one after another and actions run in the order they were added, so
    the order in which commands were handled is the order in which edges hear of them, and
    nothing leaves this node before it is stored ("persist before you acknowledge" lives here).
    """

    def __init__(self, client: redis.Redis, on_failure: Callable[[BaseException], None]) -> None:
        self._client = client
        self._on_failure = on_failure
        self._pipe: redis.client.Pipeline | None = None
        self._actions: list[Action] = []
        # (sink, request id) pairs answered OK once durable: cheaper than an action each.
        self._oks: list[tuple[Callable[[int], None], int]] = []
        self._finishers: list[Callable[[redis.client.Pipeline], None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.batches = 0
        self.commands = 0

    @property
    def pipe(self) -> redis.client.Pipeline:
        """The pipeline of the batch being gathered; writes added now commit together."""
        if self._pipe is None:
            self._pipe = self._client.pipeline(transaction=True)
        self._wake.set()
        return self._pipe

    def after(self, action: Action) -> None:
        """Run `action` once everything written so far is durable."""
        self._actions.append(action)
        self._wake.set()

    @property
    def gathering(self) -> int:
        """Writes in the batch being gathered (not yet sent to Redis)."""
        return len(self._pipe) if self._pipe is not None else 0

    def after_ok(self, sink: Callable[[int], None], request_id: int) -> None:
        """Call `sink(request_id)` once everything written so far is durable (after the
        batch's actions)."""
        self._oks.append((sink, request_id))
        self._wake.set()

    def add_finisher(self, finisher: Callable[[redis.client.Pipeline], None]) -> None:
        """`finisher(pipe)` adds its last writes to every batch just before it commits (e.g.
        one session record per batch instead of one per message)."""
        self._finishers.append(finisher)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        """Commit what is gathered, then stop."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            await self._flush()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._flush()

    async def _flush(self) -> None:
        pipe, actions, oks = self._pipe, self._actions, self._oks
        self._pipe, self._actions, self._oks = None, [], []
        if pipe is not None:
            for finisher in self._finishers:
                finisher(pipe)
        if pipe is not None and len(pipe) > 0:
            self.commands += len(pipe)
            self.batches += 1
            try:
                await pipe.execute()
            except (redis.RedisError, OSError) as exc:
                self._on_failure(StorageFailed(f"redis write failed: {exc}"))
                return
        for action in actions:
            action()
        for sink, request_id in oks:
            sink(request_id)


class RedisStore:
    """Writes go onto a GroupCommit pipeline; reads happen only when a partition is loaded."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    @staticmethod
    def put_session(pipe: redis.client.Pipeline, p: int, record: pb.SessionRecord) -> None:
        pipe.hset(sessions_key(p), record.client_id, record.SerializeToString())

    @staticmethod
    def delete_session(pipe: redis.client.Pipeline, p: int, cid: str) -> None:
        pipe.hdel(sessions_key(p), cid)
        pipe.delete(subs_key(p, cid), queue_key(p, cid))

    @staticmethod
    def put_subscription(
        pipe: redis.client.Pipeline, p: int, cid: str, spec: pb.SubscriptionSpec
    ) -> None:
        pipe.hset(subs_key(p, cid), spec.filter, spec.SerializeToString())

    @staticmethod
    def delete_subscriptions(
        pipe: redis.client.Pipeline, p: int, cid: str, filters: Iterable[str]
    ) -> None:
        names = list(filters)
        if names:
            pipe.hdel(subs_key(p, cid), *names)

    @staticmethod
    def put_message(pipe: redis.client.Pipeline, p: int, cid: str, qm: pb.QueuedMessage) -> None:
        pipe.hset(queue_key(p, cid), str(qm.message_id), qm.SerializeToString())

    @staticmethod
    def delete_messages(
        pipe: redis.client.Pipeline, p: int, cid: str, message_ids: Iterable[int]
    ) -> None:
        names = [str(mid) for mid in message_ids]
        if names:
            pipe.hdel(queue_key(p, cid), *names)

    @staticmethod
    def put_retained(pipe: redis.client.Pipeline, p: int, msg: common_pb.Message) -> None:
        pipe.hset(retained_key(p), msg.topic, msg.SerializeToString())

    @staticmethod
    def delete_retained(pipe: redis.client.Pipeline, p: int, topic: str) -> None:
        pipe.hdel(retained_key(p), topic)

    async def load_retained(self, p: int) -> list[common_pb.Message]:
        raw = cast("dict[bytes, bytes]", await self.client.hgetall(retained_key(p)))
        return [common_pb.Message.FromString(v) for v in raw.values()]

    async def load_partition(self, p: int) -> list[StoredSession]:
        """Every session of partition p with its subscriptions and queue (queue in id order)."""
        # The client runs with decode_responses off: keys and values are bytes.
        raw = cast("dict[bytes, bytes]", await self.client.hgetall(sessions_key(p)))
        if not raw:
            return []
        records = [pb.SessionRecord.FromString(value) for value in raw.values()]
        pipe = self.client.pipeline(transaction=False)
        for record in records:
            pipe.hgetall(subs_key(p, record.client_id))
            pipe.hgetall(queue_key(p, record.client_id))
        replies = await pipe.execute()
        loaded = []
        for i, record in enumerate(records):
            subs = [pb.SubscriptionSpec.FromString(v) for v in replies[2 * i].values()]
            queue = sorted(
                (pb.QueuedMessage.FromString(v) for v in replies[2 * i + 1].values()),
                key=lambda qm: qm.message_id,
            )
            loaded.append(StoredSession(record, subs, queue))
        return loaded
