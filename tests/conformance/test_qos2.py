"""QoS 2, exactly once, cluster-wide (3 nodes, RF 2): PUBLISH/PUBREC/PUBREL/PUBCOMP both ways
for 3.1.1 and 5.0; duplicates of an inbound PUBLISH are not routed again, also when the publisher
comes back through another node; a subscriber gets PUBLISH DUP again until its PUBREC is
recorded and PUBREL (never the PUBLISH) after; and both hold across `hexmq cluster kill` +
`start` of the node mastering the sessions (G3 under restart). A 5.0 CONNACK without Maximum
QoS, and SUBSCRIBE at QoS 2.

Message expiry and packet identifiers, on a 2-node cluster (publisher on one node, subscriber on
the other): a QoS 2 delivery once sent is not expired (MQTT-4.3.3-7), a PUBREL gets its PUBCOMP
though the message expired (MQTT-4.3.3-13), the QoS 2 deliveries in flight at once have distinct
packet ids (MQTT-4.3.3-1), and after a PUBREC of 0x80 or more the same packet id is a new message
that is routed (MQTT-4.3.3-9).

Exactly once when the routing attempt dies (issue 3, G3), on a 3-node cluster with RF 2 of its
own: subscribers in partitions mastered by each node, the publisher's edge SIGKILLed mid-routing
(a fault-injection flag makes the edge stop right after its first target node stored the
message), or one target node's partition service down so that the routing fails part-way; the
publisher resends through another node and every subscriber gets the message exactly once. A
5.0 PUBREC 0x80 still frees the packet id: the next PUBLISH with it is a new message."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from typing import Any, cast

import pytest

from hexmq.hashring import assign, partition_of
from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    Properties,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscription,
)
from tests.support import placement
from tests.support import v5client as v5
from tests.support.rawclient import RawClient
from tests.support.trust import node_redis
from tests.support.unique import uid

PARTITIONS = 32  # as the `trio` fixture (tests/conformance/conftest.py)
# The failover hold of the clusters whose tests kill a node and expect a refusal: a command for
# its partitions is held this long (seconds), then refused.
HOLD = 2
NODES = ["n1", "n2", "n3"]
PERSISTENT = Properties(session_expiry_interval=3600)


def client_id_on(node_id: str, prefix: str) -> str:
    """A client id whose session partition node_id masters (RF 2 table)."""
    table = assign(NODES, PARTITIONS, 2)
    while True:
        cid = f"{prefix}-{uid()}"
        if table[partition_of(cid, PARTITIONS)][0] == node_id:
            return cid


async def connect(
    port: int, client_id: str, version: int, *, persistent: bool = False, clean: bool = True
) -> tuple[RawClient, ConnAck]:
    props = PERSISTENT if persistent and version == 5 else Properties()
    client = await RawClient.open(port, version)
    await client.send(
        Connect(
            client_id=client_id,
            protocol_version=version,
            # 3.1.1 keeps a session only with clean session 0.
            clean_start=clean if version == 5 else not persistent,
            properties=props,
        )
    )
    connack = await client.expect(ConnAck)
    assert connack.reason_code == 0, connack
    return client, connack


async def reconnect(port: int, client_id: str, version: int, timeout: float = 30) -> RawClient:
    """Resume a persistent session, retrying while the cluster refuses (a node restarting)."""
    async with asyncio.timeout(timeout):
        while True:
            client = await RawClient.open(port, version)
            await client.send(
                Connect(
                    client_id=client_id,
                    protocol_version=version,
                    clean_start=False,
                    properties=PERSISTENT if version == 5 else Properties(),
                )
            )
            try:
                connack = await client.expect(ConnAck)
            except (AssertionError, OSError, TimeoutError):
                connack = None
            if connack is not None and connack.reason_code == 0:
                assert connack.session_present is True
                return client
            await client.close()
            await asyncio.sleep(0.2)


async def publish2(client: RawClient, topic: str, payload: bytes, pid: int) -> PubComp:
    """A whole QoS 2 publish: PUBLISH, PUBREC, PUBREL, PUBCOMP."""
    await client.send(Publish(topic, payload, qos=2, packet_id=pid))
    rec = await client.expect(PubRec)
    assert (rec.packet_id, rec.reason_code) == (pid, 0)
    await client.send(PubRel(pid))
    comp = await client.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (pid, 0)
    return comp


async def take2(client: RawClient, count: int = 1) -> list[Publish]:
    """Receive `count` QoS 2 deliveries and complete them (PUBREC each PUBLISH, PUBCOMP each
    PUBREL, as they come); the PUBLISH packets in order."""
    got: list[Publish] = []
    done = 0
    while done < count:
        packet = await client.recv()
        if isinstance(packet, Publish):
            assert packet.qos == 2
            assert packet.packet_id is not None
            got.append(packet)
            await client.send(PubRec(packet.packet_id))
        elif isinstance(packet, PubRel):
            assert packet.packet_id in {p.packet_id for p in got}
            await client.send(PubComp(packet.packet_id))
            done += 1
        else:
            raise AssertionError(f"unexpected {packet!r}")
    return got


async def nothing_more(client: RawClient, wait: float = 0.5) -> None:
    try:
        packet: Packet | None = await client.recv(timeout=wait)
    except TimeoutError:
        return
    raise AssertionError(f"unexpected {packet!r}")


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_4_3_3_8_qos2_end_to_end_across_nodes(trio, version: int) -> None:
    """MQTT-4.3.3-8: the receiver of a QoS 2 PUBLISH answers PUBREC with its packet id.

    Both ways across nodes, 3.1.1 and 5.0: the server as receiver (MQTT-4.3.3-8, -11) and as
    sender (DUP 0, PUBREL on PUBREC: MQTT-4.3.3-1, -2, -4). Also MQTT-3.2.2-9, -10 (no Maximum
    QoS, granted 2), MQTT-3.8.4-8 (to a QoS 1 subscription at QoS 1) and MQTT-2.2.1-5.
    """
    topic = f"q2/{uid()}"
    sub, connack = await connect(trio.mqtt_port(1), f"sub-{uid()}", version)
    if version == 5:
        assert connack.properties.maximum_qos is None  # absent: QoS 2 is supported
    assert (await sub.subscribe(topic, qos=2)).reason_codes == (2,)
    pub, _ = await connect(trio.mqtt_port(2), f"pub-{uid()}", version)
    for i in range(1, 21):
        await publish2(pub, topic, b"m%d" % i, pid=i)
    got = await take2(sub, 20)
    assert [p.payload for p in got] == [b"m%d" % i for i in range(1, 21)]
    assert not any(p.dup for p in got)
    # A QoS 2 message to a QoS 1 subscription goes at QoS 1, and QoS 1 to QoS 2 stays QoS 1.
    low, _ = await connect(trio.mqtt_port(3), f"low-{uid()}", version)
    assert (await low.subscribe(topic, qos=1)).reason_codes == (1,)
    await publish2(pub, topic, b"two", pid=21)
    assert (await low.expect(Publish)).qos == 1
    assert [p.payload for p in await take2(sub)] == [b"two"]
    for client in (sub, pub, low):
        await client.close()


def test_mqtt_3_3_4_1_mosquitto_clients_qos2_both_versions(trio) -> None:
    """MQTT-3.3.4-1: QoS 2 PUBLISHes are answered as QoS 2 requires, for mosquitto's clients.

    mosquitto_pub and mosquitto_sub (a persistent session), 3.1.1 and 5.0, across nodes.
    Also MQTT-4.3.3-8.
    """
    for version, extra in (("mqttv311", []), ("mqttv5", ["-x", "600"])):
        topic, cid = f"mosq/{uid()}", f"mosq-{uid()}"
        base = ["-h", "127.0.0.1", "-V", version, "-q", "2"]
        sub = [
            "mosquitto_sub",
            *base,
            *("-p", str(trio.mqtt_port(1)), "-c", "-i", cid, "-t", topic),
            *extra,
        ]
        subprocess.run([*sub, "-E"], check=True, timeout=20)  # subscribe, then leave
        for i in range(3):
            pub = ["mosquitto_pub", *base, "-p", str(trio.mqtt_port(2 + i % 2))]
            subprocess.run([*pub, "-t", topic, "-m", f"m{i}"], check=True, timeout=20)
        out = subprocess.run(
            [*sub, "-C", "3", "-W", "20"], check=True, timeout=30, capture_output=True, text=True
        )
        assert out.stdout.split() == ["m0", "m1", "m2"], version


async def test_mqtt_3_5_2_1_pubrec_0x10_without_subscribers_and_pubcomp_0x92_for_unknown(
    trio,
) -> None:
    """MQTT-3.5.2-1: PUBREC uses PUBREC reason codes: 0x10 when no subscriber matched.

    Also MQTT-3.7.2-1 (PUBCOMP 0x92 for a PUBREL of an unknown packet id; 3.1.1 has no code)
    and MQTT-4.3.3-11 (PUBCOMP with the PUBREL's packet id).
    """
    v5, _ = await connect(trio.mqtt_port(1), f"p5-{uid()}", 5)
    await v5.send(Publish(f"nobody/{uid()}", b"x", qos=2, packet_id=3))
    rec = await v5.expect(PubRec)
    assert (rec.packet_id, rec.reason_code) == (3, 0x10)
    await v5.send(PubRel(3))
    assert (await v5.expect(PubComp)).reason_code == 0  # recorded all the same
    await v5.send(PubRel(77))
    comp = await v5.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (77, 0x92)
    v4, _ = await connect(trio.mqtt_port(2), f"p4-{uid()}", 4)
    await v4.send(PubRel(77))
    assert (await v4.expect(PubComp)).packet_id == 77  # 3.1.1 has no reason codes
    for client in (v4, v5):
        await client.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_4_3_3_10_duplicate_publish_before_pubrel_is_delivered_once(
    trio,
    version: int,
) -> None:
    """MQTT-4.3.3-10: until PUBREL, a repeated QoS 2 PUBLISH gets PUBREC, is delivered once.

    On one connection (with and without DUP) and after reconnects through other nodes. Also
    MQTT-4.3.3-12 (after PUBCOMP the same packet id is a new message) and G3.
    """
    topic = f"dup/{uid()}"
    sub, _ = await connect(trio.mqtt_port(3), f"sub-{uid()}", version)
    await sub.subscribe(topic, qos=2)
    pub_id = f"pub-{uid()}"
    pub, _ = await connect(trio.mqtt_port(1), pub_id, version, persistent=True)

    # On one connection: PUBLISH, PUBREC, PUBLISH DUP (and one without DUP): PUBREC each time.
    await pub.send(Publish(topic, b"one", qos=2, packet_id=10))
    assert (await pub.expect(PubRec)).packet_id == 10
    await pub.send(Publish(topic, b"one", qos=2, dup=True, packet_id=10))
    assert (await pub.expect(PubRec)).packet_id == 10
    await pub.send(Publish(topic, b"one", qos=2, packet_id=10))
    assert (await pub.expect(PubRec)).packet_id == 10

    # Across a reconnect to another node, before PUBREL: still a duplicate.
    await pub.send(Publish(topic, b"two", qos=2, packet_id=11))
    assert (await pub.expect(PubRec)).packet_id == 11
    await pub.close()
    pub = await reconnect(trio.mqtt_port(2), pub_id, version)
    for pid, payload in ((10, b"one"), (11, b"two")):
        await pub.send(Publish(topic, payload, qos=2, dup=True, packet_id=pid))
        assert (await pub.expect(PubRec)).packet_id == pid
        await pub.send(PubRel(pid))
        assert (await pub.expect(PubComp)).reason_code == 0

    # Gone without waiting for PUBREC, resent through a third node at once: routed once.
    await pub.send(Publish(topic, b"three", qos=2, packet_id=12))
    await pub.close()
    pub = await reconnect(trio.mqtt_port(3), pub_id, version)
    await pub.send(Publish(topic, b"three", qos=2, dup=True, packet_id=12))
    assert (await pub.expect(PubRec)).packet_id == 12
    await pub.send(PubRel(12))
    assert (await pub.expect(PubComp)).reason_code == 0

    # Once released, the packet id is free: the same id is a new message.
    await publish2(pub, topic, b"four", pid=10)
    got = [p.payload for p in await take2(sub, 4)]
    assert got == [b"one", b"two", b"three", b"four"]
    await nothing_more(sub)
    for client in (sub, pub):
        await client.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_4_3_3_3_subscriber_gets_publish_dup_until_pubrec_then_pubrel(
    trio,
    version: int,
) -> None:
    """MQTT-4.3.3-3: a QoS 2 PUBLISH the server sent is unacknowledged until its PUBREC.

    Resent with DUP 1 and the same packet id after reconnects to other nodes. Also
    MQTT-4.3.3-4, -5, -6 (PUBREL on PUBREC, resent until PUBCOMP, never the PUBLISH again),
    MQTT-4.4.0-1 and MQTT-3.3.1-1.
    """
    topic, sub_id = f"out/{uid()}", f"sub-{uid()}"
    sub, _ = await connect(trio.mqtt_port(1), sub_id, version, persistent=True)
    await sub.subscribe(topic, qos=2)
    pub, _ = await connect(trio.mqtt_port(2), f"pub-{uid()}", version)
    await publish2(pub, topic, b"a", pid=1)
    await publish2(pub, topic, b"b", pid=2)

    # PUBLISH received, no PUBREC, gone: PUBLISH DUP again (same packet id) on another node.
    first = [await sub.expect(Publish) for _ in range(2)]
    assert [(p.payload, p.dup) for p in first] == [(b"a", False), (b"b", False)]
    await sub.close()
    sub = await reconnect(trio.mqtt_port(2), sub_id, version)
    again = [await sub.expect(Publish) for _ in range(2)]
    assert [(p.payload, p.dup, p.packet_id) for p in again] == [
        (p.payload, True, p.packet_id) for p in first
    ]

    # PUBREC for "a" (and PUBREL heard), gone before PUBCOMP: on a third node, PUBREL for "a"
    # (never its PUBLISH) and PUBLISH DUP for "b".
    pid_a, pid_b = again[0].packet_id, again[1].packet_id
    assert pid_a is not None
    assert pid_b is not None
    await sub.send(PubRec(pid_a))
    assert (await sub.expect(PubRel)).packet_id == pid_a
    await sub.close()
    sub = await reconnect(trio.mqtt_port(3), sub_id, version)
    rel = await sub.expect(PubRel)
    assert rel.packet_id == pid_a
    third = await sub.expect(Publish)
    assert (third.payload, third.dup, third.packet_id) == (b"b", True, pid_b)
    await sub.send(PubComp(pid_a))
    await sub.send(PubRec(pid_b))
    assert (await sub.expect(PubRel)).packet_id == pid_b
    await sub.send(PubComp(pid_b))

    # Done: nothing comes back after another reconnect.
    await sub.close()
    sub = await reconnect(trio.mqtt_port(1), sub_id, version)
    await publish2(pub, topic, b"c", pid=3)
    assert [p.payload for p in await take2(sub)] == [b"c"]
    await nothing_more(sub)
    for client in (sub, pub):
        await client.close()


async def test_g3_exactly_once_across_a_failover_of_the_sessions_master(hexmq_cluster) -> None:
    """G3: QoS 2 exactly once across kill -9 of the node mastering both sessions (their
    partition fails over to its in-sync follower) and its start again.

    Also MQTT-4.3.3-8, -10 (the received packet id survives: the resend is not routed again)
    and MQTT-4.3.3-5, -6, MQTT-4.4.0-1 (PUBREL, not the PUBLISH, after the failover).
    """
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2"])
    topic = f"g3/{uid()}"
    # Both sessions are mastered by n3, the node we kill; the clients use nodes 1 and 2.
    pub_id, sub_id = client_id_on("n3", "pub"), client_id_on("n3", "sub")
    sub, _ = await connect(cluster.mqtt_port(2), sub_id, 5, persistent=True, clean=True)
    await sub.subscribe(topic, qos=2)
    pub, _ = await connect(cluster.mqtt_port(1), pub_id, 5, persistent=True, clean=True)

    await pub.send(Publish(topic, b"once", qos=2, packet_id=5))
    assert (await pub.expect(PubRec)).packet_id == 5  # recorded as received, replicated
    delivered = await sub.expect(Publish)
    assert delivered.packet_id is not None
    await sub.send(PubRec(delivered.packet_id))
    assert (await sub.expect(PubRel)).packet_id == delivered.packet_id  # released, durably
    await sub.close()
    await pub.close()

    cluster.kill(3)  # the follower of both sessions' partition takes it over

    pub = await reconnect(cluster.mqtt_port(2), pub_id, 5)
    await pub.send(Publish(topic, b"once", qos=2, dup=True, packet_id=5))
    assert (await pub.expect(PubRec)).packet_id == 5  # still known: not routed again
    await pub.send(PubRel(5))
    assert (await pub.expect(PubComp)).reason_code == 0

    sub = await reconnect(cluster.mqtt_port(1), sub_id, 5)
    assert (await sub.expect(PubRel)).packet_id == delivered.packet_id  # not the PUBLISH
    await sub.send(PubComp(delivered.packet_id))
    await publish2(pub, topic, b"next", pid=6)
    assert [p.payload for p in await take2(sub)] == [b"next"]  # no second "once" before it
    await nothing_more(sub)

    cluster.start(3)  # back as a follower, then master again once in sync: nothing repeats
    await publish2(pub, topic, b"after", pid=7)
    assert [p.payload for p in await take2(sub)] == [b"after"]
    await nothing_more(sub)
    await sub.send(Disconnect())
    for client in (sub, pub):
        await client.close()


async def test_mqtt_3_2_2_9_maximum_qos_2_and_subscribe_at_qos_2(trio) -> None:
    """MQTT-3.2.2-9: a server that supports QoS 2 sends no Maximum QoS in CONNACK.

    Also MQTT-3.2.2-10, MQTT-3.8.4-7 (SUBSCRIBE at QoS 2 is granted 2), MQTT-3.8.4-8 (a QoS 1
    message goes at 1) and MQTT-4.12.0-6 (no Authentication Method in CONNACK).
    """
    # MQTT-3.2.2-9: no Maximum QoS in CONNACK means QoS 2 is supported; a SUBSCRIBE at QoS 2 is
    # granted 2 and a QoS 1 publish arrives at QoS 1 (min of the two). MQTT-4.12.0-6: no
    # Authentication Method asked, none in CONNACK.
    topic = f"qos2/{uid()}"
    sub, connack = await v5.connect(trio.mqtt_port(1))
    assert connack.properties.maximum_qos is None
    assert connack.properties.authentication_method is None
    assert connack.properties.authentication_data is None
    assert await v5.subscribe(sub, Subscription(topic, 2)) == (2,)
    pub, _ = await v5.connect(trio.mqtt_port(2))
    await v5.publish(pub, topic, b"x")
    got = await v5.receive(sub)
    assert (got.payload, got.qos) == (b"x", 1)


# ----- message expiry and packet ids (2 nodes, an ACL) -------------------------------------


# Everything may be published and received, except publishing under denied/.
ACL = "topic readwrite #\ntopic deny denied/#\n"


@pytest.fixture(scope="module")
def duo(hexmq_cluster_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    acl = tmp_path_factory.mktemp("acl") / "acl"
    acl.write_text(ACL)
    return hexmq_cluster_module(nodes=2, extra=[f"--edge-arg=--acl-file={acl}"])


async def connect5(
    port: int, client_id: str, *, resume: bool = False, receive_maximum: int | None = None
) -> RawClient:
    """A 5.0 client with a session that outlives its connection."""
    client = await RawClient.open(port, 5)
    props = Properties(session_expiry_interval=3600, receive_maximum=receive_maximum)
    await client.send(
        Connect(client_id=client_id, protocol_version=5, clean_start=not resume, properties=props)
    )
    connack = await client.expect(ConnAck)
    assert connack.reason_code == 0
    assert connack.session_present is resume
    return client


async def publish2_expiring(
    client: RawClient, topic: str, payload: bytes, pid: int, expiry: int
) -> None:
    """PUBLISH QoS 2 with a Message Expiry Interval, up to its PUBREC 0x00."""
    props = Properties(message_expiry_interval=expiry)
    await client.send(Publish(topic, payload, qos=2, packet_id=pid, properties=props))
    rec = await client.expect(PubRec)
    assert (rec.packet_id, rec.reason_code) == (pid, 0)


async def test_mqtt_4_3_3_7_a_qos2_delivery_once_sent_is_not_expired(duo: Any) -> None:
    """MQTT-4.3.3-7: "MUST NOT apply Message expiry if a PUBLISH packet has been sent"."""
    topic, sub_id = f"expiry7/{uid()}", placement.client_id_on("n2", 2, "sub7")
    # Receive Maximum 1: the first message holds the window, the second is never sent.
    sub = await connect5(duo.mqtt_port(2), sub_id, receive_maximum=1)
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), placement.client_id_on("n1", 2, "pub7"))
    await publish2_expiring(pub, topic, b"sent", 1, expiry=1)
    sent = await sub.expect(Publish)
    assert (sent.payload, sent.qos, sent.dup) == (b"sent", 2, False)
    pid = sent.packet_id
    assert pid is not None
    await publish2_expiring(pub, topic, b"never sent", 2, expiry=1)
    for done in (1, 2):
        await pub.send(PubRel(done))
        await pub.expect(PubComp)
    await sub.close()  # no PUBREC: the delivery has begun
    await asyncio.sleep(2.2)  # both messages' expiry has passed

    sub = await connect5(duo.mqtt_port(2), sub_id, resume=True, receive_maximum=1)
    again = await sub.expect(Publish)
    assert (again.payload, again.packet_id, again.dup) == (b"sent", pid, True)
    await sub.send(PubRec(pid))
    assert await sub.expect(PubRel) == PubRel(pid)
    await sub.close()  # no PUBCOMP: PUBREL is resent, still past the expiry

    sub = await connect5(duo.mqtt_port(2), sub_id, resume=True, receive_maximum=1)
    assert await sub.expect(PubRel) == PubRel(pid)
    await sub.send(PubComp(pid))
    # The expired message never sent is not delivered: the next delivery is the marker.
    await pub.send(Publish(topic, b"marker", qos=1, packet_id=3))
    await pub.recv()  # PUBACK
    marker = await sub.expect(Publish)
    assert marker.payload == b"marker"
    for client in (sub, pub):
        await client.close()


async def test_mqtt_4_3_3_13_pubrel_gets_pubcomp_though_the_message_expired(duo: Any) -> None:
    """MQTT-4.3.3-13: "MUST continue the QoS 2 acknowledgement sequence" despite message expiry."""
    topic = f"expiry13/{uid()}"
    # Receive Maximum 1, held by a first message: the expiring one waits behind it.
    sub = await connect5(
        duo.mqtt_port(2), placement.client_id_on("n2", 2, "sub13"), receive_maximum=1
    )
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), placement.client_id_on("n1", 2, "pub13"))

    async def publish_whole(payload: bytes, pid: int) -> None:
        await publish2_expiring(pub, topic, payload, pid, expiry=600)
        await pub.send(PubRel(pid))
        await pub.expect(PubComp)

    await publish_whole(b"blocker", 8)
    blocker = await sub.expect(Publish)
    assert blocker.packet_id is not None
    await publish2_expiring(pub, topic, b"expires", 9, expiry=1)
    await asyncio.sleep(2.2)
    await pub.send(PubRel(9))
    comp = await pub.expect(PubComp)
    assert (comp.packet_id, comp.reason_code) == (9, 0)  # not 0x92: the id was still known

    # Expiry was applied: once the window opens, the next delivery is a fresh message.
    await sub.send(PubRec(blocker.packet_id))
    await sub.expect(PubRel)
    await sub.send(PubComp(blocker.packet_id))
    await publish_whole(b"fresh", 10)
    got = await sub.expect(Publish)
    assert got.payload == b"fresh"
    for client in (sub, pub):
        await client.close()


async def test_mqtt_4_3_3_1_qos2_deliveries_in_flight_have_distinct_packet_ids(duo: Any) -> None:
    """MQTT-4.3.3-1: the sender "MUST assign an unused Packet Identifier" to a new QoS 2 message."""
    topic = f"ids/{uid()}"
    sub = await connect5(
        duo.mqtt_port(2), placement.client_id_on("n2", 2, "sub1"), receive_maximum=50
    )
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), placement.client_id_on("n1", 2, "pub1"))

    async def publish_batch(first: int, count: int) -> None:
        for i in range(first, first + count):
            await publish2_expiring(pub, topic, str(i).encode(), i, expiry=600)
            await pub.send(PubRel(i))
            await pub.expect(PubComp)

    async def take(count: int) -> list[Publish]:
        got = [await sub.expect(Publish) for _ in range(count)]
        assert all(p.qos == 2 and p.packet_id is not None for p in got)
        return got

    await publish_batch(1, 10)
    first = await take(10)
    # Five of them get PUBREC: they stay in flight (PUBREL awaiting PUBCOMP).
    for p in first[:5]:
        assert p.packet_id is not None
        await sub.send(PubRec(p.packet_id))
        assert await sub.expect(PubRel) == PubRel(p.packet_id)
    await publish_batch(11, 10)
    second = await take(10)
    ids = [p.packet_id for p in first + second]
    assert len(set(ids)) == 20, ids
    assert [p.payload for p in first + second] == [str(i).encode() for i in range(1, 21)]
    for p in first[:5]:
        assert p.packet_id is not None
        await sub.send(PubComp(p.packet_id))
    for client in (sub, pub):
        await client.close()


@pytest.mark.parametrize("refused_topic", ["$SYS/broker/forged", "denied/by/acl"])
async def test_mqtt_4_3_3_9_after_a_failed_pubrec_the_packet_id_is_a_new_message(
    duo: Any, refused_topic: str
) -> None:
    """MQTT-4.3.3-9: after PUBREC >= 0x80, the id's next PUBLISH is "a new Application Message"."""
    topic = f"reuse/{uid()}"
    sub = await connect5(duo.mqtt_port(2), placement.client_id_on("n2", 2, "sub9"))
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), placement.client_id_on("n1", 2, "pub9"))
    for round_ in range(2):
        await pub.send(Publish(refused_topic, b"refused", qos=2, packet_id=7))
        refused = await pub.expect(PubRec)
        assert (refused.packet_id, refused.reason_code) == (7, 0x87)
        # The same id, no PUBREL in between: a new message, routed and acknowledged.
        payload = f"new {round_}".encode()
        await pub.send(Publish(topic, payload, qos=2, packet_id=7))
        rec = await pub.expect(PubRec)
        assert (rec.packet_id, rec.reason_code) == (7, 0)
        got = await sub.expect(Publish)
        assert got.payload == payload
        assert got.packet_id is not None
        await sub.send(PubRec(got.packet_id))
        await sub.expect(PubRel)
        await sub.send(PubComp(got.packet_id))
        await pub.send(PubRel(7))
        comp = await pub.expect(PubComp)
        assert (comp.packet_id, comp.reason_code) == (7, 0)
    for client in (sub, pub):
        await client.close()


