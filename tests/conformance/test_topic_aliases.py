"""MQTT 5.0 Topic Aliases from the client: set and used, refused when never set or above the
server's Topic Alias Maximum, every alias up to the maximum accepted, none kept across
connections.

`limits_node` announces Topic Alias Maximum 4 (tests/conformance/conftest.py)."""

from __future__ import annotations

import uuid

from hexmq.mqtt import Disconnect, Properties, PubAck, Publish, Subscription
from tests.support.rawclient import RawClient
from tests.support.v5client import KEEP, connect, leave, publish, receive, subscribe


def uid() -> str:
    return uuid.uuid4().hex[:10]


async def test_mqtt_3_3_2_9_inbound_topic_aliases(limits_node) -> None:  # type: ignore[no-untyped-def]
    """MQTT-3.3.2-9: a Topic Alias above the server's Topic Alias Maximum: DISCONNECT 0x94.

    Also a set alias used for later PUBLISHes, and §3.3.2.3.4 (an alias used before it was
    set is a Protocol Error, 0x82).
    """
    port = limits_node.mqtt_port(1)
    topic = f"alias/{uid()}"
    sub, _ = await RawClient.connect(port, f"sub-{uid()}")
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    await pub.send(Publish(topic, b"one", qos=1, packet_id=1, properties=Properties(topic_alias=3)))
    await pub.expect(PubAck)
    await pub.send(Publish("", b"two", qos=1, packet_id=2, properties=Properties(topic_alias=3)))
    await pub.expect(PubAck)
    assert [(await sub.expect(Publish)).topic for _ in range(2)] == [topic, topic]

    # An alias never set is a protocol error; one above the maximum is 0x94.
    for alias, payload_topic, code in ((2, "", 0x82), (5, topic, 0x94)):
        bad, _ = await RawClient.connect(port, f"bad-{uid()}", version=5)
        await bad.send(
            Publish(payload_topic, b"x", qos=0, properties=Properties(topic_alias=alias))
        )
        seen = await bad.wait_closed()
        await bad.close()
        assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, code)]  # type: ignore[union-attr]
    for client in (pub, sub):
        await client.close()


async def test_mqtt_3_3_2_7_topic_aliases_are_per_connection(trio) -> None:  # type: ignore[no-untyped-def]
    """MQTT-3.3.2-7: Topic Alias mappings do not carry over to another connection.

    Also MQTT-3.3.2-12 (every alias from 1 to the announced maximum is accepted).
    """
    # MQTT-3.3.2-12: every alias from 1 to the announced maximum works; MQTT-3.3.2-7: none of
    # them carries over to the client's next connection.
    base = f"alias/{uid()}"
    watcher, _ = await connect(trio.mqtt_port(3))
    assert await subscribe(watcher, Subscription(f"{base}/#", 1)) == (1,)
    client_id = f"alias-{uid()}"
    client, connack = await connect(trio.mqtt_port(1), client_id, session_expiry_interval=KEEP)
    maximum = connack.properties.topic_alias_maximum
    assert maximum is not None
    assert maximum > 0
    for alias in range(1, maximum + 1):
        await publish(client, f"{base}/{alias}", b"set", topic_alias=alias)
    for alias in range(1, maximum + 1):
        await publish(client, "", b"used", topic_alias=alias)
    got = [await receive(watcher) for _ in range(2 * maximum)]
    assert [(p.topic, p.payload) for p in got] == [
        *((f"{base}/{alias}", b"set") for alias in range(1, maximum + 1)),
        *((f"{base}/{alias}", b"used") for alias in range(1, maximum + 1)),
    ]
    await leave(client)

    client, connack = await connect(
        trio.mqtt_port(1), client_id, clean_start=False, session_expiry_interval=0
    )
    assert connack.session_present is True
    await client.send(Publish("", b"stale", 1, packet_id=1, properties=Properties(topic_alias=1)))
    seen = await client.wait_closed()
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x82)]  # type: ignore[union-attr]
