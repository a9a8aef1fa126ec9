"""A malformed packet or a protocol error closes only that connection (5.0: DISCONNECT with the
right reason code), other clients keep working, and the edge logs one line saying why."""

from __future__ import annotations

import pytest

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    encode,
)
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.unit.mqtt.vectors import CONNECT_BYTES, MALFORMED

# Bytes sent right after a valid CONNECT, per protocol version, with the reason code expected.
CASES = {
    # Remaining length uses a fifth continuation byte (MQTT-1.5.5 allows at most four).
    "bad remaining length": (
        {4: b"\x30\xff\xff\xff\xff\x7f", 5: b"\x30\xff\xff\xff\xff\x7f"},
        0x81,
    ),
    # SUBSCRIBE must have fixed-header flags 0b0010 (MQTT-3.8.1-1); these are 0.
    "reserved flags": (
        {4: b"\x80\x06\x00\x01\x00\x01a\x00", 5: b"\x80\x07\x00\x01\x00\x00\x01a\x00"},
        0x81,
    ),
    # Topic name bytes FF FE are not UTF-8 (MQTT-1.5.4-1).
    "bad utf-8 topic": (
        {4: b"\x30\x05\x00\x02\xff\xfex", 5: b"\x30\x06\x00\x02\xff\xfe\x00x"},
        0x81,
    ),
    # Remaining length 2 MiB, above the edge's 1 MiB maximum: refused from the header alone.
    "packet too large": ({4: b"\x30\x80\x80\x80\x01", 5: b"\x30\x80\x80\x80\x01"}, 0x95),
}


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("case", CASES)
async def test_mqtt_4_13_1_1_malformed_packet_closes_only_that_connection(
    node,
    case: str,
    version: int,
) -> None:
    """MQTT-4.13.1-1: a Malformed Packet closes the connection (5.0: DISCONNECT, its code).

    Other clients keep working; the edge logs one line. Cases: §1.5.5 (remaining length),
    MQTT-3.8.1-1 (reserved flags), MQTT-1.5.4-1 (bad UTF-8), MQTT-3.2.2-15 (too large).
    """
    port = node.mqtt_port(1)
    topic = f"ok/{uid()}"
    bystander, _ = await RawClient.connect(port, f"bystander-{uid()}", version=version)
    await bystander.subscribe(topic, qos=1)

    bad_id = f"bad-{uid()}"
    bad, connack = await RawClient.connect(port, bad_id, version=version)
    assert connack.reason_code == 0
    payloads, expected_reason = CASES[case]
    await bad.send_bytes(payloads[version])
    seen = await bad.wait_closed(timeout=5)
    await bad.close()
    if version == 5:
        assert len(seen) == 1, seen
        assert isinstance(seen[0], Disconnect), seen
        assert seen[0].reason_code == expected_reason
    else:
        assert seen == []  # 3.1.1 has no DISCONNECT from the server: the connection just closes

    # Everyone else is untouched.
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    assert (await pub.publish(topic, b"still here", qos=1)) is not None
    got = await bystander.expect(Publish)
    assert got.payload == b"still here"
    for client in (pub, bystander):
        await client.close()

    log_lines = [
        line for line in node.service_log(1, "edge").read_text().splitlines() if bad_id in line
    ]
    assert len(log_lines) == 1, log_lines
    assert f"0x{expected_reason:02X}" in log_lines[0]


async def test_mqtt_3_1_2_2_unsupported_protocol_level_gets_connack_0x01(node) -> None:
    """MQTT-3.1.2-2 (3.1.1): an unsupported protocol level gets CONNACK 0x01, then close.

    Also MQTT-3.1.2-2 and MQTT-3.1.4-1 (5.0: a CONNECT that is not valid is refused, closed).
    """
    client = await RawClient.open(node.mqtt_port(1), version=4)
    connect = bytearray(encode(Connect(client_id=f"old-{uid()}", protocol_version=4), 4))
    connect[8] = 3  # protocol level byte: 3 = MQTT 3.1 with name "MQTT" is not a level we speak
    await client.send_bytes(bytes(connect))
    seen = await client.wait_closed()
    await client.close()
    assert len(seen) == 1
    assert isinstance(seen[0], ConnAck)
    assert seen[0].reason_code == 0x01


# Every malformed input the codec's golden table knows, replayed over TCP against the edge: each
# must end only that connection, with the table's reason code in a 5.0 DISCONNECT.
EDGE_CASES = list(MALFORMED)


