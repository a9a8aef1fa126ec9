"""The partition's Redis layout and the group commit that makes writes durable in batches.

Keys (p = partition number, cid = client id):
    hx:{p}:sessions      hash  cid -> SessionRecord
    hx:{p}:subs:{cid}    hash  topic filter -> SubscriptionSpec
    hx:{p}:q:{cid}       hash  message id (decimal) -> QueuedMessage (a QoS 2 one that the
                               client has PUBREC'd: a released stub, without the message)
    hx:{p}:q2in:{cid}    hash  packet id (decimal) -> Qos2Inbound: the session's inbound QoS 2
                               packet ids, from the first PUBLISH until PUBREL
    hx:{p}:retained      hash  topic -> Message (the topic's retained message; p = partition(topic))
    hx:{p}:q2seen        hash  origin id -> unix ms (decimal): the QoS 2 routings this partition
                               stored as a target, until their claims are routed (qos2_seen.py)
    hx:{p}:handoff       hash  handoff id (decimal) -> SharedHandoff: shared-subscription
                               messages of a member whose session ended, until another member
                               has them (services/partition/redelivery.py)
    hx:{p}:meta          hash  epoch, seq: the replication position this node's copy stands at
Every key of a partition starts with hx:{p}: so a partition can be moved or dropped as a whole.

Writes are recorded as storage ops (services/partition/replication.py) on a WriteBatch; the group
commit sequences each partition's ops of a batch as one log entry, writes them to Redis with the
partition's new position in one MULTI/EXEC and streams them to the partition's followers, which
apply the same ops to their own Redis.

Durability: Redis runs with appendonly yes and appendfsync everysec. Redis writes the AOF buffer
to the file before it replies, so an acknowledged write survives the Redis process being killed;
a machine crash can lose up to a second, which replication across nodes covers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import redis.asyncio as redis

from hexmq import telemetry
from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.pacing import FlushPacer, lazy_linger, wait_for_company
from hexmq.service import cancel_and_wait
from services.partition.redis_access import RedisAccess
from services.partition.replication import (
    DEL,
    HDEL,
    HSET,
    NOWHERE,
    Entry,
    History,
    Op,
    Position,
    Replicator,
    Stored,
    history_of,
)

if TYPE_CHECKING:
    from services.partition.effects import Effect

log = logging.getLogger(__name__)


def sessions_key(p: int) -> str:
    return f"hx:{p}:sessions"


def subs_key(p: int, cid: str) -> str:
    return f"hx:{p}:subs:{cid}"


def queue_key(p: int, cid: str) -> str:
    return f"hx:{p}:q:{cid}"


def qos2_inbound_key(p: int, cid: str) -> str:
    return f"hx:{p}:q2in:{cid}"


def session_keys(p: int, cid: str) -> tuple[str, str, str]:
    """The keys a session owns besides its record."""
    return subs_key(p, cid), queue_key(p, cid), qos2_inbound_key(p, cid)


def retained_key(p: int) -> str:
    return f"hx:{p}:retained"


def qos2_seen_key(p: int) -> str:
    return f"hx:{p}:q2seen"


def handoff_key(p: int) -> str:
    return f"hx:{p}:handoff"


def meta_key(p: int) -> str:
    return f"hx:{p}:meta"


# Writes that make a group-commit batch worth sending without waiting out the pacing interval.
FULL_COMMIT = 1024

# Connections to the node's Redis at most. Reads for snapshots run concurrently with the group
# commit and the loads; after a churn of views a master can owe dozens of snapshots at once.
REDIS_CONNECTIONS = 64


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


class Commands(Protocol):
    """The part of a redis-py transaction pipeline the writers use: redis-py's own Pipeline, or
    a services/partition/redis_tx.Transaction (the hot path's writer)."""

    def hset(self, name: str, *, mapping: dict[Any, Any]) -> object: ...

    def hdel(self, name: str, *keys: str | bytes) -> object: ...

    def delete(self, *names: str) -> object: ...

    def __len__(self) -> int: ...

    async def execute(self) -> list[Any]: ...


class TransactionClient(Protocol):
    """What hands out transactions: a redis.Redis, or redis_tx.RedisTransactions."""

    def pipeline(self, transaction: bool = True) -> Commands: ...


# A deadline noticed this much later than it passed means this process was not running
# (stopped, or starved of CPU) around it.
STALL_S = 0.5


async def timed_execute(pipe: Commands, limit: float | None) -> None:
    """Run a pipeline within `limit` seconds in all (TimeoutError past it), for a writer
    without per-reply timeouts (redis_tx.RedisTransactions); None: the client's own per-reply
    timeouts apply.

    Time this process did not run does not count against Redis: when the deadline is noticed
    more than STALL_S after it passed (the process was stopped, as a paused node is, or
    starved), Redis's answer may be in the socket unread, and the pipeline gets `limit` again
    from then. A Redis that does not answer fails it all the same, `limit` later."""
    if limit is None:
        await pipe.execute()
        return
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as timeout:
        check: asyncio.TimerHandle

        def due(deadline: float) -> None:
            nonlocal check
            now = loop.time()
            if now - deadline > STALL_S:
                check = loop.call_at(now + limit, due, now + limit)
            else:
                timeout.reschedule(now)  # expires: the pipeline is cancelled, TimeoutError

        first = loop.time() + limit
        check = loop.call_at(first, due, first)
        try:
            await pipe.execute()
        finally:
            check.cancel()


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


class StorageFailed(RuntimeError):
    """A batch could not be made durable. The partition stops (fail-stop) so that its memory
    never runs ahead of what Redis holds; on restart it reloads from Redis."""


def _call(effect: Any) -> None:
    effect()


class WriteBatch:
    """The storage ops of the batch being gathered, per partition, in order."""

    __slots__ = ("ops", "origins", "size")

    def __init__(self) -> None:
        self.ops: dict[int, list[Op]] = {}
        # The origins of the QoS 1 publishes written, per partition (LogEntry.origins).
        self.origins: dict[int, list[bytes]] = {}
        self.size = 0

    def add_origin(self, p: int, origin: bytes) -> None:
        origins = self.origins.get(p)
        if origins is None:
            origins = self.origins[p] = []
        origins.append(origin)

    def add(self, p: int, op: Op) -> None:
        ops = self.ops.get(p)
        if ops is None:
            ops = self.ops[p] = []
        ops.append(op)
        self.size += 1


def apply_ops(pipe: Commands, ops: Sequence[Op]) -> None:
    """Queue storage ops on a Redis pipeline (the master's and the followers' one way), one
    command per key and run of one kind: the ops are taken key by key (in the order each key
    first appears, each key's own ops in their order: ops on different keys commute), and a
    run of HSETs or HDELs on one key becomes one command (a subscriber's queued messages in a
    batch, its acknowledgements, interleaved with other subscribers' in the batch). Fewer
    commands to encode and replies to read, same result."""
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        same = by_key.get(op[1])
        if same is None:
            by_key[op[1]] = [op]
        else:
            same.append(op)
    for key, key_ops in by_key.items():
        i, n = 0, len(key_ops)
        while i < n:
            kind, _key, fld, value = key_ops[i]
            j = i + 1
            if kind == HSET:
                mapping = {fld: value}
                while j < n and key_ops[j][0] == HSET:
                    mapping[key_ops[j][2]] = key_ops[j][3]
                    j += 1
                pipe.hset(key, mapping=mapping)
            elif kind == HDEL:
                fields = [fld]
                while j < n and key_ops[j][0] == HDEL:
                    fields.append(key_ops[j][2])
                    j += 1
                pipe.hdel(key, *fields)
            elif kind == DEL:
                pipe.delete(key)
            else:
                raise ValueError(f"unknown storage op kind {kind}")
            i = j


def put_position(pipe: Commands, p: int, pos: Position, history: History | None = None) -> None:
    """The partition's replication position (and its epoch history, when it changed)."""
    fields: dict[str, object] = {"epoch": pos[0], "seq": pos[1]}
    if history is not None:
        fields["history"] = format_history(history)
    pipe.hset(meta_key(p), mapping=fields)


def format_history(history: History) -> str:
    """ "epoch:first_seq,..." oldest first, as hx:{p}:meta's history field holds it."""
    return ",".join(f"{epoch}:{seq}" for epoch, seq in history)


def parse_history(raw: bytes | str | None) -> History:
    if not raw:
        return ()
    text = raw.decode() if isinstance(raw, bytes) else raw
    pairs = []
    for item in text.split(","):
        epoch, _, seq = item.partition(":")
        pairs.append((int(epoch), int(seq)))
    return tuple(pairs)


class Scope(NamedTuple):
    """What an action or acknowledgement added while handling one command belongs to: the
    partitions the command wrote and how to answer it. Should one of those partitions be
    aborted (this node stopped mastering it before the batch was released), the action is
    dropped and the command is answered MOVED instead, once."""

    partitions: frozenset[int]
    reply: Callable[[pb.PartitionEvent], None]
    request_id: int


class GroupCommit:
    """Collects the writes of many commands into one MULTI/EXEC pipeline and runs each
    command's follow-up actions (results, deliveries) only after that pipeline is durable here
    and replicated to every in-sync follower of the partitions it wrote.

    Batches commit strictly one after another and actions run in the order they were added, so
    the order in which commands were handled is the order in which edges hear of them, and
    nothing leaves this node before it is stored and replicated ("persist before you
    acknowledge" lives here and in Replicator.master_durable).

    While a command is handled, `scope` names it: what it adds is dropped, and the command is
    answered MOVED, if a partition it wrote is aborted (the node was deposed or handed the
    partition over before the batch was released: its writes there are never acknowledged).
    """

    def __init__(
        self,
        client: TransactionClient,
        replicator: Replicator,
        on_failure: Callable[[BaseException], None],
        *,
        write_timeout: float | None = None,
    ) -> None:
        self._client = client
        # Set when `client` has no per-reply timeout (redis_tx.RedisTransactions): each
        # MULTI/EXEC then has this long in all.
        self._write_timeout = write_timeout
        self._replicator = replicator
        self._on_failure = on_failure
        self._batch: WriteBatch | None = None
        self._actions: list[tuple[Effect, Scope | None]] = []
        # (sink, request id) pairs answered OK once durable: cheaper than an action each.
        self._oks: list[tuple[Callable[[int], None], int, Scope | None]] = []
        self._finishers: list[Callable[[WriteBatch], None]] = []
        self._release_hooks: list[Callable[[], None]] = []
        self._wake = asyncio.Event()
        # Set once the batch being gathered has a write or an effect someone waits on; a batch
        # of lazy writes alone (`lazy_batch`, `after_ok(lazy=True)`: acknowledgements) waits
        # for one up to the lazy linger (hexmq/pacing.py).
        self._company = asyncio.Event()
        self._pacer = FlushPacer(full=FULL_COMMIT)
        self._linger = telemetry.METRICS.linger("group_commit")
        self._task: asyncio.Task[None] | None = None
        # A batch could not be made durable: nothing more is written (the service stops).
        self.failed = False
        # The command being handled (set by the partition node around each handler).
        self.scope: Scope | None = None
        # What carries a released effect out: PartitionNode.carry_out (the default calls it,
        # for effects that are plain callables).
        self.carry_out: Callable[[Effect], None] = _call
        # Called with the batch's entries, its release token, the partitions it could not
        # write and whether the batch was lazy, once durable here; the replication driver
        # hands the token back to `release` once followers have it.
        self.on_durable: Callable[[list[Entry], object, frozenset[int], bool], None] = (
            lambda _e, token, aborted, _lazy: self.release([(token, aborted)])
        )
        self.releasing: _Released | None = None
        self.batches = 0
        self.commands = 0
        # Commands answered MOVED because a partition they wrote was aborted.
        self.moved = 0

    @property
    def batch(self) -> WriteBatch:
        """The batch being gathered; writes added now commit together."""
        self._company.set()
        return self.lazy_batch

    @property
    def lazy_batch(self) -> WriteBatch:
        """The batch being gathered, for writes nothing waits on: alone, they may wait up to
        the lazy linger for company."""
        if self._batch is None:
            self._batch = WriteBatch()
        self._wake.set()
        return self._batch

    def after(self, effect: Effect) -> None:
        """Carry `effect` out (services/partition/effects.py) once everything written so far is
        durable and replicated."""
        self._actions.append((effect, self.scope))
        self._company.set()
        self._wake.set()

    def pending(self) -> list[Effect]:
        """The effects added since the last batch went to Redis, in order (not the OKs)."""
        return [effect for effect, _scope in self._actions]

    @property
    def gathering(self) -> int:
        """Writes in the batch being gathered (not yet sent to Redis)."""
        return self._batch.size if self._batch is not None else 0

    def after_ok(self, sink: Callable[[int], None], request_id: int, *, lazy: bool = False) -> None:
        """Call `sink(request_id)` once everything written so far is durable (after the
        batch's actions). `lazy`: the edge does not wait on it."""
        self._oks.append((sink, request_id, self.scope))
        if not lazy:
            self._company.set()
        self._wake.set()

    def add_release_hook(self, hook: Callable[[], None]) -> None:
        """`hook()` runs after each `release`, once the actions of every batch it released ran
        (e.g. each session pumped once for all the messages those batches made durable)."""
        self._release_hooks.append(hook)

    def add_finisher(self, finisher: Callable[[WriteBatch], None]) -> None:
        """`finisher(batch)` adds its last writes to every batch just before it commits (e.g.
        one session record per batch instead of one per message)."""
        self._finishers.append(finisher)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="group-commit")

    async def stop(self) -> None:
        """Commit what is gathered, then stop."""
        if self._task is not None:
            await cancel_and_wait(self._task)
            if not self.failed:
                await self._flush()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        pacer, linger = self._pacer, self._linger
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._batch is None and not self._actions and not self._oks:
                continue  # woken for what the last batch already took
            # Lazy writes alone wait for company, up to the lazy linger.
            waited = await wait_for_company(self._company, lazy_linger())
            # One MULTI/EXEC in flight, and at most one per pacing interval (hexmq/pacing.py):
            # the writes of commands handled meanwhile join the batch.
            delay = pacer.delay(loop.time(), self.gathering)
            if delay:
                await asyncio.sleep(delay)
            pacer.sent(loop.time())
            linger.record(self.gathering, waited + delay)
            try:
                await self._flush()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # Memory may now be ahead of the store: stop, and reload from Redis on restart
                # (a commit task that died silently left the node taking writes it never made).
                log.exception("group commit failed")
                self.failed = True
                self._on_failure(StorageFailed(f"group commit failed: {exc!r}"))
                return
            if self.failed:
                # A write failed: later batches must not be written, nor their entries sent to
                # followers after the lost one (a gap in the log) while the service stops.
                return

    async def _flush(self) -> None:
        batch, actions, oks = self._batch, self._actions, self._oks
        self._batch, self._actions, self._oks = None, [], []
        lazy = not self._company.is_set()
        self._company.clear()
        entries: list[Entry] = []
        aborted: frozenset[int] = frozenset()
        if batch is not None:
            for finisher in self._finishers:
                finisher(batch)
            entries, aborted = self._replicator.propose(batch.ops, batch.origins)
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
                self.failed = True
                self._on_failure(StorageFailed(f"redis write failed: {exc!r}"))
                return
        if actions or oks or entries or aborted:
            token = _Released(actions, oks, time.time_ns(), {e.partition: e.seq for e in entries})
            self.on_durable(entries, token, aborted, lazy)

    def release(self, tokens: Iterable[tuple[object, frozenset[int]]]) -> None:
        """Run the follow-up actions of batches that are now replicated, in order, except
        those of commands that wrote an aborted partition (answered MOVED instead). While
        they run, `releasing` is the batch (for spans that cover its replication)."""
        for token, aborted in tokens:
            batch = cast("_Released", token)
            self.releasing = batch
            moved: set[tuple[int, int]] = set()
            carry_out = self.carry_out
            for action, scope in batch.actions:
                if aborted and scope is not None and not aborted.isdisjoint(scope.partitions):
                    self._answer_moved(scope, aborted, moved)
                    continue
                carry_out(action)
            for sink, request_id, scope in batch.oks:
                if aborted and scope is not None and not aborted.isdisjoint(scope.partitions):
                    self._answer_moved(scope, aborted, moved)
                    continue
                sink(request_id)
        self.releasing = None
        for hook in self._release_hooks:
            hook()

    def _answer_moved(
        self, scope: Scope, aborted: frozenset[int], answered: set[tuple[int, int]]
    ) -> None:
        key = (id(scope.reply), scope.request_id)
        if not scope.request_id or key in answered:
            return
        answered.add(key)
        self.moved += 1
        p = min(aborted & scope.partitions)
        scope.reply(
            pb.PartitionEvent(
                result=pb.Result(
                    request_id=scope.request_id,
                    status=pb.StatusCode.STATUS_CODE_MOVED,
                    message=f"partition {p} moved before this was acknowledged; send it again",
                )
            )
        )


