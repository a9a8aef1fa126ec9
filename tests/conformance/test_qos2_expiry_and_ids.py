"""QoS 2 with message expiry and packet identifiers, on a real 2-node cluster (publisher on one
node, subscriber on the other): a QoS 2 delivery once sent is not expired (MQTT-4.3.3-7), a PUBREL
gets its PUBCOMP though the message expired (MQTT-4.3.3-13), the QoS 2 deliveries in flight at
once have distinct packet ids (MQTT-4.3.3-1), and after a PUBREC of 0x80 or more the same packet
id is a new message that is routed (MQTT-4.3.3-9)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Properties,
    PubComp,
    Publish,
    PubRec,
    PubRel,
)
from tests.support.placement import client_id_on
from tests.support.rawclient import RawClient

# Everything may be published and received, except publishing under denied/.
ACL = "topic readwrite #\ntopic deny denied/#\n"


def uid() -> str:
    return uuid.uuid4().hex[:8]


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


async def publish2(client: RawClient, topic: str, payload: bytes, pid: int, expiry: int) -> None:
    """PUBLISH QoS 2 with a Message Expiry Interval, up to its PUBREC 0x00."""
    props = Properties(message_expiry_interval=expiry)
    await client.send(Publish(topic, payload, qos=2, packet_id=pid, properties=props))
    rec = await client.expect(PubRec)
    assert (rec.packet_id, rec.reason_code) == (pid, 0)


async def test_mqtt_4_3_3_7_a_qos2_delivery_once_sent_is_not_expired(duo: Any) -> None:
    """MQTT-4.3.3-7: "MUST NOT apply Message expiry if a PUBLISH packet has been sent"."""
    topic, sub_id = f"expiry7/{uid()}", client_id_on("n2", 2, "sub7")
    # Receive Maximum 1: the first message holds the window, the second is never sent.
    sub = await connect5(duo.mqtt_port(2), sub_id, receive_maximum=1)
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), client_id_on("n1", 2, "pub7"))
    await publish2(pub, topic, b"sent", 1, expiry=1)
    sent = await sub.expect(Publish)
    assert (sent.payload, sent.qos, sent.dup) == (b"sent", 2, False)
    pid = sent.packet_id
    assert pid is not None
    await publish2(pub, topic, b"never sent", 2, expiry=1)
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
    sub = await connect5(duo.mqtt_port(2), client_id_on("n2", 2, "sub13"), receive_maximum=1)
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), client_id_on("n1", 2, "pub13"))

    async def publish_whole(payload: bytes, pid: int) -> None:
        await publish2(pub, topic, payload, pid, expiry=600)
        await pub.send(PubRel(pid))
        await pub.expect(PubComp)

    await publish_whole(b"blocker", 8)
    blocker = await sub.expect(Publish)
    assert blocker.packet_id is not None
    await publish2(pub, topic, b"expires", 9, expiry=1)
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
    sub = await connect5(duo.mqtt_port(2), client_id_on("n2", 2, "sub1"), receive_maximum=50)
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), client_id_on("n1", 2, "pub1"))

    async def publish_batch(first: int, count: int) -> None:
        for i in range(first, first + count):
            await publish2(pub, topic, str(i).encode(), i, expiry=600)
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
    sub = await connect5(duo.mqtt_port(2), client_id_on("n2", 2, "sub9"))
    await sub.subscribe(topic, qos=2)
    pub = await connect5(duo.mqtt_port(1), client_id_on("n1", 2, "pub9"))
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
