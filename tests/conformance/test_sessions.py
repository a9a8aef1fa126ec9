"""Persistent sessions keep subscriptions and queued QoS 1 messages across a disconnect and
across `hexmq cluster kill` + `start` of the node, with the right session-present flag."""

from __future__ import annotations

import uuid

import pytest

from hexmq.mqtt import Disconnect, Properties, PubAck, Publish
from tests.support.rawclient import RawClient

COUNT = 100


def uid() -> str:
    return uuid.uuid4().hex[:10]


def session_props(version: int) -> Properties:
    # 3.1.1: clean session 0 keeps the session; 5.0 also needs a Session Expiry Interval.
    return Properties(session_expiry_interval=600) if version == 5 else Properties()


async def receive_in_order(client: RawClient, topic: str, count: int) -> list[Publish]:
    got: list[Publish] = []
    while len(got) < count:
        packet = await client.expect(Publish, timeout=10)
        assert packet.topic == topic
        got.append(packet)
        assert packet.packet_id is not None
        await client.send(PubAck(packet.packet_id))
    return got


async def subscribe_then_leave(port: int, client_id: str, version: int, topic: str) -> None:
    sub, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=session_props(version)
    )
    assert connack.reason_code == 0
    assert connack.session_present is False
    suback = await sub.subscribe(topic, qos=1)
    assert suback.reason_codes == (1,)
    await sub.send(Disconnect())
    await sub.close()


async def publish_acked(port: int, version: int, topic: str, count: int) -> None:
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    for i in range(count):
        ack = await pub.publish(topic, f"{i}".encode(), qos=1)
        assert ack is not None
        assert ack.reason_code == 0
    await pub.send(Disconnect())
    await pub.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_queued_messages_survive_a_disconnect(hexmq_cluster, version: int) -> None:  # type: ignore[no-untyped-def]
    cluster = hexmq_cluster(nodes=1)
    port = cluster.mqtt_port(1)
    client_id, topic = f"sess-{uid()}", f"s/{uid()}/data"
    await subscribe_then_leave(port, client_id, version, topic)
    await publish_acked(port, version, topic, COUNT)

    sub, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=session_props(version)
    )
    assert connack.session_present is True
    got = await receive_in_order(sub, topic, COUNT)
    assert [p.payload for p in got] == [f"{i}".encode() for i in range(COUNT)]
    # The subscription itself survived too: a new message arrives live.
    await publish_acked(port, version, topic, 1)
    live = await sub.expect(Publish)
    assert live.payload == b"0"
    await sub.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_queued_messages_survive_kill_and_start(hexmq_cluster, version: int) -> None:  # type: ignore[no-untyped-def]
    cluster = hexmq_cluster(nodes=1)
    port = cluster.mqtt_port(1)
    client_id, topic = f"sess-{uid()}", f"k/{uid()}/data"
    await subscribe_then_leave(port, client_id, version, topic)
    await publish_acked(port, version, topic, COUNT)

    cluster.kill(1)  # SIGKILL to every process of the node, Redis included
    cluster.start(1)

    sub, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=session_props(version)
    )
    assert connack.session_present is True
    got = await receive_in_order(sub, topic, COUNT)
    assert [p.payload for p in got] == [f"{i}".encode() for i in range(COUNT)]
    await sub.close()


async def test_unacknowledged_delivery_is_resent_with_dup(hexmq_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = hexmq_cluster(nodes=1)
    port = cluster.mqtt_port(1)
    client_id, topic = f"dup-{uid()}", f"d/{uid()}"
    await subscribe_then_leave(port, client_id, 4, topic)
    sub, _ = await RawClient.connect(port, client_id, clean_start=False)
    await publish_acked(port, 4, topic, 1)
    first = await sub.expect(Publish)
    assert first.dup is False
    await sub.close()  # gone without PUBACK

    sub, connack = await RawClient.connect(port, client_id, clean_start=False)
    assert connack.session_present is True
    again = await sub.expect(Publish)
    # MQTT-4.4.0-1: resent with its original packet identifier, flagged DUP.
    assert (again.payload, again.packet_id, again.dup) == (first.payload, first.packet_id, True)
    await sub.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_clean_session_starts_empty(hexmq_cluster, version: int) -> None:  # type: ignore[no-untyped-def]
    cluster = hexmq_cluster(nodes=1)
    port = cluster.mqtt_port(1)
    client_id, topic = f"clean-{uid()}", f"c/{uid()}"
    await subscribe_then_leave(port, client_id, version, topic)
    await publish_acked(port, version, topic, 3)
    # Clean start discards the stored session: no session present, nothing queued, and the
    # old subscription is gone. A marker on a new subscription, published after a message on
    # the old topic by the same publisher, must be the first thing the client gets.
    sub, connack = await RawClient.connect(port, client_id, version=version, clean_start=True)
    assert connack.session_present is False
    await sub.subscribe(f"{topic}/marker", qos=1)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    await pub.publish(topic, b"old subscription", qos=1)
    await pub.publish(f"{topic}/marker", b"marker", qos=1)
    first = await sub.expect(Publish)
    assert (first.topic, first.payload) == (f"{topic}/marker", b"marker")
    await pub.close()
    await sub.close()