@pytest.mark.parametrize(
    "case", EDGE_CASES, ids=[f"{c.name}-v{c.protocol_version}" for c in EDGE_CASES]
)
async def test_mqtt_4_13_1_1_codec_malformed_table_over_tcp(node, case) -> None:
    """MQTT-4.13.1-1: each bad packet of the codec's MALFORMED table ends only its connection.

    5.0 gets a DISCONNECT with the table's reason code. docs/conformance.md names the
    statements of the cases (MQTT-1.5.4-1, MQTT-2.1.3-1, MQTT-3.3.2-2, MQTT-3.14.4-1, ...).
    """
    client = await RawClient.open(node.mqtt_port(1), version=case.protocol_version)
    await client.send_bytes(CONNECT_BYTES[case.protocol_version])
    connack = await client.expect(ConnAck)
    assert connack.reason_code == 0
    await client.send_bytes(case.data)
    seen = await client.wait_closed(timeout=5)
    await client.close()
    if case.name == "packet-after-disconnect":
        # The edge closes on the client's DISCONNECT (MQTT-3.14.4-1); what follows is never read.
        assert seen == []
        return
    # Packets that came before the bad one (e.g. a SUBACK) may precede the DISCONNECT.
    if case.protocol_version == 5:
        assert isinstance(seen[-1], Disconnect), seen
        assert seen[-1].reason_code == case.reason_code
    else:
        assert not any(isinstance(p, Disconnect) for p in seen)


async def test_mqtt_3_1_0_2_a_second_connect_is_a_protocol_error(node) -> None:
    """MQTT-3.1.0-2: a second CONNECT on a connection is a Protocol Error: the server closes."""
    # MQTT-3.1.0-2: a second CONNECT on a connection is a protocol violation: close it.
    client = await RawClient.open(node.mqtt_port(1))
    await client.send(Connect(client_id=f"late-{uid()}"))
    assert isinstance(await client.recv(), ConnAck)
    await client.send(Connect(client_id=f"again-{uid()}"))
    assert await client.wait_closed() == []
    await client.close()


# An acknowledgement the subscriber sends for a delivery of the given QoS, and what comes
# before it: PUBREC (to get our PUBREL) for the one answering a PUBREL.
WRONG_ACKS = {
    "pubrec for qos 1": (1, False, PubRec),
    "pubcomp for qos 1": (1, False, PubComp),
    "puback for qos 2": (2, False, PubAck),
    "pubcomp before pubrel": (2, False, PubComp),
    "puback for a pubrel": (2, True, PubAck),
}


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize("case", WRONG_ACKS)
async def test_mqtt_4_13_1_1_an_acknowledgement_of_the_wrong_kind_is_a_protocol_error(
    node, case: str, version: int
) -> None:
    """MQTT-4.13.1-1: an acknowledgement of the wrong kind for a delivery is a Protocol Error.

    A QoS 1 delivery is answered with PUBACK (MQTT-4.3.2-4), a QoS 2 one with PUBREC
    (MQTT-4.3.3-8), our PUBREL with PUBCOMP (MQTT-4.3.3-11): anything else for an id in flight
    ends the connection, 5.0 with DISCONNECT 0x82 (3.1.1: MQTT-4.8.0-1, a close); the next
    PINGREQ is not answered. Others go on.
    """
    qos, released, ack = WRONG_ACKS[case]
    port = node.mqtt_port(1)
    topic = f"ack/{uid()}"
    sub, _ = await RawClient.connect(port, f"ack-{uid()}", version=version)
    await sub.subscribe(topic, qos=2)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    await pub.send(Publish(topic, b"m", qos=qos, packet_id=1))
    await pub.expect(PubAck if qos == 1 else PubRec)
    delivery = await sub.expect(Publish)
    assert delivery.qos == qos
    pid = delivery.packet_id
    assert pid is not None
    if released:
        await sub.send(PubRec(pid))
        assert (await sub.expect(PubRel)).packet_id == pid
    try:
        await sub.send(ack(pid))
        await sub.send(PingReq())
        try:
            seen = await sub.wait_closed()
        except ConnectionResetError:
            # 3.1.1 has no DISCONNECT to deliver: its close does not linger, and with the
            # PINGREQ unread it may reach the client as a reset (5.0's must not: it lingers).
            if version == 5:
                raise
            seen = []
        if version == 5:
            assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x82)]
        else:
            assert seen == []
        await pub.send(PingReq())  # the publisher's connection goes on
        await pub.expect(PingResp)
    finally:  # (a socket left open fails whichever test the collector meets it in)
        await sub.close()
        await pub.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_4_13_1_1_an_acknowledgement_for_nothing_in_flight_is_ignored(
    node, version: int
) -> None:
    """MQTT-4.13.1-1: an acknowledgement for a packet id with nothing in flight is no error.

    A late duplicate (after a reconnect or a resend) or one for an exchange already finished:
    ignored, the connection goes on (also a PUBACK repeated after the delivery was acknowledged).
    """
    port = node.mqtt_port(1)
    topic = f"ack/{uid()}"
    sub, _ = await RawClient.connect(port, f"ack-{uid()}", version=version)
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    await pub.publish(topic, b"m", qos=1)
    delivery = await sub.expect(Publish)
    assert delivery.packet_id is not None
    await sub.send(PubAck(delivery.packet_id))
    for late in (PubAck(delivery.packet_id), PubRec(4321), PubComp(4322), PubAck(4323)):
        await sub.send(late)
    await sub.send(PingReq())
    await sub.expect(PingResp)
    for client in (pub, sub):
        await client.close()
