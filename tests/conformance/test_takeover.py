"""Takeover: a CONNECT for a client id that is connected, on the same node or another, closes
the old connection (5.0: DISCONNECT 0x8E) and the new one has the session."""

from __future__ import annotations

import pytest

from hexmq.mqtt import Disconnect, Properties, Publish
from tests.support.rawclient import RawClient
from tests.support.unique import uid


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_4_3_second_connect_takes_the_session_over(node, version: int) -> None:
    """MQTT-3.1.4-3: a CONNECT for a connected ClientID closes the old connection (5.0: 0x8E).

    The new connection has the session and its subscription. Also MQTT-3.2.2-3 (Session
    Present 1).
    """
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
        assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x8E)]
    else:
        assert seen == []
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    await pub.publish(topic, b"to the new connection", qos=1)
    assert (await second.expect(Publish)).payload == b"to the new connection"
    for client in (pub, second):
        await client.close()


async def test_mqtt_3_1_4_3_takeover_across_nodes(trio_256) -> None:
    """MQTT-3.1.4-3: the old connection gets DISCONNECT 0x8E, also when it is on another node.

    Also G5 (one live connection per client id in the whole cluster).
    """
    client_id = f"one-{uid()}"
    first, _ = await RawClient.connect(trio_256.mqtt_port(1), client_id, version=5)
    second, connack = await RawClient.connect(trio_256.mqtt_port(2), client_id, version=5)
    assert connack.reason_code == 0
    seen = await first.wait_closed()
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x8E)]
    assert isinstance(seen[0], Disconnect)
    assert seen[0].properties.reason_string == (
        "another connection with this client id took the session over"
    )
    for client in (first, second):
        await client.close()
