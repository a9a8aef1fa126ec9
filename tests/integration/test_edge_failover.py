"""What clients of surviving nodes see when a node is killed and started again, against real
processes: a delay, never an error (docs/failover.md, "The edge during a failover").

At RF 1 a killed node's partitions have no master until it is started again (no replica can
take over), so the edge holds their commands for that long: the edge's side of failover,
exercised by an outage no failover ends sooner (tests/integration/test_failover.py has the
failovers themselves)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

from hexmq.hashring import assign, partition_of
from hexmq.mqtt import Properties, PubAck, Publish
from tests.support.rawclient import RawClient
from tests.support.unique import uid

PERSISTENT = Properties(session_expiry_interval=600)
PARTITIONS = 16


def client_id_on(master: str, prefix: str, nodes: int, rf: int) -> str:
    """A fresh client id whose session partition `master` masters (static placement)."""
    table = assign([f"n{i}" for i in range(1, nodes + 1)], PARTITIONS, rf)
    while True:
        cid = f"{prefix}-{uid()}"
        if table[partition_of(cid, PARTITIONS)][0] == master:
            return cid


async def test_qos1_publishers_of_surviving_nodes_are_delayed_never_refused(
    hexmq_cluster,
) -> None:
    """Node 3 (edge, partition service, Redis) is killed and started again while publishers
    on nodes 1 and 2 send QoS 1 messages one at a time to subscribers whose sessions live on
    every node: every PUBLISH is acknowledged with 0 (the ones for node 3's partitions after a
    delay), no publisher or subscriber connection of nodes 1 and 2 ends, and every subscriber
    gets every message, in order per publisher (first deliveries)."""
    nodes, rf = 3, 1
    cluster = hexmq_cluster(
        nodes=nodes,
        partitions=PARTITIONS,
        extra=["--rf", str(rf), "--edge-arg=--failover-hold=60"],
    )
    topic = f"delay/{uid()}"
    subs: dict[str, RawClient] = {}
    for master in ("n1", "n2", "n3"):
        for node in (1, 2):
            cid = client_id_on(master, f"sub{node}", nodes, rf)
            client, _ = await RawClient.connect(
                cluster.mqtt_port(node), cid, version=5, clean_start=True, properties=PERSISTENT
            )
            assert (await client.subscribe(f"{topic}/#", qos=1)).reason_codes == (1,)
            subs[cid] = client
    got: dict[str, list[bytes]] = {cid: [] for cid in subs}
    closed: list[str] = []

    async def take(cid: str, client: RawClient) -> None:
        while True:
            packet = await client.recv(timeout=120)
            if packet is None:
                closed.append(cid)
                return
            if isinstance(packet, Publish):
                got[cid].append(packet.payload)
                assert packet.packet_id is not None
                await client.send(PubAck(packet.packet_id))

    readers = [asyncio.create_task(take(cid, c)) for cid, c in subs.items()]
    sent: dict[str, list[bytes]] = {}
    codes: list[int] = []
    waits: list[float] = []
    loop = asyncio.get_running_loop()

    # Connected before the kill: at RF 1 a CONNECT whose session partition node 3 masters
    # would be held until it is back (this test is about publishes).
    publishers = {}
    for node in (1, 2):
        name = f"pub{node}-{uid()}"
        publishers[node] = (
            name,
            (await RawClient.connect(cluster.mqtt_port(node), name, version=5))[0],
        )

    async def publish(node: int, count: int) -> None:
        name, client = publishers[node]
        sent[name] = []
        for i in range(count):
            payload = f"{name}:{i}".encode()
            sent_at = loop.time()
            # Waits for the PUBACK: as long as node 3 is down, within the 60 s hold.
            ack = await client.publish(f"{topic}/{node}", payload, qos=1, timeout=60)
            assert ack is not None
            waits.append(loop.time() - sent_at)
            codes.append(ack.reason_code)
            sent[name].append(payload)
            await asyncio.sleep(0.01)
        await client.close()

    async def kill_and_start() -> None:
        await asyncio.sleep(0.5)
        await asyncio.to_thread(cluster.kill, 3)
        await asyncio.sleep(1.5)
        await asyncio.to_thread(cluster.start, 3)

    # Each publisher's PUBACK can wait only as long as node 3 is down (the bound is 60 s).
    async with asyncio.timeout(90):
        await asyncio.gather(publish(1, 150), publish(2, 150), kill_and_start())
    assert codes == [0] * 300
    # The outage was met: some PUBACK waited for node 3 to come back (its partitions' messages
    # were held, not refused).
    assert max(waits) > 1.0, max(waits)

    total = sum(len(s) for s in sent.values())
    try:
        async with asyncio.timeout(30):
            while any(len(set(g)) < total for g in got.values()):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        for client in subs.values():
            await client.close()
    assert closed == []  # nobody on nodes 1 and 2 was disconnected
    for cid, payloads in got.items():
        for name, expected in sent.items():
            firsts = list(dict.fromkeys(p for p in payloads if p.startswith(f"{name}:".encode())))
            assert firsts == expected, f"{cid} from {name}"


async def test_a_connected_subscriber_gets_no_duplicate_after_its_master_returns(
    hexmq_cluster,
) -> None:
    """MQTT-4.4.0-1: a message is sent again only on a reconnect. The subscriber stays
    connected while its session's partition service is killed and started: the edge re-attaches
    it with what it holds in flight (AttachSession.inflight_ids, acked_ids), and the partition
    must not send those again. (A partition service that ignored that state resent everything
    unacknowledged: 12 duplicates per subscriber in issue 10's report.)"""
    cluster = hexmq_cluster(nodes=1, extra=["--edge-arg=--failover-hold=60"])
    port = cluster.mqtt_port(1)
    topic = f"nodup/{uid()}"
    sub, _ = await RawClient.connect(
        port, f"sub-{uid()}", version=5, clean_start=True, properties=PERSISTENT
    )
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    try:
        await no_duplicate_after_a_restart(cluster, pub, sub, topic)
    finally:  # (an expected failure must not leave sockets behind for later tests)
        for client in (pub, sub):
            await client.close()


async def no_duplicate_after_a_restart(
    cluster: Any, pub: RawClient, sub: RawClient, topic: str
) -> None:
    for i in range(6):
        assert (await pub.publish(topic, b"m%d" % i, qos=1)).reason_code == 0
    delivered = [await sub.expect(Publish) for _ in range(6)]
    for message in delivered[:3]:  # the rest stay in flight, unacknowledged
        assert message.packet_id is not None
        await sub.send(PubAck(message.packet_id))
    await asyncio.sleep(0.5)  # the acknowledgements are stored

    os.kill(cluster.pids(1)["partition"], signal.SIGKILL)
    await asyncio.sleep(0.5)
    cluster.start(1)
    # The session is re-attached (the publisher's next message arrives) and nothing it already
    # has comes again.
    assert (await pub.publish(topic, b"after", qos=1)).reason_code == 0
    seen = []
    with contextlib.suppress(TimeoutError):
        while True:
            packet = await sub.recv(timeout=3)
            assert packet is not None, "the subscriber was disconnected"
            if isinstance(packet, Publish):
                seen.append((packet.payload, packet.dup))
                if packet.payload == b"after":
                    break
    assert seen == [(b"after", False)]
    # Its PUBACKs for the messages sent before the re-attach still count.
    for message in delivered[3:]:
        assert message.packet_id is not None
        await sub.send(PubAck(message.packet_id))
