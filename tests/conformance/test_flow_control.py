"""MQTT 5.0 flow control and size limits: Receive Maximum (0x93), the client's Maximum Packet
Size for deliveries, and inbound Topic Aliases."""

from __future__ import annotations

import uuid

import pytest

from hexmq.mqtt import ConnAck, Disconnect, Properties, PubAck, PubComp, Publish, PubRec, PubRel
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def node(hexmq_cluster_module):  # type: ignore[no-untyped-def]
    return hexmq_cluster_module(
        nodes=1, extra=["--edge-arg=--receive-maximum=5", "--edge-arg=--topic-alias-maximum=4"]
    )


async def test_connack_announces_the_limits(node) -> None:  # type: ignore[no-untyped-def]
    client, connack = await RawClient.connect(node.mqtt_port(1), f"c-{uid()}", version=5)
    assert isinstance(connack, ConnAck)
    assert connack.properties.receive_maximum == 5
    assert connack.properties.topic_alias_maximum == 4
    await client.close()


async def test_exceeding_receive_maximum_is_0x93(node) -> None:  # type: ignore[no-untyped-def]
    port = node.mqtt_port(1)
    topic = f"rm/{uid()}"
    sub, _ = await RawClient.connect(port, f"sub-{uid()}")
    await sub.subscribe(topic, qos=1)  # so that publishes wait for a partition, not 0x10
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    # Ten QoS 1 publishes in one write: more than the 5 we announced, before any PUBACK.
    burst = b"".join(pub.codec.send(Publish(topic, b"x", qos=1, packet_id=i)) for i in range(1, 11))
    await pub.send_bytes(burst)
    seen = await pub.wait_closed()
    await pub.close()
    assert isinstance(seen[-1], Disconnect)
    assert seen[-1].reason_code == 0x93
    await sub.close()


async def test_qos2_publishes_count_against_receive_maximum_until_pubcomp(node) -> None:  # type: ignore[no-untyped-def]
    port = node.mqtt_port(1)
    topic = f"rm2/{uid()}"
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    # Five QoS 2 publishes answered with PUBREC and not yet released: the quota is used up...
    for pid in range(1, 6):
        await pub.send(Publish(topic, b"x", qos=2, packet_id=pid))
        assert (await pub.expect(PubRec)).packet_id == pid
    # ...until a PUBCOMP gives one back (MQTT-4.9).
    await pub.send(PubRel(1))
    assert (await pub.expect(PubComp)).packet_id == 1
    await pub.send(Publish(topic, b"x", qos=2, packet_id=6))
    assert (await pub.expect(PubRec)).packet_id == 6
    await pub.send(Publish(topic, b"x", qos=2, packet_id=7))  # the sixth open one
    seen = await pub.wait_closed()
    await pub.close()
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x93)]  # type: ignore[union-attr]


async def test_deliveries_larger_than_the_clients_maximum_are_discarded(node) -> None:  # type: ignore[no-untyped-def]
    port = node.mqtt_port(1)
    topic = f"mps/{uid()}"
    sub, _ = await RawClient.connect(
        port, f"small-{uid()}", version=5, properties=Properties(maximum_packet_size=128)
    )
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    await pub.publish(topic, b"x" * 500, qos=1)  # too large for this subscriber
    await pub.publish(topic, b"fits", qos=1)
    got = await sub.expect(Publish)
    assert got.payload == b"fits"  # MQTT-3.1.2-25: the large one is skipped, the session goes on
    for client in (pub, sub):
        await client.close()


async def test_inbound_topic_aliases(node) -> None:  # type: ignore[no-untyped-def]
    port = node.mqtt_port(1)
    topic = f"alias/{uid()}"
    sub, _ = await RawClient.connect(port, f"sub-{uid()}")
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    await pub.send(Publish(topic, b"one", qos=1, packet_id=1, properties=Properties(topic_alias=3)))
    await pub.expect(PubAck)
    await pub.send(Publish("", b"two", qos=1, packet_id=2, properties=Properties(topic_alias=3)))
    await pub.expect(PubAck)
    assert [(await sub.expect(Publish)).topic for _ in range(2)] == [topic, topic]

    # An alias never set is a protocol error; one above the maximum is 0x94.
    for alias, payload_topic, code in ((2, "", 0x82), (5, topic, 0x94)):
        bad, _ = await RawClient.connect(port, f"bad-{uid()}", version=5)
        await bad.send(
            Publish(payload_topic, b"x", qos=0, properties=Properties(topic_alias=alias))
        )
        seen = await bad.wait_closed()
        await bad.close()
        assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, code)]  # type: ignore[union-attr]
    for client in (pub, sub):
        await client.close()
