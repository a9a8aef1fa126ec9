"""The replication driver's parts (services/partition/peers.py): the links to the masters this
node follows (master_link.MasterLinks), the streams it feeds as master
(replication_feeds.FollowerFeeds) and the follower's writer (replica_writer.ReplicaWriter),
each given the state machine and what it needs when built, and what `process` hands each."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from types import SimpleNamespace
from typing import Any, cast

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.trust.grpc_tls import ClusterTLS
from services.partition.master_link import MasterLinks
from services.partition.peers import ReplicationDriver
from services.partition.replication import HSET, Persist, Ready, SnapshotRead
from services.partition.replication_feeds import FollowerFeeds
from tests.unit.test_follower_writes import Transactions


class Core:
    """The state machine as the links see it: the masters it follows, links it closed."""

    def __init__(self) -> None:
        self.node_id = "n1"
        self.wanted: set[str] = set()
        self.closed: list[str] = []
        self.links: set[str] = set()

    def masters_followed(self) -> set[str]:
        return set(self.wanted)

    def link_open(self, master: str) -> list[pb.PartitionPosition]:
        return []

    def link_closed(self, master: str) -> None:
        self.closed.append(master)


async def test_links_follow_what_the_state_machine_follows() -> None:
    core = Core()
    spawned: list[tuple[Coroutine[Any, Any, None], str]] = []
    links = MasterLinks(
        cast(Any, core),
        tls=ClusterTLS.insecure(),
        incarnation=1,
        process=lambda: None,
        spawn=lambda work, name: spawned.append((cast(Any, work), name)),
    )
    # Nothing listens there: each link keeps dialling with backoff until stopped.
    links.set_peers({"n2": ("127.0.0.1:1", False), "n3": ("127.0.0.1:1", False)})
    assert links.members() == {"n2", "n3"}
    core.wanted = {"n2", "n4"}  # n4: no address in the view, no link
    links.relink()
    links.relink()  # again: nothing new
    assert (core.closed, spawned) == ([], [])
    core.wanted = set()
    links.relink()
    assert core.closed == ["n2"]
    assert [name for _work, name in spawned] == ["replica-link-stop"]
    await spawned[0][0]
    links.relink()
    assert core.closed == ["n2"]  # closed once
    await links.stop()


async def test_feeds_drop_items_for_a_follower_without_a_stream_and_close_reads() -> None:
    read_started = asyncio.Event()

    class Store:
        async def snapshot_chunks(self, p: int, chunk_ops: int) -> Any:
            read_started.set()
            await asyncio.Event().wait()  # a read that never ends
            yield []

    feeds = FollowerFeeds(
        cast(Any, SimpleNamespace()), cast(Any, Store()), lambda: None, lambda exc: None
    )
    feeds.push("n2", [pb.ReplicationItem()], lazy=False)  # no stream: nothing to do
    feeds.start_read(SnapshotRead("n2", 1, (1, 1), 1))
    await asyncio.wait_for(read_started.wait(), 10)
    reads = feeds.close()
    assert len(reads) == 1
    for task in reads:
        task.cancel()
    await asyncio.gather(*reads, return_exceptions=True)


async def test_the_driver_hands_what_to_persist_to_its_writer() -> None:
    durable: list[int] = []
    written = asyncio.Event()
    ready = [Ready(persist=[Persist(1, ops=[(HSET, "hx:1:k", b"f", b"v")], positions={})])]

    def follower_durable(persist_id: int) -> None:
        durable.append(persist_id)
        written.set()

    core = SimpleNamespace(
        ready=lambda: ready.pop() if ready else Ready(),
        follower_durable=follower_durable,
        tick=lambda: None,
    )
    client = Transactions()
    driver = ReplicationDriver(
        cast(Any, core),
        cast(Any, SimpleNamespace(client=client)),
        lambda exc: None,
        tls=ClusterTLS.insecure(),
    )
    driver.start()
    try:
        driver.process()
        await asyncio.wait_for(written.wait(), 10)
    finally:
        await driver.stop()
    assert durable == [1]
    assert client.sizes == [1]  # its one write, in one transaction