@dataclass(slots=True)
class _Released:
    actions: list[tuple[Effect, Scope | None]]
    oks: list[tuple[Callable[[int], None], int, Scope | None]]
    # When the batch was durable here (unix ns), and the seq it got per partition.
    durable_ns: int
    seqs: dict[int, int]


class RedisStore:
    """Writes go onto a GroupCommit batch as storage ops; reads happen when a partition is
    loaded (master), when a follower drops a partition for a snapshot and when a master reads
    one for a follower."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    @staticmethod
    def put_session(batch: WriteBatch, p: int, record: pb.SessionRecord) -> None:
        batch.add(p, (HSET, sessions_key(p), record.client_id.encode(), record.SerializeToString()))

    @staticmethod
    def delete_session(batch: WriteBatch, p: int, cid: str) -> None:
        batch.add(p, (HDEL, sessions_key(p), cid.encode(), b""))
        for key in session_keys(p, cid):
            batch.add(p, (DEL, key, b"", b""))

    @staticmethod
    def put_subscription(batch: WriteBatch, p: int, cid: str, spec: pb.SubscriptionSpec) -> None:
        batch.add(p, (HSET, subs_key(p, cid), spec.filter.encode(), spec.SerializeToString()))

    @staticmethod
    def delete_subscriptions(batch: WriteBatch, p: int, cid: str, filters: Iterable[str]) -> None:
        key = subs_key(p, cid)
        for name in filters:
            batch.add(p, (HDEL, key, name.encode(), b""))

    @staticmethod
    def put_message(batch: WriteBatch, p: int, cid: str, qm: pb.QueuedMessage) -> None:
        batch.add(p, (HSET, queue_key(p, cid), b"%d" % qm.message_id, qm.SerializeToString()))

    @staticmethod
    def delete_messages(batch: WriteBatch, p: int, cid: str, message_ids: Iterable[int]) -> None:
        key = queue_key(p, cid)
        for mid in message_ids:
            batch.add(p, (HDEL, key, b"%d" % mid, b""))

    @staticmethod
    def put_qos2_inbound(
        batch: WriteBatch, p: int, cid: str, packet_id: int, state: pb.Qos2Inbound
    ) -> None:
        batch.add(p, (HSET, qos2_inbound_key(p, cid), b"%d" % packet_id, state.SerializeToString()))

    @staticmethod
    def delete_qos2_inbound(batch: WriteBatch, p: int, cid: str, packet_id: int) -> None:
        batch.add(p, (HDEL, qos2_inbound_key(p, cid), b"%d" % packet_id, b""))

    @staticmethod
    def put_qos2_seen(batch: WriteBatch, p: int, origin: bytes, stamp_ms: int) -> None:
        batch.add(p, (HSET, qos2_seen_key(p), origin, b"%d" % stamp_ms))

    @staticmethod
    def delete_qos2_seen(batch: WriteBatch, p: int, origin: bytes) -> None:
        batch.add(p, (HDEL, qos2_seen_key(p), origin, b""))

    @staticmethod
    def put_retained(batch: WriteBatch, p: int, msg: common_pb.Message) -> None:
        batch.add(p, (HSET, retained_key(p), msg.topic.encode(), msg.SerializeToString()))

    @staticmethod
    def delete_retained(batch: WriteBatch, p: int, topic: str) -> None:
        batch.add(p, (HDEL, retained_key(p), topic.encode(), b""))

    @staticmethod
    def put_handoff(batch: WriteBatch, p: int, handoff: pb.SharedHandoff) -> None:
        value = handoff.SerializeToString()
        batch.add(p, (HSET, handoff_key(p), b"%d" % handoff.handoff_id, value))

    @staticmethod
    def delete_handoff(batch: WriteBatch, p: int, handoff_id: int) -> None:
        batch.add(p, (HDEL, handoff_key(p), b"%d" % handoff_id, b""))

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
