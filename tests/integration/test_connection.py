"""Connection-level behaviour: keepalive, PINGREQ, UNSUBSCRIBE, client id rules, takeover."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    Publish,
    UnsubAck,
    Unsubscribe,
)
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def node(hexmq_cluster_module):  # type: ignore[no-untyped-def]
    return hexmq_cluster_module(nodes=1)


@pytest.mark.parametrize("version", [4, 5])
async def test_pingreq_keeps_the_connection_and_silence_ends_it(node, version: int) -> None:  # type: ignore[no-untyped-def]
    client, _ = await RawClient.connect(
        node.mqtt_port(1), f"ka-{uid()}", version=version, keepalive=1
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(3):  # 3 pings over ~2.4 s: longer than 1.5 x keepalive, still connected
        await asyncio.sleep(0.8)
        await client.send(PingReq())
        assert isinstance(await client.recv(), PingResp)
    quiet_from = loop.time()
    seen = await client.wait_closed(timeout=5)
    await client.close()
    waited = loop.time() - quiet_from
    assert loop.time() - started > 2.4
    # MQTT-3.1.2-24: closed after 1.5 x keepalive of silence (with timer slack), not before.
    assert 1.4 <= waited <= 3.0, waited
    if version == 5:
        assert [type(p) for p in seen] == [Disconnect]
        assert seen[0].reason_code == 0x8D  # type: ignore[union-attr]
    else:
        assert seen == []


@pytest.mark.parametrize("version", [4, 5])
async def test_unsubscribe_stops_delivery(node, version: int) -> None:  # type: ignore[no-untyped-def]
    port = node.mqtt_port(1)
    topic = f"u/{uid()}"
    sub, _ = await RawClient.connect(port, f"unsub-{uid()}", version=version)
    await sub.subscribe(topic, f"{topic}/marker", qos=1)
    await sub.send(Unsubscribe(2, (topic, f"{topic}/never")))
    unsuback = await sub.expect(UnsubAck)
    assert unsuback.packet_id == 2
    if version == 5:
        assert unsuback.reason_codes == (0x00, 0x11)  # success, no subscription existed
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    await pub.publish(topic, b"unsubscribed", qos=1)
    await pub.publish(f"{topic}/marker", b"marker", qos=1)
    first = await sub.expect(Publish)
    assert first.payload == b"marker"
    for client in (pub, sub):
        await client.close()


async def test_empty_client_id_rules(node) -> None:  # type: ignore[no-untyped-def]
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


@pytest.mark.parametrize("version", [4, 5])
async def test_second_connect_takes_the_session_over(node, version: int) -> None:  # type: ignore[no-untyped-def]
    port = node.mqtt_port(1)
    client_id, topic = f"take-{uid()}", f"tk/{uid()}"
    props = Properties(session_expiry_interval=600) if version == 5 else Properties()
    first, _ = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=props
    )
    await first.subscribe(topic, qos=1)
    second, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=props
    )
    assert connack.session_present is True
    seen = await first.wait_closed()
    await first.close()
    if version == 5:
        assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x8E)]  # type: ignore[union-attr]
    else:
        assert seen == []
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    await pub.publish(topic, b"to the new connection", qos=1)
    assert (await second.expect(Publish)).payload == b"to the new connection"
    for client in (pub, second):
        await client.close()


async def test_a_second_connect_is_a_protocol_error(node) -> None:  # type: ignore[no-untyped-def]
    # MQTT-3.1.0-2: a second CONNECT on a connection is a protocol violation: close it.
    client = await RawClient.open(node.mqtt_port(1))
    await client.send(Connect(client_id=f"late-{uid()}"))
    assert isinstance(await client.recv(), ConnAck)
    await client.send(Connect(client_id=f"again-{uid()}"))
    assert await client.wait_closed() == []
    await client.close()


async def test_a_qos0_flood_is_throttled_not_wedged(node) -> None:  # type: ignore[no-untyped-def]
    """A client that floods QoS 0 faster than the partition link drains is paused (backpressure)
    and resumed; afterwards the same connection still gets its QoS 1 acknowledged."""
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
