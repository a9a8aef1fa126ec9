"""Three nodes (RF 2, static membership) route as one broker: a publish on another node right
after the SUBACK reaches the new subscriber (the SUBACK waits for every edge's index).

The MQTT behaviour across nodes (sessions that follow the client, fan-out to every node,
takeover) is in tests/conformance: test_sessions, test_topics, test_takeover."""

from __future__ import annotations

import pytest

from hexmq.mqtt import PubAck, Publish
from tests.support.rawclient import RawClient
from tests.support.unique import uid


@pytest.fixture(scope="module")
def trio(hexmq_cluster_module):
    return hexmq_cluster_module(nodes=3, extra=["--rf", "2"])


async def test_a_publish_on_another_node_right_after_suback_reaches_the_subscriber(trio) -> None:
    # SUBACK waits until every edge routes by the new filter, so no node can miss it.
    pub, _ = await RawClient.connect(trio.mqtt_port(1), f"pub-{uid()}", version=5)
    sub, _ = await RawClient.connect(trio.mqtt_port(2), f"sub-{uid()}", version=5)
    for i in range(30):
        topic = f"race/{uid()}/{i}"
        await sub.subscribe(topic, qos=1)
        ack = await pub.publish(topic, b"right after")
        assert ack is not None
        assert ack.reason_code == 0, (i, ack)  # not 0x10 (no matching subscribers)
        packet = await sub.expect(Publish)
        assert packet.topic == topic
        assert packet.packet_id is not None
        await sub.send(PubAck(packet.packet_id))
    for client in (pub, sub):
        await client.close()
