"""MQTT 5.0 Maximum Packet Size: a delivery larger than the client's maximum is discarded and
the session goes on; a Reason String is left out of a CONNACK or DISCONNECT that would otherwise
exceed the client's maximum, and kept when it fits (raw 5.0 clients). (The server's own maximum,
0x95, is in test_malformed.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hexmq.mqtt import ConnAck, Connect, Disconnect, Packet, Properties, Publish, encode
from services.edge.passwd import set_password
from tests.support.rawclient import RawClient
from tests.support.unique import uid


async def test_mqtt_3_1_2_25_deliveries_larger_than_the_clients_maximum_are_discarded(
    limits_node,
) -> None:
    """MQTT-3.1.2-25: a delivery larger than the client's Maximum Packet Size is discarded.

    The session goes on with the next one. Also MQTT-3.1.2-24 (not sent; shown for PUBLISH).
    """
    port = limits_node.mqtt_port(1)
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


# ----- Reason Strings (a password-file edge) -----------------------------------------------


# Room for the CONNACK that accepts a client (18 bytes with hexmq's properties) and a refusing
# CONNACK or a DISCONNECT without properties (5 or 4 bytes), not for a Reason String (40 or more).
SMALL = 24
LARGE = 4096


@pytest.fixture(scope="module")
def port(hexmq_cluster_module: Any, tmp_path_factory: pytest.TempPathFactory) -> int:
    passwd: Path = tmp_path_factory.mktemp("passwd") / "passwd"
    set_password(passwd, "alice", "right", 101)
    cluster = hexmq_cluster_module(
        nodes=1, extra=[f"--edge-arg=--password-file={passwd}", "--edge-arg=--allow-anonymous"]
    )
    result: int = cluster.mqtt_port(1)
    return result


async def open5(port: int, maximum: int, **connect: Any) -> tuple[RawClient, Packet | None]:
    """CONNECT (5.0) announcing Maximum Packet Size `maximum`; the client and the answer."""
    client = await RawClient.open(port, 5)
    props = Properties(maximum_packet_size=maximum, session_expiry_interval=0)
    cid = f"rs-{uid(8)}"
    await client.send(Connect(client_id=cid, protocol_version=5, properties=props, **connect))
    return client, await client.recv()


@pytest.mark.parametrize("maximum", [SMALL, LARGE])
async def test_mqtt_3_2_2_19_connack_reason_string_left_out_over_the_clients_maximum(
    port: int, maximum: int
) -> None:
    """MQTT-3.2.2-19: no CONNACK Reason String that would exceed the client's maximum size."""
    client, connack = await open5(port, maximum, username="alice", password=b"wrong")
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == 0x86
    assert len(encode(connack, 5)) <= maximum
    if maximum == LARGE:
        assert connack.properties.reason_string  # there is one to leave out
    else:
        assert connack.properties.reason_string is None
    assert await client.recv() is None  # and the connection is closed
    await client.close()


@pytest.mark.parametrize("maximum", [SMALL, LARGE])
@pytest.mark.parametrize("cause", ["keepalive", "protocol error"])
async def test_mqtt_3_14_2_3_disconnect_reason_string_left_out_over_the_clients_maximum(
    port: int, maximum: int, cause: str
) -> None:
    """MQTT-3.14.2-3: no DISCONNECT Reason String that would exceed the client's maximum size."""
    keepalive = 1 if cause == "keepalive" else 60
    client, connack = await open5(port, maximum, keepalive=keepalive)
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == 0
    if cause == "protocol error":
        await client.send_bytes(encode(Connect(client_id="again", protocol_version=5), 5))
    disconnect = await client.expect(Disconnect, timeout=5)  # keepalive: after 1.5 s of silence
    assert disconnect.reason_code == (0x8D if cause == "keepalive" else 0x82)
    assert len(encode(disconnect, 5)) <= maximum
    if maximum == LARGE:
        assert disconnect.properties.reason_string
    else:
        assert disconnect.properties.reason_string is None
    assert await client.recv() is None
    await client.close()


@pytest.mark.parametrize("maximum", [2, 17])
async def test_mqtt_3_1_2_24_a_connack_over_the_clients_maximum_is_not_sent(
    port: int, maximum: int
) -> None:
    """MQTT-3.1.2-24: a CONNACK larger than the client's Maximum Packet Size is not sent.

    The CONNACK that accepts a client has no Reason String or User Property to leave out (18
    bytes with hexmq's properties): over a smaller maximum the connection is closed with
    nothing sent, no DISCONNECT either (none may come before CONNACK).
    """
    client, answer = await open5(port, maximum)
    assert answer is None
    await client.close()
    # A maximum of 18 takes it.
    client, connack = await open5(port, 18)
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == 0
    assert len(encode(connack, 5)) <= 18
    await client.close()
