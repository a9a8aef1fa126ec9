"""QoS 2 exactly once when the routing attempt dies (issue 3, G3), on a real 3-node cluster with
RF 2: subscribers in partitions mastered by each node, the publisher's edge SIGKILLed mid-routing
(a fault-injection flag makes the edge stop right after its first target node stored the
message), or one target node's partition service down so that the routing fails part-way; the
publisher resends through another node and every subscriber gets the message exactly once. A
5.0 PUBREC 0x80 still frees the packet id: the next PUBLISH with it is a new message."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any, cast

import pytest
import redis

from hexmq.hashring import assign
from hexmq.mqtt import PubComp, Publish, PubRec, PubRel
from tests.conformance.test_qos2 import (
    NODES,
    PARTITIONS,
    client_id_on,
    connect,
    nothing_more,
    reconnect,
    take2,
    uid,
)
from tests.support.rawclient import RawClient

# QoS 2 publishes without DUP on topics under this prefix stall after their first target node
# (`hexmq edge --fault-stall-qos2-routing`); everything else is routed normally.
STALL = "stall/"
RF = 2


@pytest.fixture(scope="module")
def trio(hexmq_cluster_module):  # type: ignore[no-untyped-def]
    return hexmq_cluster_module(
        nodes=3,
        partitions=PARTITIONS,
        extra=[
            *("--rf", str(RF)),
            f"--edge-arg=--fault-stall-qos2-routing={STALL}",
            # A killed partition service stops holding writes up after 1 s, not 5.
            "--partition-arg=--replica-lag-timeout=1",
        ],
    )


def seen_origins(cluster: Any) -> dict[str, dict[str, dict[bytes, bytes]]]:
    """Every node's remembered QoS 2 origin ids (hx:{p}:q2seen), by node and key."""
    out: dict[str, dict[str, dict[bytes, bytes]]] = {}
    for i, node in enumerate(NODES, 1):
        client = redis.Redis(port=cluster.node(i)["redis_port"])
        try:
            out[node] = {
                key.decode(): cast("dict[bytes, bytes]", client.hgetall(key))
                for key in client.scan_iter(match="hx:*:q2seen")
            }
        finally:
            client.close()
    return out


async def all_forgotten(cluster: Any, timeout: float = 10.0) -> None:
    """Every target forgot every origin id (the forgets after PUBREC are fire and forget)."""
    deadline = time.monotonic() + timeout
    while (left := seen_origins(cluster)) != {node: {} for node in NODES}:
        assert time.monotonic() < deadline, f"origin ids left behind: {left}"
        await asyncio.sleep(0.2)


async def subscribers(
    cluster: Any, topic: str, version: int, ports: tuple[int, ...]
) -> list[RawClient]:
    """A QoS 2 subscriber whose session n1, n2, n3 masters, in that order, each connected to
    the node `ports` names in turn (never one whose process the test kills)."""
    subs = []
    for i, master in enumerate(NODES):
        client, _ = await connect(
            cluster.mqtt_port(ports[i % len(ports)]),
            client_id_on(master, f"sub{i + 1}"),
            version,
            persistent=True,
        )
        assert (await client.subscribe(topic, qos=2)).reason_codes == (2,)
        subs.append(client)
    return subs


async def resend(
    cluster: Any, pub_id: str, version: int, packet: Publish, node: int, *, retry: bool = False
) -> RawClient:
    """Reconnect to `node` and resend `packet` until it is stored everywhere (PUBREC 0), then
    PUBREL/PUBCOMP; returns the connection. With `retry`, a refusal (a 3.1.1 connection closed
    while a partition node restarts) is retried as a client would; else it fails the test."""
    async with asyncio.timeout(60):
        while True:
            pub = await reconnect(cluster.mqtt_port(node), pub_id, version)
            await pub.send(packet)
            answer = await pub.recv(timeout=15)
            if isinstance(answer, PubRec) and answer.reason_code == 0:
                break
            assert retry, f"resend refused: {answer!r}"
            await pub.close()
            await asyncio.sleep(0.3)
    await pub.send(PubRel(packet.packet_id))  # type: ignore[arg-type]
    comp = await pub.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (packet.packet_id, 0)
    return pub


async def only_that_and_nothing_left(cluster: Any, pub: RawClient, subs: list[RawClient]) -> None:
    """No subscriber gets anything more, every target forgot every origin id, and the clients
    are closed."""
    for sub in subs:
        await nothing_more(sub, wait=1.0)
    await all_forgotten(cluster)
    for client in (pub, *subs):
        await client.close()


async def outage_of_n3(
    cluster: Any, prefix: str, version: int
) -> tuple[str, list[RawClient], str, RawClient]:
    """Subscribers in partitions of n1, n2 and n3 (on nodes 1 and 2), a publisher on node 1
    whose session n1 holds, and then n3's partition service SIGKILLed: a publish now fails
    part-way. Returns (topic, subscribers, publisher's client id, publisher)."""
    topic = f"{prefix}/{uid()}"
    subs = await subscribers(cluster, topic, version, (1, 2))
    pub_id = client_id_on("n1", "pub")
    pub, _ = await connect(cluster.mqtt_port(1), pub_id, version, persistent=True)
    os.kill(cluster.pids(3)["partition"], signal.SIGKILL)
    await asyncio.sleep(0.5)  # the edges see their links to it drop
    return topic, subs, pub_id, pub


