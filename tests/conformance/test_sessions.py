"""Sessions: persistent sessions keep subscriptions and queued QoS 1 messages across a
disconnect, a move to another node and `hexmq cluster kill` + `start` of the node, with the
right Session Present; Clean Start; the Session Expiry Interval; empty client ids, and the
Assigned Client Identifiers they get, unique across the cluster (clients with an empty ClientID
connecting at once through every node each get their own and keep their connection: a shared
id would make the later CONNECT take the earlier session over)."""

from __future__ import annotations

import asyncio
import time

import pytest

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    Publish,
    Subscription,
)
from tests.support.rawclient import RawClient
from tests.support.sessions import publish_acked, session_props, subscribe_then_leave
from tests.support.unique import uid
from tests.support.v5client import KEEP, connect, leave, publish, receive, subscribe

COUNT = 100


async def receive_in_order(client: RawClient, topic: str, count: int) -> list[Publish]:
    got: list[Publish] = []
    while len(got) < count:
        packet = await client.expect(Publish, timeout=10)
        assert packet.topic == topic
        got.append(packet)
        assert packet.packet_id is not None
        await client.send(PubAck(packet.packet_id))
    return got


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_2_5_queued_messages_survive_a_disconnect(
    hexmq_cluster,
    version: int,
) -> None:
    """MQTT-3.1.2-5: Clean Start 0 resumes the existing session, its subscriptions and queue.

    Also MQTT-3.1.2-6 (Clean Start 0 creates one), MQTT-3.1.2-23 (kept after the connection
    closes), MQTT-3.2.2-3 (Session Present), MQTT-4.5.0-1 and MQTT-4.6.0-5 (queued, in order).
    """
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
async def test_g4_queued_messages_survive_kill_and_start(hexmq_cluster, version: int) -> None:
    """G4: a session, its subscription and its queue survive kill -9 and start of the node.

    Also MQTT-3.1.2-23 (the session is kept) and MQTT-3.2.2-3 (Session Present 1).
    """
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


