"""A Reason String is left out of a CONNACK or DISCONNECT that would otherwise exceed the
client's Maximum Packet Size, and kept when it fits (real broker, raw 5.0 client)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from hexmq.mqtt import ConnAck, Connect, Disconnect, Packet, Properties, encode
from services.edge.passwd import set_password
from tests.support.rawclient import RawClient

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
    cid = f"rs-{uuid.uuid4().hex[:8]}"
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
