"""A Will Message at QoS 2 (MQTT 5.0 3.2.2.3.4, 3.1.2.6): hexmq supports QoS 2, so a CONNECT with
Will QoS 2 is accepted, and the will, published when the connection is lost, reaches a QoS 2
subscriber on another node through the whole QoS 2 flow, once."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from hexmq.mqtt import (
    ConnAck,
    Connect,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Will,
)
from tests.support.placement import client_id_on
from tests.support.rawclient import RawClient


@pytest.fixture(scope="module")
def duo(hexmq_cluster_module: Any) -> Any:
    return hexmq_cluster_module(nodes=2)


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_2_2_12_will_qos_2_is_accepted_and_published_at_qos_2(
    duo: Any, version: int
) -> None:
    """MQTT-3.2.2-12: an unsupported Will QoS is refused (0x9B); hexmq supports QoS 2, uses it."""
    c = duo
    topic = f"wills/{uuid.uuid4().hex[:8]}"
    sub = await RawClient.open(c.mqtt_port(2), 5)
    await sub.send(Connect(client_id=client_id_on("n2", 2, "sub"), protocol_version=5))
    assert (await sub.expect(ConnAck)).reason_code == 0
    assert (await sub.subscribe(topic, qos=2)).reason_codes == (2,)

    dying = await RawClient.open(c.mqtt_port(1), version)
    will = Will(topic, b"gone", qos=2)
    await dying.send(
        Connect(client_id=client_id_on("n1", 2, "dying"), protocol_version=version, will=will)
    )
    assert (await dying.expect(ConnAck)).reason_code == 0  # not 0x9B
    await dying.close()  # lost without DISCONNECT: the will is due at once

    got = await sub.expect(Publish, timeout=10)
    assert (got.topic, got.payload, got.qos) == (topic, b"gone", 2)
    assert got.packet_id is not None
    await sub.send(PubRec(got.packet_id))
    assert await sub.expect(PubRel) == PubRel(got.packet_id)
    await sub.send(PubComp(got.packet_id))
    # Once: the next delivery is a marker, not the will again.
    marker, _ = await RawClient.connect(c.mqtt_port(1), client_id_on("n1", 2, "marker"))
    await marker.publish(topic, b"marker", qos=1)
    assert (await sub.expect(Publish)).payload == b"marker"
    for client in (sub, marker):
        await client.close()
