"""Three nodes (RF 2, static membership) act as one broker: sessions live in their partition
wherever the client connects, publishes reach subscribers on every node, and a client id has one
live connection in the whole cluster."""

from __future__ import annotations

import uuid

import pytest

from hexmq.mqtt import Disconnect, Properties, PubAck, Publish
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def trio(hexmq_cluster_module):  # type: ignore[no-untyped-def]
    return hexmq_cluster_module(nodes=3, extra=["--rf", "2"])


async def test_session_follows_the_client_across_nodes(trio) -> None:  # type: ignore[no-untyped-def]
    client_id, topic = f"roam-{uid()}", f"roam/{uid()}"
    props = Properties(session_expiry_interval=600)
    sub, _ = await RawClient.connect(
        trio.mqtt_port(1), client_id, version=5, clean_start=False, properties=props
    )
    await sub.subscribe(topic, qos=1)
    await sub.send(Disconnect())
    await sub.close()

    pub, _ = await RawClient.connect(trio.mqtt_port(2), f"pub-{uid()}", version=5)
    for i in range(200):
        assert (await pub.publish(topic, f"{i}".encode())).reason_code == 0  # type: ignore[union-attr]
    await pub.close()

    sub, connack = await RawClient.connect(
        trio.mqtt_port(3), client_id, version=5, clean_start=False, properties=props
    )
    assert connack.session_present is True
    payloads = []
    for _ in range(200):
        packet = await sub.expect(Publish)
        payloads.append(packet.payload)
        assert packet.packet_id is not None
        await sub.send(PubAck(packet.packet_id))
    assert payloads == [f"{i}".encode() for i in range(200)]
    await sub.close()


async def test_publish_reaches_subscribers_on_every_node(trio) -> None:  # type: ignore[no-untyped-def]
    base = f"fan/{uid()}"
    subs = []
    for node in (1, 2, 3):
        client, _ = await RawClient.connect(trio.mqtt_port(node), f"fan-{node}-{uid()}")
        await client.subscribe(f"{base}/+/x" if node == 2 else f"{base}/#", qos=1)
        subs.append(client)
    pub, _ = await RawClient.connect(trio.mqtt_port(1), f"pub-{uid()}")
    await pub.publish(f"{base}/a/x", b"one")
    await pub.publish(f"{base}/a/y", b"two")  # not for the "+/x" subscriber
    await pub.publish(f"{base}/b/x", b"three")
    got = []
    for client, count in zip(subs, (3, 2, 3), strict=True):
        got.append([(await client.expect(Publish)).payload for _ in range(count)])
    assert got == [[b"one", b"two", b"three"], [b"one", b"three"], [b"one", b"two", b"three"]]
    for client in (*subs, pub):
        await client.close()


async def test_takeover_across_nodes(trio) -> None:  # type: ignore[no-untyped-def]
    client_id = f"one-{uid()}"
    first, _ = await RawClient.connect(trio.mqtt_port(1), client_id, version=5)
    second, connack = await RawClient.connect(trio.mqtt_port(2), client_id, version=5)
    assert connack.reason_code == 0
    seen = await first.wait_closed()
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x8E)]  # type: ignore[union-attr]
    for client in (first, second):
        await client.close()


async def test_a_publish_on_another_node_right_after_suback_reaches_the_subscriber(trio) -> None:  # type: ignore[no-untyped-def]
    # SUBACK waits until every edge routes by the new filter, so no node can miss it.
    pub, _ = await RawClient.connect(trio.mqtt_port(1), f"pub-{uid()}", version=5)
    sub, _ = await RawClient.connect(trio.mqtt_port(2), f"sub-{uid()}", version=5)
    for i in range(30):
        topic = f"race/{uid()}/{i}"
        await sub.subscribe(topic, qos=1)
        ack = await pub.publish(topic, b"right after")
        assert ack is not None
        assert ack.reason_code == 0, (i, ack)  # not 0x10 (no matching subscribers)
        packet = await sub.expect(Publish)
        assert packet.topic == topic
        assert packet.packet_id is not None
        await sub.send(PubAck(packet.packet_id))
    for client in (pub, sub):
        await client.close()
