"""Batches that follow the load (issue 14): the pacer every batching stage asks when to send
(hexmq/pacing.py), the Redis commands a batch of storage ops becomes (services/partition/
store.py apply_ops), and one Delivery per session per released batch (services/partition/
delivery.py)."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import pytest

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.pacing import FlushPacer, Linger
from services.partition.commit_queue import CommitQueue
from services.partition.group_commit import GroupCommit
from services.partition.replication import DEL, HDEL, HSET, Op
from services.partition.write_batch import apply_ops
from tests.support.eventually import eventually
from tests.support.partition_harness import (
    EPOCH,
    Edge,
    P,
    SequencingReplicator,
    commit_queue,
    make_node,
    no_effects,
)

# ----- the pacer ----------------------------------------------------------------------------


def test_a_lone_batch_goes_at_once() -> None:
    pacer = FlushPacer(interval=0.001, full=10)
    assert pacer.delay(100.0, 1) == 0.0  # never sent before
    pacer.sent(100.0)
    # A quiet spell longer than the interval: the next one goes at once too.
    assert pacer.delay(100.0015, 1) == 0.0


def test_a_batch_soon_after_the_last_waits_out_the_interval() -> None:
    pacer = FlushPacer(interval=0.001, full=10)
    pacer.sent(100.0)
    assert math.isclose(pacer.delay(100.0004, 3), 0.0006)
    assert pacer.delay(100.001, 3) == 0.0


def test_a_full_batch_does_not_wait() -> None:
    pacer = FlushPacer(interval=0.001, full=10)
    pacer.sent(100.0)
    assert pacer.delay(100.0001, 10) == 0.0
    assert pacer.delay(100.0001, 9) > 0


def test_interval_zero_never_waits() -> None:
    pacer = FlushPacer(interval=0.0, full=10)
    pacer.sent(100.0)
    assert pacer.delay(100.0, 1) == 0.0


def test_bad_pacer_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="interval"):
        FlushPacer(interval=-0.001)
    with pytest.raises(ValueError, match="full"):
        FlushPacer(full=0)


def test_the_pacer_caps_batches_per_interval_whatever_the_rate() -> None:
    """A stage fed one item every 200 us (5,000/s) sends at most one batch per 1 ms interval,
    each of about five items, and no item waits longer than the interval."""
    pacer = FlushPacer(interval=0.001, full=1000)
    linger = Linger()
    now, waiting, due = 0.0, 0, 0.0
    first_waiting = 0.0
    worst = 0.0
    for i in range(5000):
        arrival = i * 0.0002
        if waiting and due <= arrival:
            pacer.sent(due)
            linger.record(waiting, due - now)
            worst = max(worst, due - first_waiting)
            waiting = 0
        if not waiting:
            first_waiting = now = arrival
            due = arrival + pacer.delay(arrival, 1)
        waiting += 1
    assert linger.batches <= 1000 + 1
    assert 4 <= linger.items / linger.batches <= 6
    assert worst <= 0.001 + 1e-9


def test_linger_exports_to_its_counters() -> None:
    class Count:
        def __init__(self) -> None:
            self.value = 0.0

        def inc(self, amount: float = 1) -> None:
            self.value += amount

    batches, items, seconds = Count(), Count(), Count()
    linger = Linger(exported=(batches, items, seconds))
    linger.record(3, 0.0005)
    linger.record(1, 0.0)
    assert (linger.batches, linger.items) == (2, 4)
    assert (batches.value, items.value, seconds.value) == (2, 4, 0.0005)


# ----- storage ops as Redis commands ----------------------------------------------------------


class RecordingPipe:
    """The three commands apply_ops uses, recorded and applied to a model of Redis hashes."""

    def __init__(self) -> None:
        self.commands: list[tuple[Any, ...]] = []
        self.hashes: dict[str, dict[bytes, bytes]] = {}

    def hset(self, key: str, mapping: dict[bytes, bytes]) -> None:
        self.commands.append(("HSET", key, dict(mapping)))
        self.hashes.setdefault(key, {}).update(mapping)

    def hdel(self, key: str, *fields: bytes) -> None:
        self.commands.append(("HDEL", key, fields))
        h = self.hashes.get(key, {})
        for f in fields:
            h.pop(f, None)
        if not h:
            self.hashes.pop(key, None)

    def delete(self, key: str) -> None:
        self.commands.append(("DEL", key))
        self.hashes.pop(key, None)


def one_by_one(ops: list[Op]) -> dict[str, dict[bytes, bytes]]:
    pipe = RecordingPipe()
    for kind, key, fld, value in ops:
        if kind == HSET:
            pipe.hset(key, {fld: value})
        elif kind == HDEL:
            pipe.hdel(key, fld)
        else:
            pipe.delete(key)
    return pipe.hashes


def test_interleaved_ops_become_one_command_per_key() -> None:
    """Two subscribers' messages queued in one batch, interleaved, then their session records:
    one HSET per key, not one per message."""
    ops: list[Op] = [
        (HSET, f"hx:{{3}}:q:{cid}", b"%d" % mid, b"m") for mid in range(1, 4) for cid in ("a", "b")
    ]
    ops += [(HSET, "hx:{3}:sessions", b"a", b"ra"), (HSET, "hx:{3}:sessions", b"b", b"rb")]
    pipe = RecordingPipe()
    apply_ops(pipe, ops)
    assert [c[:2] for c in pipe.commands] == [
        ("HSET", "hx:{3}:q:a"),
        ("HSET", "hx:{3}:q:b"),
        ("HSET", "hx:{3}:sessions"),
    ]
    assert pipe.hashes == one_by_one(ops)


@pytest.mark.parametrize("seed", range(200))
def test_grouped_ops_leave_redis_as_the_ops_one_by_one_do(seed: int) -> None:
    rng = random.Random(seed)
    keys = [f"hx:{{1}}:k{i}" for i in range(3)]
    fields = [b"f%d" % i for i in range(3)]
    ops: list[Op] = []
    for _ in range(rng.randrange(1, 30)):
        kind = rng.choice((HSET, HSET, HDEL, DEL))
        key = rng.choice(keys)
        if kind == DEL:
            ops.append((DEL, key, b"", b""))
        else:
            ops.append((kind, key, rng.choice(fields), b"v%d" % rng.randrange(100)))
    pipe = RecordingPipe()
    apply_ops(pipe, ops)
    assert pipe.hashes == one_by_one(ops)
    assert len(pipe.commands) <= len(ops)


# ----- deliveries ---------------------------------------------------------------------------


def test_messages_made_durable_together_leave_in_one_delivery_per_session() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    for cid in ("a", "b"):
        edge.command(
            cid,
            open_session=pb.OpenSession(
                client_id=cid, connection_id=f"{cid}1", session_expiry_s=600, receive_maximum=10
            ),
        )
        edge.command(
            cid,
            subscribe=pb.Subscribe(
                client_id=cid,
                connection_id=f"{cid}1",
                subscriptions=[pb.SubscriptionSpec(filter="t/#", qos=1)],
            ),
        )
    edge.handle(pb.EdgeCommand(index_ack=pb.IndexAck(seq=node.state.index.barrier.seq)))
    commit.durable()
    edge.heard()
    for i in range(3):
        message = cpb.Message(topic=f"t/{i}", payload=b"%d" % i, qos=1, publisher_id="p")
        edge.command(
            "p",
            publish=pb.Publish(
                message=message, targets=[pb.PartitionTarget(partition=P, epoch=EPOCH)]
            ),
        )
    commit.durable()
    results, deliveries = edge.heard()
    assert len(results) == 3
    assert sorted(d.client_id for d in deliveries) == ["a", "b"]
    for d in deliveries:
        assert [m.message.payload for m in d.messages] == [b"0", b"1", b"2"]
        assert [m.message_id for m in d.messages] == [1, 2, 3]


# ----- paced stages -------------------------------------------------------------------------


async def test_a_partition_link_sends_a_lone_answer_at_once_and_gathers_the_next_ones() -> None:
    from services.partition.links import MAX_EVENTS_PER_FRAME, EdgeLink

    link = EdgeLink("e1", 1, pacer=FlushPacer(interval=0.05, full=MAX_EVENTS_PER_FRAME))
    loop = asyncio.get_running_loop()
    link.ok(1)
    started = loop.time()
    first = await link.frames()
    assert list(first[0].ok_request_ids) == [1]
    assert loop.time() - started < 0.04  # nothing sent before: no wait

    async def answer_later() -> None:
        for rid in (2, 3, 4):
            link.ok(rid)
            await asyncio.sleep(0.005)

    feeder = asyncio.create_task(answer_later())
    second = await link.frames()
    await feeder
    # Within the interval after the first frame: the three answers leave together.
    assert list(second[0].ok_request_ids) == [2, 3, 4]
    assert loop.time() - started >= 0.045
    assert (link.linger.batches, link.linger.items) == (2, 4)


async def test_a_replication_feed_gathers_entries_within_the_interval() -> None:
    from services.partition.replication_feeds import MAX_ITEMS_PER_FRAME, Outbox

    outbox = Outbox(FlushPacer(interval=0.05, full=MAX_ITEMS_PER_FRAME))
    item = pb.ReplicationItem(start=pb.FeedStart(partition=1, epoch=1, from_seq=1))
    frames = outbox.frames()
    outbox.push([item])
    first = await anext(frames)
    assert len(first.items) == 1
    outbox.push([item])
    outbox.push([item, item])
    second = await anext(frames)
    assert len(second.items) == 3
    outbox.close()


# ----- lazy items wait for company ----------------------------------------------------------


@pytest.fixture
def lazy_linger_of_half_a_second() -> Any:
    from hexmq import pacing

    before = pacing.lazy_linger()
    pacing.configure_lazy_linger(0.5)
    yield
    pacing.configure_lazy_linger(before)


async def test_waiting_for_company_ends_when_it_comes_or_after_the_linger() -> None:
    from hexmq.pacing import wait_for_company

    company = asyncio.Event()
    assert await wait_for_company(company, 0.05) >= 0.045  # nobody came
    asyncio.get_running_loop().call_later(0.01, company.set)
    assert 0.005 <= await wait_for_company(company, 1.0) < 0.5
    assert await wait_for_company(company, 1.0) == 0.0  # already there
    assert await wait_for_company(asyncio.Event(), 0.0) == 0.0  # linger 0: never waits


class RecordingWriter:
    """Transactions recorded as the number of commands each had."""

    def __init__(self) -> None:
        self.executed: list[int] = []
        self._size = 0

    def pipeline(self, transaction: bool = True) -> RecordingWriter:
        self._size = 0
        return self

    def hset(self, *args: object, **kwargs: object) -> None:
        self._size += 1

    def hdel(self, *args: object) -> None:
        self._size += 1

    def delete(self, *args: object) -> None:
        self._size += 1

    def __len__(self) -> int:
        return self._size

    async def execute(self) -> list[object]:
        self.executed.append(self._size)
        return []


def recording_commit() -> tuple[CommitQueue, GroupCommit, RecordingWriter, list[bool]]:
    """A group commit over a RecordingWriter whose batches are released as soon as they are
    durable; the list says, per batch, whether it was lazy."""
    writer = RecordingWriter()
    durable: list[bool] = []

    def on_durable(entries: object, token: object, aborted: frozenset[int], lazy: bool) -> None:
        durable.append(lazy)
        commit.release([(token, aborted)])

    queue = commit_queue()
    commit = GroupCommit(
        queue, writer, SequencingReplicator(), no_effects, lambda exc: None, on_durable=on_durable
    )
    return queue, commit, writer, durable


async def test_a_batch_of_acknowledgements_alone_waits_for_company(
    lazy_linger_of_half_a_second: None,
) -> None:
    """A group commit holding only lazy writes (delivery acknowledgements) does not pay a
    MULTI/EXEC of its own while a write someone waits on may come within the linger; when one
    comes, both leave in one transaction, and the acknowledgement's answer is not delayed past
    it. Alone, they leave after the linger, marked lazy for the replication feed."""
    queue, commit, writer, durable = recording_commit()
    answered: list[int] = []
    commit.start()
    try:
        queue.lazy_batch.add(3, (HDEL, "hx:3:q:c", b"1", b""))
        queue.after_ok(answered.append, 1, lazy=True)
        await asyncio.sleep(0.05)
        assert writer.executed == []
        assert answered == []
        queue.batch.add(4, (HSET, "hx:4:q:d", b"9", b"m"))
        queue.after_ok(answered.append, 2)
        await eventually(lambda: bool(answered), 1.0, "the batch with company committed")
        assert answered == [1, 2]
        assert len(writer.executed) == 1  # one MULTI/EXEC for both
        assert durable == [False]
        loop = asyncio.get_running_loop()
        started = loop.time()
        queue.lazy_batch.add(3, (HDEL, "hx:3:q:c", b"2", b""))
        queue.after_ok(answered.append, 3, lazy=True)
        await eventually(lambda: len(answered) == 3, 2.0, "the lazy batch committed alone")
        assert loop.time() - started >= 0.49
        assert durable == [False, True]
    finally:
        await commit.stop()


@pytest.fixture
def removal_linger_of_a_third_of_a_second_and_no_lazy_linger() -> Any:
    from hexmq import pacing

    before = pacing.lazy_linger(), pacing.removal_linger()
    pacing.configure_lazy_linger(0.0)
    pacing.configure_removal_linger(0.3)
    yield
    pacing.configure_lazy_linger(before[0])
    pacing.configure_removal_linger(before[1])


async def test_deferred_removals_wait_for_the_next_write_up_to_the_removal_linger(
    removal_linger_of_a_third_of_a_second_and_no_lazy_linger: None,
) -> None:
    """Issue 28: QoS 1 removals alone (the deferred batch) wait for the next write even with
    no lazy linger, and both leave in one MULTI/EXEC; alone they leave after the removal
    linger; a lazy write that may not wait that long (a PUBCOMP's) ends the wait at once."""
    queue, commit, writer, durable = recording_commit()
    answered: list[int] = []
    loop = asyncio.get_running_loop()
    commit.start()
    try:
        queue.deferred_batch.add(3, (HDEL, "hx:3:q:c", b"1", b""))
        queue.after_ok(answered.append, 1, lazy=True, deferred=True)
        await asyncio.sleep(0.05)
        assert (writer.executed, answered) == ([], [])
        queue.batch.add(4, (HSET, "hx:4:q:d", b"9", b"m"))
        queue.after_ok(answered.append, 2)
        await eventually(lambda: len(answered) == 2, 1.0, "the batch with company committed")
        assert answered == [1, 2]
        assert len(writer.executed) == 1
        assert durable == [False]
        started = loop.time()
        queue.deferred_batch.add(3, (HDEL, "hx:3:q:c", b"2", b""))
        queue.after_ok(answered.append, 3, lazy=True, deferred=True)
        await eventually(lambda: len(answered) == 3, 2.0, "the deferred batch committed alone")
        assert loop.time() - started >= 0.29
        assert durable == [False, True]
        started = loop.time()
        queue.deferred_batch.add(3, (HDEL, "hx:3:q:c", b"3", b""))
        await asyncio.sleep(0.05)
        assert len(writer.executed) == 2
        queue.lazy_batch.add(3, (HDEL, "hx:3:q:c", b"4", b""))
        await eventually(lambda: len(writer.executed) == 3, 1.0, "the hurried batch committed")
        assert loop.time() - started < 0.25
        assert durable == [False, True, True]
    finally:
        await commit.stop()


async def test_a_replication_feed_holds_a_lazy_batch_until_company_or_the_linger(
    lazy_linger_of_half_a_second: None,
) -> None:
    from services.partition.replication_feeds import MAX_ITEMS_PER_FRAME, Outbox

    outbox = Outbox(FlushPacer(interval=0.0, full=MAX_ITEMS_PER_FRAME))
    loop = asyncio.get_running_loop()
    item = pb.ReplicationItem(start=pb.FeedStart(partition=1, epoch=1, from_seq=1))
    frames = outbox.frames()
    outbox.push([item], lazy=True)
    nxt = asyncio.ensure_future(anext(frames))
    await asyncio.sleep(0.05)
    assert not nxt.done()
    outbox.push([item, item])
    assert len((await nxt).items) == 3
    started = loop.time()
    outbox.push([item], lazy=True)
    assert len((await anext(frames)).items) == 1
    assert loop.time() - started >= 0.49
    outbox.close()