# ----- a routing attempt that dies (3 nodes, RF 2, a fault-injection flag) -----------------


# QoS 2 publishes without DUP on topics under this prefix stall after their first target node
# (`hexmq edge --fault-stall-qos2-routing`); everything else is routed normally.
STALL = "stall/"
RF = 2


@pytest.fixture(scope="module")
def stalling_trio(hexmq_cluster_module):
    """Three nodes as `trio`, with the stall flag, of its own: its tests kill processes."""
    return hexmq_cluster_module(
        nodes=3,
        partitions=PARTITIONS,
        extra=[
            *("--rf", str(RF)),
            # A process per service: the tests kill node 1's edge while its partition service
            # runs on (make test-colocated too).
            "--separate",
            f"--edge-arg=--fault-stall-qos2-routing={STALL}",
            # Commands for its partitions are refused after HOLD s, not 10.
            f"--edge-arg=--failover-hold={HOLD}",
        ],
    )


@pytest.fixture(scope="module")
def offline_trio(hexmq_cluster_module):
    """Three nodes at RF 1: a partition whose only replica's service is killed has no master
    until it is back (no failover can help), so a routing to it fails part-way, which the
    tests of such failures need. (At RF 2 its follower takes over within a second and the
    routing simply succeeds: tests/integration/test_failover.py.)"""
    return hexmq_cluster_module(
        nodes=3,
        partitions=PARTITIONS,
        extra=[
            *("--rf", "1"),
            # A process per service: the tests kill n3's partition service while its edge
            # runs on (make test-colocated too).
            "--separate",
            f"--edge-arg=--fault-stall-qos2-routing={STALL}",
            f"--edge-arg=--failover-hold={HOLD}",
        ],
    )


