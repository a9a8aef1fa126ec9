"""Replication across real nodes: every partition's followers hold what its master holds, a
follower that was down catches up (from the master's log, or by a snapshot when the log no longer
reaches back), and sessions and queued messages survive `hexmq cluster kill` + `start` of any node
with RF 2 and 3."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from hexmq.api.common.v1 import common_pb2
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.hashring import assign, partition_of
from hexmq.mqtt import Disconnect, PingReq, PingResp, Properties, PubAck, Publish
from hexmq.trust.identity import EDGE, PARTITION, Identity
from tests.support import start_bounds
from tests.support.rawclient import RawClient
from tests.support.trust import cluster_aio_channel, node_redis
from tests.support.unique import uid

PARTITIONS = 32
NODES = ("n1", "n2", "n3")
PERSISTENT = Properties(session_expiry_interval=3600)


def client_id_where(prefix: str, rf: int, *, master: str, excluding: str | None = None) -> str:
    """A client id whose session partition is mastered by `master` (and not held by
    `excluding`, or held by it as a follower when excluding is None)."""
    table = assign(NODES, PARTITIONS, rf)
    for _ in range(10_000):
        cid = f"{prefix}-{uid()}"
        replicas = table[partition_of(cid, PARTITIONS)]
        if replicas[0] == master and (excluding is None or excluding not in replicas):
            return cid
    raise AssertionError("no client id found")


def partition_dump(cluster: Any, node: int, p: int) -> dict[str, dict[bytes, bytes]]:
    """Every key of partition p in node `node`'s Redis, as {key: hash}."""
    client = node_redis(cluster.dir, node, cluster.node(node)["redis_port"])
    try:
        return {key.decode(): client.hgetall(key) for key in client.scan_iter(match=f"hx:{p}:*")}
    finally:
        client.close()


def replication_rows(cluster: Any) -> list[dict[str, Any]]:
    rows = []
    for node in cluster.status()["nodes"]:
        parts = node.get("partitions") or {}
        for follower, row in parts.get("followers", {}).items():
            rows.append({"master": node["node_id"], "follower": follower, **row})
    return rows


