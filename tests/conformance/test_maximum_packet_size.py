"""MQTT 5.0 Maximum Packet Size: a delivery larger than the client's maximum is discarded and
the session goes on. (The server's own maximum, 0x95, is in test_malformed.py.)"""

from __future__ import annotations

import uuid

from hexmq.mqtt import Properties, Publish
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


async def test_mqtt_3_1_2_25_deliveries_larger_than_the_clients_maximum_are_discarded(  # type: ignore[no-untyped-def]
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
