"""MQTT 5.0 flow control (Receive Maximum) both ways: the server's announced window the client
must keep to (0x93), QoS 2 counting until PUBCOMP, and the client's window the server keeps to.

`limits_node` announces Receive Maximum 5 (tests/conformance/conftest.py)."""

from __future__ import annotations

import asyncio

import pytest

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscription,
    Will,
)
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.support.v5client import connect, nothing_within, publish, subscribe


async def test_s3_2_2_3_3_connack_announces_the_limits(limits_node) -> None:
    """§3.2.2.3.3: the server announces its Receive Maximum in CONNACK.

    Also §3.2.2.3.8 (its Topic Alias Maximum).
    """
    client, connack = await RawClient.connect(limits_node.mqtt_port(1), f"c-{uid()}", version=5)
    assert isinstance(connack, ConnAck)
    assert connack.properties.receive_maximum == 5
    assert connack.properties.topic_alias_maximum == 4
    await client.close()


async def test_mqtt_3_3_4_7_exceeding_receive_maximum_is_0x93(limits_node) -> None:
    """MQTT-3.3.4-7: a client exceeding the server's Receive Maximum gets DISCONNECT 0x93.

    Also MQTT-3.14.4-2 (the server closes after its DISCONNECT).
    """
    port = limits_node.mqtt_port(1)
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


async def test_mqtt_3_3_4_7_qos2_publishes_count_against_receive_maximum_until_pubcomp(
    limits_node,
) -> None:
    """MQTT-3.3.4-7: a QoS 2 PUBLISH counts against the Receive Maximum until its PUBCOMP.

    Also §4.9 (flow control).
    """
    port = limits_node.mqtt_port(1)
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
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x93)]


async def test_mqtt_3_3_4_9_deliveries_stay_within_the_clients_receive_maximum(trio) -> None:
    """MQTT-3.3.4-9: the server has at most the client's Receive Maximum of QoS 1 in flight."""
    topic = f"rmax/{uid()}"
    sub, _ = await connect(trio.mqtt_port(1), receive_maximum=3)
    assert await subscribe(sub, Subscription(topic, 1)) == (1,)
    pub, _ = await connect(trio.mqtt_port(2))
    for i in range(10):
        await publish(pub, topic, f"{i}".encode())
    got: list[Publish] = []
    while len(got) < 10:
        window = [await sub.expect(Publish) for _ in range(min(3, 10 - len(got)))]
        await nothing_within(sub, 0.5)  # no more than 3 unacknowledged at a time
        got += window
        for packet in window:
            assert packet.packet_id is not None
            await sub.send(PubAck(packet.packet_id))
    assert [p.payload for p in got] == [f"{i}".encode() for i in range(10)]


async def keep_sending(client: RawClient, data: bytes, *, every: float) -> None:
    """For half a second, send `data` every `every` seconds without reading anything: a client
    still sending as the server ends the connection."""
    loop = asyncio.get_running_loop()
    until = loop.time() + 0.5
    while loop.time() < until:
        await client.send_bytes(data)
        await asyncio.sleep(every)


async def test_mqtt_3_14_4_2_the_0x93_disconnect_reaches_a_client_still_sending(
    limits_node,
) -> None:
    """MQTT-3.14.4-2: after its DISCONNECT the server closes, and the DISCONNECT arrives.

    Paho's test_flow_control2: Receive Maximum + 1 QoS 2 PUBLISHes without PUBREL, the client
    still sending as the DISCONNECT 0x93 comes (MQTT-3.3.4-7). The server stops reading
    requests but lets the DISCONNECT reach the client: it ends its side after it and discards
    what the client still sends, instead of closing with unread input, which resets the
    connection (the client's writes fail, or the DISCONNECT is lost, before it is read).
    """
    port = limits_node.mqtt_port(1)
    topic = f"rm2/{uid()}"
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    burst = b"".join(pub.codec.send(Publish(topic, b"x", qos=2, packet_id=i)) for i in range(1, 7))
    try:
        await pub.send_bytes(burst)
        await keep_sending(pub, pub.codec.send(PingReq()) * 16, every=0.02)
        seen = await pub.wait_closed()
    except ConnectionError as exc:
        pytest.fail(f"the connection was reset before the DISCONNECT was read: {exc!r}")
    await pub.close()
    assert seen, "nothing came before the end of the stream"
    assert (type(seen[-1]), seen[-1].reason_code) == (Disconnect, 0x93)
    assert all(isinstance(p, PubRec) for p in seen[:-1])


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 5)])
async def test_mqtt_3_2_2_7_a_refusing_connack_reaches_a_client_still_sending(
    limits_node, version: int, code: int
) -> None:
    """MQTT-3.2.2-7 (5.0; 3.1.1 3.2.2.3): after a CONNACK that refuses, the server closes, and
    the CONNACK arrives. A client that sent more right after its CONNECT (pipelined, as
    clients that do not wait for CONNACK do) is still sending when the refusal comes; closing
    with its bytes unread resets the connection and the CONNACK can be lost to the reset. The
    edge ends its side after the CONNACK and discards the rest, as after a DISCONNECT."""
    client = await RawClient.open(limits_node.mqtt_port(1), version)
    refused = Connect(
        f"refused-{uid()}",
        protocol_version=version,
        will=Will(f"$SYS/broker/fake/{uid()}", b"forged"),  # refused at CONNECT (4.7.2)
    )
    try:
        await client.send(refused)
        await keep_sending(client, client.codec.send(PingReq()) * 64, every=0.01)
        seen = await client.wait_closed()
    except ConnectionError as exc:
        pytest.fail(f"the connection was reset before the CONNACK was read: {exc!r}")
    await client.close()
    assert [(type(p), getattr(p, "reason_code", None)) for p in seen] == [(ConnAck, code)]