async def wait_in_sync(cluster: Any, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Poll `hexmq cluster status` until every follower of every partition is in sync with no
    lag; returns the rows seen on the way (for asserting that lag was there and fell).
    `timeout` is for a quiet machine: it is scaled by the pace of this machine's cluster starts
    (catching up is startup work too)."""
    timeout = start_bounds.scaled(timeout)
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        rows = replication_rows(cluster)
        seen.append(rows)
        if rows and all(r["lag"] == 0 and r["in_sync"] == r["partitions"] for r in rows):
            return seen
        assert time.monotonic() < deadline, f"followers not in sync after {timeout}s: {rows}"
        await asyncio.sleep(0.3)


async def wait_until_out_of_view(cluster: Any, node: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        members = (cluster.status()["membership"] or {}).get("members", [])
        if not any(m["node_id"] == node and m["in_view"] for m in members):
            return
        assert time.monotonic() < deadline, f"{node} still in the view after {timeout}s"
        await asyncio.sleep(0.2)


def assert_converged(cluster: Any, rf: int) -> None:
    """Every follower's Redis holds exactly its master's copy of every partition. The $SYS
    topics are retained messages written every --sys-interval: one landing between the reads
    of master and follower is no divergence, so a partition that differs is read again (a
    few times) before it counts as one (make test under load saw it: the follower a write
    ahead of the master's earlier read)."""
    table = assign(NODES, PARTITIONS, rf)

    def dump(node_id: str, p: int) -> dict[str, dict[bytes, bytes]]:
        return partition_dump(cluster, int(node_id.removeprefix("n")), p)

    for p, replicas in enumerate(table):
        for attempt in range(5):
            master = dump(replicas[0], p)
            assert f"hx:{p}:meta" in master or not master, p
            copies = {f: dump(f, p) for f in replicas[1:]}
            if all(copy == master for copy in copies.values()) or attempt == 4:
                break
            time.sleep(0.2)
        for follower, copy in copies.items():
            assert copy == master, f"partition {p} on {follower}"


async def publish_many(port: int, client_id: str, topic: str, count: int) -> None:
    """`count` QoS 1 messages (payload = index), up to 200 in flight; every one acknowledged."""
    client, connack = await RawClient.connect(port, client_id, version=5)
    assert connack.reason_code == 0
    sent = 0
    while sent < count:
        window = range(sent, min(sent + 200, count))
        for i in window:
            await client.send(Publish(topic, str(i).encode(), qos=1, packet_id=i % 65535 + 1))
        for _ in window:
            ack = await client.expect(PubAck, timeout=30)
            assert ack.reason_code == 0, ack
        sent = window.stop
    await client.close()


async def receive_all(port: int, client_id: str, count: int) -> list[bytes]:
    client, connack = await RawClient.connect(
        port, client_id, version=5, clean_start=False, properties=PERSISTENT
    )
    assert connack.session_present is True
    payloads = []
    for _ in range(count):
        packet = await client.expect(Publish, timeout=30)
        payloads.append(packet.payload)
        assert packet.packet_id is not None
        await client.send(PubAck(packet.packet_id))
    await client.close()
    return payloads


async def park_subscriber(port: int, client_id: str, topic: str) -> None:
    """A persistent session subscribed to `topic`, then disconnected (its messages queue)."""
    client, _ = await RawClient.connect(
        port, client_id, version=5, clean_start=False, properties=PERSISTENT
    )
    assert (await client.subscribe(topic, qos=1)).reason_codes == (1,)
    await client.close()


@pytest.fixture(scope="module")
def rf3(hexmq_cluster_module):
    return hexmq_cluster_module(nodes=3, partitions=PARTITIONS, extra=["--rf", "3"])


async def test_roaming_subscriber_gets_1000_messages_in_order_on_a_third_node(rf3) -> None:
    topic = f"roam/{uid()}"
    sub_id = f"roam-{uid()}"
    await park_subscriber(rf3.mqtt_port(1), sub_id, topic)
    await publish_many(rf3.mqtt_port(2), f"pub-{uid()}", topic, 1000)
    payloads = await receive_all(rf3.mqtt_port(3), sub_id, 1000)
    assert payloads == [str(i).encode() for i in range(1000)]


async def test_followers_hold_exactly_what_their_master_holds(rf3) -> None:
    topic = f"conv/{uid()}"
    subs = [f"conv-{i}-{uid()}" for i in range(6)]
    for i, cid in enumerate(subs):
        await park_subscriber(rf3.mqtt_port(i % 3 + 1), cid, f"{topic}/#")
    await publish_many(rf3.mqtt_port(1), f"pub-{uid()}", f"{topic}/a", 300)
    # Retained messages live in partition(topic) and replicate like sessions.
    retainer, _ = await RawClient.connect(rf3.mqtt_port(3), f"ret-{uid()}", version=5)
    for i in range(20):
        await retainer.send(Publish(f"{topic}/r{i}", b"kept", qos=1, retain=True, packet_id=i + 1))
        assert (await retainer.expect(PubAck)).reason_code in (0, 0x10)
    await retainer.close()
    # Half the subscribers take their messages (acknowledgements delete them everywhere).
    for cid in subs[:3]:
        assert len(await receive_all(rf3.mqtt_port(2), cid, 300)) == 300
    await wait_in_sync(rf3)
    assert_converged(rf3, 3)
    retained = [
        p
        for p in range(PARTITIONS)
        for i in (1, 2, 3)
        if partition_dump(rf3, i, p).get(f"hx:{p}:retained")
    ]
    assert len(retained) >= 3 * len({partition_of(f"{topic}/r{i}", PARTITIONS) for i in range(20)})
    status = rf3.status()
    for node in status["nodes"]:
        assert node["partitions"]["roles"] == {
            "master": sum(1 for r in assign(NODES, PARTITIONS, 3) if r[0] == node["node_id"]),
            "follower": sum(1 for r in assign(NODES, PARTITIONS, 3) if node["node_id"] in r[1:]),
        }


@pytest.mark.parametrize(
    ("rf", "catch_up"),
    [(2, "log"), (3, "log"), (3, "snapshot")],
)
async def test_follower_down_during_10000_writes_catches_up(
    hexmq_cluster, rf: int, catch_up: str
) -> None:
    # 10,000 messages queue for one subscriber: more than the default cap of 1,000.
    extra = ["--rf", str(rf), "--partition-arg=--max-queued-messages=10000"]
    if catch_up == "snapshot":
        # The master keeps only 50 entries per partition: the follower is further behind.
        extra += ["--partition-arg=--replication-log-entries=50"]
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=extra)
    table = assign(NODES, PARTITIONS, rf)
    # The subscriber's session is mastered by n1 and followed by n3 (the node we stop); the
    # publisher's session lives away from n3, so writing goes on while n3 is down.
    sub_id = next(
        cid
        for cid in (f"catch-{uid()}" for _ in range(10_000))
        if table[partition_of(cid, PARTITIONS)][0] == "n1"
        and "n3" in table[partition_of(cid, PARTITIONS)]
    )
    pub_id = client_id_where("pub", rf, master="n2", excluding="n3" if rf == 2 else None)
    topic = f"catch/{uid()}"
    await park_subscriber(cluster.mqtt_port(1), sub_id, topic)
    await wait_in_sync(cluster)

    cluster.kill(3)
    await wait_until_out_of_view(cluster, "n3")
    await publish_many(cluster.mqtt_port(1), pub_id, topic, 10_000)
    sub_partition = partition_of(sub_id, PARTITIONS)
    # The view has dropped n3 from every replica list: no master counts or feeds it.
    assert not [r for r in replication_rows(cluster) if r["follower"] == "n3"]

    cluster.start(3)
    await wait_in_sync(cluster)
    assert_converged(cluster, rf)
    master_log = (cluster.dir / "node1" / "partition.log").read_text()
    # n3 came back as a follower with what it held: from the log while the master's still
    # reaches back that far, else by snapshot.
    snapshotted = re.search(
        rf"snapshot of partition {sub_partition} at \S+ \S+ sent to n3", master_log
    )
    assert bool(snapshotted) == (catch_up == "snapshot"), master_log[-2000:]
    if snapshotted:
        # Every member runs this release: the view has zlib-snapshots on, so the chunks are packed.
        line = master_log[snapshotted.start() :].splitlines()[0]
        assert ", zlib, " in line, line
    # The caught-up copy is the real thing: n3's own edge serves the whole queue in order.
    payloads = await receive_all(cluster.mqtt_port(3), sub_id, 10_000)
    assert payloads == [str(i).encode() for i in range(10_000)]


def probe_channel(cluster: Any, node_id: str, role: str, name: str) -> grpc.aio.Channel:
    """A channel to node_id's partition service, as (role, name) of the cluster's CA."""
    port = int(cluster.node(int(node_id[1:]))["partition_port"])
    return cluster_aio_channel(
        cluster.dir, f"127.0.0.1:{port}", Identity(PARTITION, node_id), role, name
    )


async def link_command(
    cluster: Any, node_id: str, cmd: pb.EdgeCommand, timeout: float = 10
) -> pb.Result:
    """Send one command over a fresh edge link (a probe edge of its own) to node_id's
    partition service."""
    edge_id = f"probe-{uid()}"

    async def frames() -> AsyncIterator[pb.EdgeFrame]:
        yield pb.EdgeFrame(hello=pb.Hello(edge_id=edge_id, edge_incarnation=1))
        yield pb.EdgeFrame(commands=[cmd])
        await asyncio.sleep(timeout + 20)  # keep the stream open until the answer is read

    async with probe_channel(cluster, node_id, EDGE, edge_id) as channel:
        call = pb_grpc.PartitionServiceStub(channel).Link(frames())
        async with asyncio.timeout(timeout):
            async for frame in call:
                for event in frame.events:
                    if event.HasField("result") and event.result.request_id == cmd.request_id:
                        call.cancel()
                        return event.result
                if cmd.request_id in frame.ok_request_ids:
                    call.cancel()
                    return pb.Result(request_id=cmd.request_id)
    raise AssertionError("no result")


async def test_misrouted_writes_are_refused_naming_the_master_and_never_applied(rf3) -> None:
    cid = f"fence-{uid()}"
    p = partition_of(cid, PARTITIONS)
    master = assign(NODES, PARTITIONS, 3)[p][0]
    other = next(n for n in NODES if n != master)

    def open_session(epoch: int) -> pb.EdgeCommand:
        return pb.EdgeCommand(
            request_id=7,
            partition=p,
            partition_epoch=epoch,
            open_session=pb.OpenSession(
                client_id=cid, connection_id="probe-1", session_expiry_s=600
            ),
        )

    wrong = await link_command(rf3, other, open_session(1))
    assert wrong.status == pb.StatusCode.STATUS_CODE_WRONG_MASTER
    assert (wrong.current_master, wrong.current_epoch) == (master, 1)
    assert f"partition {p}" in wrong.message
    # An epoch newer than the node's view: it waits for that view (its own may lag behind the
    # edge's), and refuses the command once it has waited WAIT_S for nothing.
    future = await link_command(rf3, master, open_session(99), timeout=15)
    assert future.status == pb.StatusCode.STATUS_CODE_UNAVAILABLE
    assert f"partition {p} is not served by {master} yet" in future.message
    # Neither created the session.
    client, connack = await RawClient.connect(
        rf3.mqtt_port(1), cid, version=5, clean_start=False, properties=PERSISTENT
    )
    assert connack.reason_code == 0
    assert connack.session_present is False
    await client.close()


async def test_links_from_a_process_sharing_no_protocol_version_are_refused(rf3) -> None:
    """An edge or a follower that speaks only versions this release does not is refused with
    FAILED_PRECONDITION naming both sides' versions, and the partition service says so in its
    log; one that says nothing (v0.2.0) speaks version 1 and is let in."""
    too_new = common_pb2.ProtocolSupport(min_version=9, max_version=9)
    edge_id = f"probe-{uid()}"

    async def first_answer(call: Any) -> tuple[grpc.StatusCode, str]:
        """The refusal's code and details, or OK once a frame came or the stream stayed open
        for 3 s."""
        try:
            async with asyncio.timeout(3):
                async for _ in call:
                    return grpc.StatusCode.OK, ""
        except TimeoutError:
            return grpc.StatusCode.OK, ""
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    async def edge_frames(
        protocol: common_pb2.ProtocolSupport | None,
    ) -> AsyncIterator[pb.EdgeFrame]:
        yield pb.EdgeFrame(hello=pb.Hello(edge_id=edge_id, edge_incarnation=1, protocol=protocol))
        await asyncio.sleep(30)

    async def follower_frames() -> AsyncIterator[pb.FollowerFrame]:
        # As n2's partition service (a member: the stream is refused for its protocol only).
        hello = pb.FollowerHello(node_id="n2", incarnation=1, protocol=too_new)
        yield pb.FollowerFrame(hello=hello)
        await asyncio.sleep(30)

    refused = "speaks protocol versions 9, this process speaks 1..2: no version in common"
    async with probe_channel(rf3, "n1", EDGE, edge_id) as channel:
        stub = pb_grpc.PartitionServiceStub(channel)
        code, details = await first_answer(stub.Link(edge_frames(too_new)))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert refused in details
        legacy = stub.Link(edge_frames(None))
        assert await first_answer(legacy) == (grpc.StatusCode.OK, "")
        legacy.cancel()
    async with probe_channel(rf3, "n1", PARTITION, "n2") as channel:
        stub = pb_grpc.PartitionServiceStub(channel)
        code, details = await first_answer(stub.Replicate(follower_frames()))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert refused in details
    log = (rf3.dir / "node1" / "partition.log").read_text()
    assert "refusing the edge's link: edge probe-" in log
    assert "refusing the replication stream: follower n2 speaks protocol versions 9" in log


async def test_racing_connects_on_two_nodes_leave_one_live_connection(rf3) -> None:
    for _ in range(10):
        cid = f"race-{uid()}"
        (a, ack_a), (b, ack_b) = await asyncio.gather(
            RawClient.connect(rf3.mqtt_port(1), cid, version=5),
            RawClient.connect(rf3.mqtt_port(2), cid, version=5),
        )
        # The loser's kick leaves its master with the winner's CONNACK; let it arrive.
        await asyncio.sleep(0.5)
        closed = []
        alive = []
        for client, ack in ((a, ack_a), (b, ack_b)):
            if ack.reason_code != 0:
                closed.append(client)
                continue
            await client.send(PingReq())
            packet = await client.recv(timeout=5)
            if isinstance(packet, PingResp):
                alive.append(client)
            else:
                assert packet is None or (
                    isinstance(packet, Disconnect) and packet.reason_code == 0x8E
                )
                closed.append(client)
        assert len(alive) == 1, (ack_a, ack_b)
        for client in (a, b):
            await client.close()
