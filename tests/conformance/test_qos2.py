"""QoS 2, exactly once, cluster-wide (3 nodes, RF 2): PUBLISH/PUBREC/PUBREL/PUBCOMP both ways
for 3.1.1 and 5.0; duplicates of an inbound PUBLISH are not routed again, also when the publisher
comes back through another node; a subscriber gets PUBLISH DUP again until its PUBREC is
recorded and PUBREL (never the PUBLISH) after; and both hold across `hexmq cluster kill` +
`start` of the node mastering the sessions (G3 under restart). A 5.0 CONNACK without Maximum
QoS, and SUBSCRIBE at QoS 2."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

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
from tests.support import v5client as v5
from tests.support.rawclient import RawClient

PARTITIONS = 32  # as the `trio` fixture (tests/conformance/conftest.py)
NODES = ["n1", "n2", "n3"]
PERSISTENT = Properties(session_expiry_interval=3600)


def uid() -> str:
    return uuid.uuid4().hex[:10]


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
async def test_mqtt_4_3_3_8_qos2_end_to_end_across_nodes(trio, version: int) -> None:  # type: ignore[no-untyped-def]
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


def test_mqtt_3_3_4_1_mosquitto_clients_qos2_both_versions(trio) -> None:  # type: ignore[no-untyped-def]
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


async def test_mqtt_3_5_2_1_pubrec_0x10_without_subscribers_and_pubcomp_0x92_for_unknown(  # type: ignore[no-untyped-def]
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
async def test_mqtt_4_3_3_10_duplicate_publish_before_pubrel_is_delivered_once(  # type: ignore[no-untyped-def]
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
async def test_mqtt_4_3_3_3_subscriber_gets_publish_dup_until_pubrec_then_pubrel(  # type: ignore[no-untyped-def]
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


async def test_g3_exactly_once_across_kill_and_start_of_the_sessions_master(hexmq_cluster) -> None:  # type: ignore[no-untyped-def]
    """G3: QoS 2 exactly once across kill -9 and start of the node mastering both sessions.

    Also MQTT-4.3.3-8, -10 (the received packet id survives: the resend is not routed again)
    and MQTT-4.3.3-5, -6, MQTT-4.4.0-1 (PUBREL, not the PUBLISH, after the restart).
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

    cluster.kill(3)
    # PUBREL while the session's partition is down: no PUBCOMP (the connection is closed).
    await pub.send(PubRel(5))
    assert not any(isinstance(p, PubComp) for p in await pub.wait_closed(timeout=10))
    await pub.close()
    cluster.start(3)

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
    await sub.send(Disconnect())
    for client in (sub, pub):
        await client.close()


async def test_mqtt_3_2_2_9_maximum_qos_2_and_subscribe_at_qos_2(trio) -> None:  # type: ignore[no-untyped-def]
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