def seen_origins(cluster: Any) -> dict[str, dict[str, dict[bytes, bytes]]]:
    """Every node's remembered QoS 2 origin ids (hx:{p}:q2seen), by node and key."""
    out: dict[str, dict[str, dict[bytes, bytes]]] = {}
    for i, node in enumerate(NODES, 1):
        client = node_redis(cluster.dir, i, cluster.node(i)["redis_port"])
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
    await pub.send(PubRel(packet.packet_id))
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
    part-way (its part for n3 is held, then refused after HOLD s). Returns (topic, subscribers,
    publisher's client id, publisher)."""
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
    stalling_trio: Any, version: int
) -> None:
    """MQTT-4.3.3-10: until PUBREL, a repeated PUBLISH must not cause duplicate deliveries."""
    topic = f"{STALL}{uid()}"
    # Subscribers on nodes 2 and 3; the publisher on node 1, whose edge is killed.
    subs = await subscribers(stalling_trio, topic, version, (2, 3))
    pub_id = client_id_on("n2", "pub")
    pub, _ = await connect(stalling_trio.mqtt_port(1), pub_id, version, persistent=True)
    packet = Publish(topic, b"once", qos=2, packet_id=9)
    await pub.send(packet)

    # The routing reached n1 (targets go out in node order) and stopped there: sub1 has the
    # message, the others not, and the publisher no PUBREC.
    assert [p.payload for p in await take2(subs[0])] == [b"once"]
    for sub in subs[1:]:
        await nothing_more(sub)
    # sub1's partition remembers the origin id, written with the enqueue, so its follower
    # holds it too.
    remembered = seen_origins(stalling_trio)
    ((key, origins),) = remembered["n1"].items()
    assert len(origins) == 1
    follower = assign(list(NODES), PARTITIONS, RF)[int(key.split(":")[1])][1]
    assert remembered[follower] == {key: origins}

    # The edge dies mid-routing; the client comes back through node 2 and resends (DUP).
    os.kill(stalling_trio.pids(1)["edge"], signal.SIGKILL)
    try:
        assert await pub.wait_closed(timeout=10) == []
        await pub.close()
        pub = await resend(
            stalling_trio,
            pub_id,
            version,
            Publish(topic, b"once", qos=2, dup=True, packet_id=9),
            node=2,
        )
    finally:
        stalling_trio.start(1)  # the killed edge again, for the tests that follow

    # Exactly once everywhere: n1's subscriber does not get it again.
    for sub in subs[1:]:
        assert [p.payload for p in await take2(sub)] == [b"once"]
    await only_that_and_nothing_left(stalling_trio, pub, subs)


