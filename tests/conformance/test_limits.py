"""Limits the broker keeps: a session's queue is bounded (--max-queued-messages: past it the
newest message is not queued for that session, or with --queue-overflow drop-oldest the oldest
makes room); --max-connections across listeners; a QoS 0 flood is throttled, not wedged."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect

from hexmq.mqtt import ConnAck, Connect, Disconnect, MQTTConnection, PubAck, Publish, Role
from tests.conformance.test_transports import _ws_packets
from tests.integration.test_metrics import scrape
from tests.support.edgeproc import edge_process, free_ports
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("drop-newest", [b"0", b"1", b"2", b"3", b"4"]),
        ("drop-oldest", [b"3", b"4", b"5", b"6", b"7"]),
    ],
)
async def test_s4_1_1_a_full_session_queue_drops_by_policy(  # type: ignore[no-untyped-def]
    hexmq_cluster, policy: str, expected: list[bytes]
) -> None:
    """§4.1.1: the server may bound the session state it stores: a full queue drops by policy.

    --max-queued-messages=5: drop-newest keeps the first five, drop-oldest the last five; the
    publisher still gets PUBACK 0x00, and the three dropped are counted.
    """
    cluster = hexmq_cluster(
        nodes=1,
        extra=[
            "--partition-arg=--max-queued-messages=5",
            f"--partition-arg=--queue-overflow={policy}",
        ],
    )
    port = cluster.mqtt_port(1)
    client_id, topic = f"bounded-{uuid.uuid4().hex[:8]}", f"b/{uuid.uuid4().hex[:8]}"
    sub, _ = await RawClient.connect(port, client_id, clean_start=False)
    await sub.subscribe(topic, qos=1)
    await sub.send(Disconnect())
    await sub.close()
    pub, _ = await RawClient.connect(port, f"pub-{uuid.uuid4().hex[:8]}")
    for i in range(8):
        ack = await pub.publish(topic, f"{i}".encode(), qos=1)
        assert ack is not None
        assert ack.reason_code == 0  # the publisher is not punished for a slow subscriber
    await pub.close()

    sub, connack = await RawClient.connect(port, client_id, clean_start=False)
    assert connack.session_present is True
    got = []
    for _ in range(5):
        packet = await sub.expect(Publish)
        got.append(packet.payload)
        assert packet.packet_id is not None
        await sub.send(PubAck(packet.packet_id))
    assert got == expected
    # Nothing beyond the limit was kept: a marker published now is the next delivery.
    pub, _ = await RawClient.connect(port, f"pub-{uuid.uuid4().hex[:8]}")
    await pub.publish(topic, b"marker", qos=1)
    assert (await sub.expect(Publish)).payload == b"marker"
    for client in (pub, sub):
        await client.close()

    # The three messages the limit turned away are counted.
    port = cluster.node(1)["metrics_ports"]["partition"]
    dropped = ("hexmq_dropped_messages_total", (("reason", "queue_full"),))
    counted = None
    async with asyncio.timeout(10):  # the partition copies its counters out once a second
        while counted != 3:
            await asyncio.sleep(0.2)
            counted = (await asyncio.to_thread(scrape, port)).get(dropped)


async def test_mqtt_3_3_4_1_a_qos0_flood_is_throttled_not_wedged(node) -> None:  # type: ignore[no-untyped-def]
    """MQTT-3.3.4-1: after a flood of QoS 0, a QoS 1 PUBLISH still gets its PUBACK.

    A client that floods QoS 0 faster than the partition link drains is paused (backpressure)
    and resumed; afterwards the same connection still gets its QoS 1 acknowledged.
    """
    port = node.mqtt_port(1)
    topic = f"flood/{uid()}"
    sub, _ = await RawClient.connect(port, f"flood-sub-{uid()}")
    await sub.subscribe(topic, qos=0)
    pub, _ = await RawClient.connect(port, f"flood-pub-{uid()}")
    chunk = b"".join(pub.codec.send(Publish(topic, b"x" * 64)) for _ in range(1000))
    for _ in range(100):  # 100 000 QoS 0 messages, written without waiting for anything
        pub.writer.write(chunk)
    await pub.writer.drain()
    ack = await pub.publish(f"{topic}/after", b"qos1", qos=1)
    assert ack is not None
    assert ack.reason_code == 0
    for client in (pub, sub):
        await client.close()


# ----- --max-connections -------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(node: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    (ws,) = free_ports(1)
    args = ["--max-connections=2", f"--ws-listen=127.0.0.1:{ws}"]
    with edge_process(node, tmp_path_factory.mktemp("limited"), args, name="lim1") as proc:
        yield proc.port, ws


async def connect_raw(port: int, version: int) -> tuple[RawClient, ConnAck]:
    return await RawClient.connect(port, f"lim-{uid()}", version=version)


async def test_mqtt_3_2_2_7_max_connections_refuses_with_quota_exceeded(
    limited: tuple[int, int],
) -> None:
    """MQTT-3.2.2-7: past --max-connections, CONNACK 0x97 (3.1.1: 0x03), then close.

    The WebSocket listener counts against the same limit; a closed connection frees its place.
    Also MQTT-4.13.2-1.
    """
    port, ws_port = limited
    held = []
    for _ in range(2):
        client, connack = await connect_raw(port, 5)
        assert connack.reason_code == 0
        held.append(client)

    client, connack = await connect_raw(port, 5)
    assert connack.reason_code == 0x97  # Quota exceeded
    assert await client.recv() is None  # and closed
    await client.close()
    client, connack = await connect_raw(port, 4)
    assert connack.reason_code == 3  # 3.1.1: Server unavailable
    await client.close()

    # The WebSocket listener counts against the same limit.
    codec = MQTTConnection(Role.CLIENT, protocol_version=5)
    async with ws_connect(f"ws://127.0.0.1:{ws_port}/mqtt", subprotocols=["mqtt"]) as ws:
        await ws.send(codec.send(Connect(client_id=f"lim-ws-{uid()}", protocol_version=5)))
        (connack,) = await _ws_packets(ws, codec, 1)
        assert isinstance(connack, ConnAck)
        assert connack.reason_code == 0x97

    # A closed connection frees its place.
    await held.pop().close()
    async with asyncio.timeout(10):
        while True:
            client, connack = await connect_raw(port, 5)
            if connack.reason_code == 0:
                held.append(client)
                break
            await client.close()
            await asyncio.sleep(0.05)
    for client in held:
        await client.close()