async def test_g4_session_follows_the_client_across_nodes(trio_256) -> None:
    """G4: a session resumes on any node, with Session Present 1 and its queue in order.

    Also MQTT-3.1.2-5, MQTT-4.5.0-1 (200 QoS 1 messages queued while away) and MQTT-4.6.0-6.
    """
    client_id, topic = f"roam-{uid()}", f"roam/{uid()}"
    props = Properties(session_expiry_interval=600)
    sub, _ = await RawClient.connect(
        trio_256.mqtt_port(1), client_id, version=5, clean_start=False, properties=props
    )
    await sub.subscribe(topic, qos=1)
    await sub.send(Disconnect())
    await sub.close()

    pub, _ = await RawClient.connect(trio_256.mqtt_port(2), f"pub-{uid()}", version=5)
    for i in range(200):
        assert (await pub.publish(topic, f"{i}".encode())).reason_code == 0
    await pub.close()

    sub, connack = await RawClient.connect(
        trio_256.mqtt_port(3), client_id, version=5, clean_start=False, properties=props
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


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_2_4_clean_session_starts_empty(hexmq_cluster, version: int) -> None:
    """MQTT-3.1.2-4: Clean Start 1 discards the existing session (subscriptions and queue).

    Also MQTT-3.2.2-2 (Session Present 0).
    """
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


# ----- Session Expiry Interval (MQTT-4.1.0-2, MQTT-3.1.2-23) -------------------------------


async def test_mqtt_4_1_0_2_session_expiry_interval(trio) -> None:
    """MQTT-4.1.0-2: a session is discarded once its Session Expiry Interval has passed.

    0, 2 s from CONNECT, 2 s set by DISCONNECT (down from 600) and 60 s. Also MQTT-3.1.2-23
    (kept until then) and MQTT-3.2.2-3 (Session Present says which).
    """
    u = uid()
    ids = {name: f"se-{name}-{u}" for name in ("short", "lowered", "long", "zero")}
    topics = {name: f"se/{u}/{name}" for name in ids}
    pub, _ = await connect(trio.mqtt_port(2))

    # No expiry (0): the session ends with the connection.
    zero, _ = await connect(trio.mqtt_port(1), ids["zero"], clean_start=False)
    assert await subscribe(zero, Subscription(topics["zero"], 1)) == (1,)
    await leave(zero)
    zero, connack = await connect(trio.mqtt_port(1), ids["zero"], clean_start=False)
    assert connack.session_present is False
    await zero.close()

    # 2 s from CONNECT, 2 s set by DISCONNECT (down from 600), and 60 s.
    expiries = {"short": 2, "lowered": KEEP, "long": 60}
    clients = {}
    for name, expiry in expiries.items():
        client, _ = await connect(trio.mqtt_port(1), ids[name], session_expiry_interval=expiry)
        assert await subscribe(client, Subscription(topics[name], 1)) == (1,)
        clients[name] = client
    await leave(clients["short"])
    await leave(clients["lowered"], session_expiry_interval=2)
    await leave(clients["long"])
    gone_at = time.monotonic() + 3
    for name in expiries:
        await publish(pub, topics[name], b"queued")
    await asyncio.sleep(gone_at - time.monotonic())

    for name in ("short", "lowered"):
        client, connack = await connect(
            trio.mqtt_port(3), ids[name], clean_start=False, session_expiry_interval=2
        )
        assert (name, connack.session_present) == (name, False)
        # Neither its queued message nor its subscription is left: the first thing it gets
        # is the sentinel, published after a message on its old topic.
        assert await subscribe(client, Subscription(f"{topics[name]}/sentinel", 1)) == (1,)
        await publish(pub, topics[name], b"after")
        await publish(pub, f"{topics[name]}/sentinel", b"sentinel")
        got = await receive(client)
        assert (name, got.payload) == (name, b"sentinel")
        await leave(client, session_expiry_interval=0)

    client, connack = await connect(
        trio.mqtt_port(3), ids["long"], clean_start=False, session_expiry_interval=60
    )
    assert connack.session_present is True
    got = await receive(client)
    assert (got.topic, got.payload) == (topics["long"], b"queued")
    await leave(client, session_expiry_interval=0)


async def test_s3_14_2_2_2_disconnect_cannot_give_an_expiry_to_a_session_without_one(trio) -> None:
    """§3.14.2.2.2: Session Expiry 0 in CONNECT, non-zero in DISCONNECT: a Protocol Error.

    Also MQTT-4.1.0-2 (the session still ends with the connection).
    """
    # 3.14.2.2.2: with Session Expiry Interval 0 in CONNECT, a non-zero one in DISCONNECT is a
    # Protocol Error; the server does not take it as a valid DISCONNECT, so the session still
    # ends with the connection (Session Expiry Interval 0, MQTT-3.1.2-23 / MQTT-4.1.0-2).
    client_id = f"se-bad-{uid()}"
    client, _ = await connect(trio.mqtt_port(1), client_id, clean_start=False)
    await client.send(Disconnect(0, Properties(session_expiry_interval=KEEP)))
    seen = await client.wait_closed()
    assert [(type(p), getattr(p, "reason_code", None)) for p in seen] == [(Disconnect, 0x82)]
    await client.close()
    client, connack = await connect(
        trio.mqtt_port(1), client_id, clean_start=False, session_expiry_interval=0
    )
    assert connack.session_present is False


# ----- Client identifiers ------------------------------------------------------------------


async def test_mqtt_3_1_3_7_empty_client_id_rules(node) -> None:
    """MQTT-3.1.3-7: an empty ClientID gets one assigned, sent as Assigned Client Identifier.

    Also MQTT-3.1.3-8 (3.1.1: an empty ClientId with clean session 0 gets CONNACK 0x02 and is
    closed) and MQTT-3.2.2-16 (partly: assigned; that no other session uses it is not shown).
    """
    port = node.mqtt_port(1)
    # 3.1.1: an empty id needs clean session 1 (MQTT-3.1.3-8): return code 0x02 otherwise.
    client, connack = await RawClient.connect(port, "", version=4, clean_start=False)
    assert connack.reason_code == 2
    assert await client.wait_closed() == []
    await client.close()
    client, connack = await RawClient.connect(port, "", version=4, clean_start=True)
    assert connack.reason_code == 0
    await client.close()
    # 5.0: the server assigns one and says which (MQTT-3.2.2-16).
    client, connack = await RawClient.connect(port, "", version=5)
    assert connack.reason_code == 0
    assigned = connack.properties.assigned_client_identifier
    assert assigned
    assert assigned.startswith("hexmq-")
    await client.close()


PER_NODE = 8


async def connect_empty_id(port: int) -> tuple[RawClient, ConnAck]:
    client = await RawClient.open(port, 5)
    props = Properties(session_expiry_interval=300)
    await client.send(Connect(client_id="", protocol_version=5, properties=props))
    return client, await client.expect(ConnAck)


async def test_mqtt_3_2_2_16_assigned_client_ids_are_unique_across_nodes(hexmq_cluster) -> None:
    """MQTT-3.2.2-16: an Assigned Client Identifier "MUST be a new Client Identifier"."""
    c = hexmq_cluster(nodes=3)
    ports = [c.mqtt_port(i) for i in (1, 2, 3)] * PER_NODE
    connected = await asyncio.gather(*(connect_empty_id(port) for port in ports))
    ids = []
    for _, connack in connected:
        assert connack.reason_code == 0
        assert connack.session_present is False
        assert connack.properties.assigned_client_identifier
        ids.append(connack.properties.assigned_client_identifier)
    assert len(set(ids)) == len(ports), ids
    # Every one still holds its connection: none was taken over by another's CONNECT.
    for client, _ in connected:
        await client.send(PingReq())
        assert isinstance(await client.recv(), PingResp)
    for client, _ in connected:
        await client.close()