async def test_mqtt_4_3_3_10_3_1_1_resend_after_a_part_way_failure_is_delivered_once(
    offline_trio: Any,
) -> None:
    """MQTT-4.3.3-10: until PUBREL, a repeated PUBLISH must not cause duplicate deliveries."""
    topic, subs, pub_id, pub = await outage_of_n3(offline_trio, "partway", 4)
    try:
        # n1 and n2 store it, n3 cannot: 3.1.1 has no failing PUBREC, the connection closes.
        await pub.send(Publish(topic, b"once", qos=2, packet_id=3))
        assert await pub.wait_closed(timeout=15) == []
        await pub.close()
        for sub in subs[:2]:
            assert [p.payload for p in await take2(sub)] == [b"once"]
    finally:
        offline_trio.start(3)
    # The resend takes the kept claim over, with its origin id: only n3 stores it now.
    resent = Publish(topic, b"once", qos=2, dup=True, packet_id=3)
    pub = await resend(offline_trio, pub_id, 4, resent, node=2, retry=True)
    assert [p.payload for p in await take2(subs[2])] == [b"once"]
    await only_that_and_nothing_left(offline_trio, pub, subs)


async def test_mqtt_4_3_3_9_after_pubrec_0x80_the_same_packet_id_is_a_new_message(
    offline_trio: Any,
) -> None:
    """MQTT-4.3.3-9: after a PUBREC of 0x80 or more, a PUBLISH with that id is a new message."""
    topic, subs, _, pub = await outage_of_n3(offline_trio, "refused", 5)
    try:
        await pub.send(Publish(topic, b"first", qos=2, packet_id=4))
        refused = await pub.expect(PubRec, timeout=15)
        assert (refused.packet_id, refused.reason_code) == (4, 0x80)
        for sub in subs[:2]:
            assert [p.payload for p in await take2(sub)] == [b"first"]
    finally:
        offline_trio.start(3)
    await reachable(offline_trio, 1, "n3")
    # Packet id 4 again, another message: routed as new everywhere, n1's and n2's
    # subscribers included (the refused one's origin id does not hide it).
    await pub.send(Publish(topic, b"second", qos=2, packet_id=4))
    rec = await pub.expect(PubRec, timeout=15)
    assert (rec.packet_id, rec.reason_code) == (4, 0)
    await pub.send(PubRel(4))
    assert (await pub.expect(PubComp)).reason_code == 0
    for sub in subs:
        assert [p.payload for p in await take2(sub)] == [b"second"]
    await only_that_and_nothing_left(offline_trio, pub, subs)