async def reachable(cluster: Any, node: int, master: str) -> None:
    """Node `node`'s edge takes a CONNECT for a session that `master` holds (its link is up)."""
    async with asyncio.timeout(30):
        while True:
            port, cid = cluster.mqtt_port(node), client_id_on(master, "probe")
            probe, connack = await RawClient.connect(port, cid, version=5)
            await probe.close()
            if connack.reason_code == 0:
                return
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_4_3_3_10_resend_after_the_routing_edge_died_is_delivered_once(
    trio: Any, version: int
) -> None:
    """MQTT-4.3.3-10: until PUBREL, a repeated PUBLISH must not cause duplicate deliveries."""
    topic = f"{STALL}{uid()}"
    # Subscribers on nodes 2 and 3; the publisher on node 1, whose edge is killed.
    subs = await subscribers(trio, topic, version, (2, 3))
    pub_id = client_id_on("n2", "pub")
    pub, _ = await connect(trio.mqtt_port(1), pub_id, version, persistent=True)
    packet = Publish(topic, b"once", qos=2, packet_id=9)
    await pub.send(packet)

    # The routing reached n1 (targets go out in node order) and stopped there: sub1 has the
    # message, the others not, and the publisher no PUBREC.
    assert [p.payload for p in await take2(subs[0])] == [b"once"]
    for sub in subs[1:]:
        await nothing_more(sub)
    # sub1's partition remembers the origin id, written with the enqueue, so its follower
    # holds it too.
    remembered = seen_origins(trio)
    ((key, origins),) = remembered["n1"].items()
    assert len(origins) == 1
    follower = assign(list(NODES), PARTITIONS, RF)[int(key.split(":")[1])][1]
    assert remembered[follower] == {key: origins}

    # The edge dies mid-routing; the client comes back through node 2 and resends (DUP).
    os.kill(trio.pids(1)["edge"], signal.SIGKILL)
    try:
        assert await pub.wait_closed(timeout=10) == []
        await pub.close()
        pub = await resend(
            trio, pub_id, version, Publish(topic, b"once", qos=2, dup=True, packet_id=9), node=2
        )
    finally:
        trio.start(1)  # the killed edge again, for the tests that follow

    # Exactly once everywhere: n1's subscriber does not get it again.
    for sub in subs[1:]:
        assert [p.payload for p in await take2(sub)] == [b"once"]
    await only_that_and_nothing_left(trio, pub, subs)


async def test_mqtt_4_3_3_10_3_1_1_resend_after_a_part_way_failure_is_delivered_once(
    trio: Any,
) -> None:
    """MQTT-4.3.3-10: until PUBREL, a repeated PUBLISH must not cause duplicate deliveries."""
    topic, subs, pub_id, pub = await outage_of_n3(trio, "partway", 4)
    try:
        # n1 and n2 store it, n3 cannot: 3.1.1 has no failing PUBREC, the connection closes.
        await pub.send(Publish(topic, b"once", qos=2, packet_id=3))
        assert await pub.wait_closed(timeout=15) == []
        await pub.close()
        for sub in subs[:2]:
            assert [p.payload for p in await take2(sub)] == [b"once"]
    finally:
        trio.start(3)
    # The resend takes the kept claim over, with its origin id: only n3 stores it now.
    resent = Publish(topic, b"once", qos=2, dup=True, packet_id=3)
    pub = await resend(trio, pub_id, 4, resent, node=2, retry=True)
    assert [p.payload for p in await take2(subs[2])] == [b"once"]
    await only_that_and_nothing_left(trio, pub, subs)


async def test_mqtt_4_3_3_9_after_pubrec_0x80_the_same_packet_id_is_a_new_message(
    trio: Any,
) -> None:
    """MQTT-4.3.3-9: after a PUBREC of 0x80 or more, a PUBLISH with that id is a new message."""
    topic, subs, _, pub = await outage_of_n3(trio, "refused", 5)
    try:
        await pub.send(Publish(topic, b"first", qos=2, packet_id=4))
        refused = await pub.expect(PubRec, timeout=15)
        assert (refused.packet_id, refused.reason_code) == (4, 0x80)
        for sub in subs[:2]:
            assert [p.payload for p in await take2(sub)] == [b"first"]
    finally:
        trio.start(3)
    await reachable(trio, 1, "n3")
    # Packet id 4 again, another message: routed as new everywhere, n1's and n2's
    # subscribers included (the refused one's origin id does not hide it).
    await pub.send(Publish(topic, b"second", qos=2, packet_id=4))
    rec = await pub.expect(PubRec, timeout=15)
    assert (rec.packet_id, rec.reason_code) == (4, 0)
    await pub.send(PubRel(4))
    assert (await pub.expect(PubComp)).reason_code == 0
    for sub in subs:
        assert [p.payload for p in await take2(sub)] == [b"second"]
    await only_that_and_nothing_left(trio, pub, subs)
