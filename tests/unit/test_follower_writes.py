"""A follower writes replicated entries in transactions of at most about MAX_OPS_PER_WRITE
storage ops (services/partition/replica_writer.py), and steps a frame's items in slices of about
as many (services/partition/master_link.py).
redis-py packs a transaction and reads its replies without yielding to the event loop: a node
joining a loaded cluster wrote every pending frame of a hundred partitions in one transaction,
its loop stalled for about a second, every agent's health probe of it timed out, and it was
removed from the view as silent right after its admission (the rebalance benchmark, 4 joins of
4 at load 6-9 on 2 cores)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import grpc

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from services.partition import master_link, replica_writer
from services.partition.replication import HSET, Persist

MAX = replica_writer.MAX_OPS_PER_WRITE


def persist(n: int, ops: int) -> Persist:
    return Persist(
        n, ops=[(HSET, f"hx:{n % 7}:q:c{n}", b"%d" % i, b"v") for i in range(ops)], positions={}
    )


def test_a_transaction_takes_whole_persists_up_to_the_bound() -> None:
    backlog = [persist(n, 1000) for n in range(10)]
    assert replica_writer.persists_within(backlog, MAX) == MAX // 1000
    # One persist larger than the bound still goes, alone.
    assert replica_writer.persists_within([persist(1, 3 * MAX), persist(2, 1)], MAX) == 1
    assert replica_writer.persists_within([persist(1, 10), persist(2, 10)], MAX) == 2


def entry(ops: int) -> pb.ReplicationItem:
    return pb.ReplicationItem(
        entry=pb.LogEntry(
            partition=1,
            epoch=1,
            seq=1,
            ops=[pb.StorageOp(kind=HSET, key="hx:1:k", field=b"f", value=b"v")] * ops,
        )
    )


def test_a_frame_is_stepped_in_slices_of_about_the_bound() -> None:
    chunk = pb.ReplicationItem(snapshot=pb.SnapshotChunk(partition=1, packed_ops=b"x"))
    start = pb.ReplicationItem(start=pb.FeedStart(partition=1, epoch=1))
    items = [start, *(entry(100) for _ in range(100)), chunk, chunk]
    slices = list(master_link.item_slices(items, MAX))
    assert [x for s in slices for x in s] == items  # every item, in order
    assert len(slices) == 3  # 10,000 entry ops and two packed chunks counted as 512 each
    assert list(master_link.item_slices([entry(3 * MAX)], MAX)) == [[entry(3 * MAX)]]


class Transactions:
    """A Redis client whose transactions record how many commands each one held."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.between: list[int] = []  # what the other task had counted at each transaction
        self.ticks = 0

    def pipeline(self, transaction: bool) -> Any:
        client = self

        class Pipe:
            def __init__(self) -> None:
                self.commands = 0

            def __len__(self) -> int:
                return self.commands

            def hset(self, *args: Any, **kwargs: Any) -> None:
                self.commands += 1

            async def execute(self) -> None:
                client.sizes.append(self.commands)
                client.between.append(client.ticks)
                await asyncio.sleep(0)

        return Pipe()


async def test_a_follower_backlog_is_written_in_bounded_transactions() -> None:
    client = Transactions()
    durable: list[int] = []
    all_durable = asyncio.Event()

    def follower_durable(persist_id: int) -> None:
        durable.append(persist_id)
        if len(durable) == 40:
            all_durable.set()

    core = SimpleNamespace(follower_durable=follower_durable)
    replicas = replica_writer.ReplicaWriter(
        cast(Any, core),
        cast(Any, SimpleNamespace(client=client)),
        process=lambda: None,
        on_failure=lambda exc: None,
    )

    async def other_work() -> None:
        while True:
            client.ticks += 1
            await asyncio.sleep(0)

    # Distinct keys per op, so that apply_ops cannot merge them into fewer commands.
    backlog = [
        Persist(n, ops=[(HSET, f"hx:1:k{n}-{i}", b"f", b"v") for i in range(900)])
        for n in range(1, 41)
    ]
    writer = asyncio.create_task(replicas.run())
    ticker = asyncio.create_task(other_work())
    try:
        replicas.add(backlog)
        await all_durable.wait()
    finally:
        writer.cancel()
        ticker.cancel()
        await asyncio.gather(writer, ticker, return_exceptions=True)
    assert durable == [p.id for p in backlog]  # every persist, in order
    assert sum(client.sizes) == 40 * 900
    assert max(client.sizes) <= MAX, client.sizes  # one transaction held them all before
    assert len(client.sizes) >= 40 * 900 // MAX
    # The event loop ran other work between the transactions.
    assert all(b > a for a, b in zip(client.between, client.between[1:], strict=False))


class EndsAtOnce(pb_grpc.PartitionServiceServicer):
    """A master that takes the follower's hello and ends the stream without sending anything
    (as one failing on every join did)."""

    def __init__(self) -> None:
        self.streams = 0

    async def Replicate(self, request_iterator: Any, context: Any) -> Any:
        self.streams += 1
        await anext(aiter(request_iterator))
        return
        yield  # pragma: no cover - makes this a stream handler


async def test_a_stream_the_master_ends_at_once_is_retried_with_growing_backoff(
    monkeypatch: Any,
) -> None:
    server = grpc.aio.server()
    master = EndsAtOnce()
    pb_grpc.add_PartitionServiceServicer_to_server(master, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    waits: list[float] = []
    six = asyncio.Event()
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        if delay:
            waits.append(delay)
            if len(waits) == 6:
                six.set()
        await real_sleep(0)

    monkeypatch.setattr(master_link.asyncio, "sleep", sleep)
    core = SimpleNamespace(
        node_id="n2", link_open=lambda master: [], link_closed=lambda master: None, links=set()
    )
    link = master_link.MasterLink(
        cast(Any, core),
        "n1",
        f"127.0.0.1:{port}",
        dial=lambda master, target: grpc.aio.insecure_channel(target),
        incarnation=1,
        process=lambda: None,
    )
    link.start()
    try:
        await asyncio.wait_for(six.wait(), 30)
    finally:
        await link.stop()
        await server.stop(None)
    # Reset to the shortest backoff only by a frame from the master, never by a connect alone.
    assert waits[:6] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert master.streams >= 6
