"""Topic names and filters: wildcard matching on one node and across nodes, matching without
normalization, and UNSUBSCRIBE deleting the subscription whose filter it names."""

from __future__ import annotations

import unicodedata

import pytest

from hexmq.mqtt import Publish, Subscription, UnsubAck, Unsubscribe
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.support.v5client import connect, publish, receive, subscribe


async def test_s4_7_1_publish_reaches_subscribers_on_every_node(trio_256) -> None:
    """§4.7.1: wildcard filters match alike for subscribers on every node.

    Three nodes: `#` and `+` subscribers on different nodes each get exactly their matches.
    Also MQTT-3.3.2-3: each delivery carries the Topic Name it was published to.
    """
    base = f"fan/{uid()}"
    subs = []
    for node in (1, 2, 3):
        client, _ = await RawClient.connect(trio_256.mqtt_port(node), f"fan-{node}-{uid()}")
        await client.subscribe(f"{base}/+/x" if node == 2 else f"{base}/#", qos=1)
        subs.append(client)
    pub, _ = await RawClient.connect(trio_256.mqtt_port(1), f"pub-{uid()}")
    await pub.publish(f"{base}/a/x", b"one")
    await pub.publish(f"{base}/a/y", b"two")  # not for the "+/x" subscriber
    await pub.publish(f"{base}/b/x", b"three")
    got = []
    for client, count in zip(subs, (3, 2, 3), strict=True):
        packets = [await client.expect(Publish) for _ in range(count)]
        got.append([(p.topic.removeprefix(base), p.payload) for p in packets])
    every = [("/a/x", b"one"), ("/a/y", b"two"), ("/b/x", b"three")]
    assert got == [every, [("/a/x", b"one"), ("/b/x", b"three")], every]
    for client in (*subs, pub):
        await client.close()


async def test_mqtt_4_7_3_4_topic_matching_does_not_normalize(trio) -> None:
    """MQTT-4.7.3-4: topic matching does no normalization: NFC is not NFD, no case folding."""
    # MQTT-4.7.3-4: no Unicode normalization (NFC "é" is not NFD "e" + U+0301), no case folding.
    base = f"norm/{uid()}"
    nfc = unicodedata.normalize("NFC", "café")
    nfd = unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    sub, _ = await connect(trio.mqtt_port(1))
    assert await subscribe(sub, Subscription(f"{base}/{nfc}", 1)) == (1,)
    pub, _ = await connect(trio.mqtt_port(2))
    await publish(pub, f"{base}/{nfd}", b"nfd")
    await publish(pub, f"{base}/CAFÉ", b"upper")
    await publish(pub, f"{base}/{nfc}", b"nfc")
    got = await receive(sub)
    assert (got.topic, got.payload) == (f"{base}/{nfc}", b"nfc")


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_10_4_1_unsubscribe_stops_delivery(node, version: int) -> None:
    """MQTT-3.10.4-1: an UNSUBSCRIBE filter equal to a subscription's deletes it.

    Also MQTT-3.10.4-2 (no new messages for it), MQTT-3.10.4-4, -5, -6 (one UNSUBACK with the
    packet id, also for a filter without a subscription), MQTT-3.11.3-1, -2 (5.0: 0x00, 0x11).
    """
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


@pytest.mark.parametrize("version", [4, 5])
async def test_s3_11_3_an_invalid_filter_gets_unsuback_0x8f(node, version: int) -> None:
    """§3.11.3: UNSUBSCRIBE of a filter that is not a valid Topic Filter gets 0x8F.

    Topic Filter invalid (as SUBACK answers such a filter), not 0x11 No subscription existed;
    the other filters of the packet are answered as ever. 3.1.1's UNSUBACK has no codes: it is
    answered, and the connection goes on (MQTT-3.10.4-5 (3.1.1)).
    """
    port = node.mqtt_port(1)
    topic = f"u/{uid()}"
    sub, _ = await RawClient.connect(port, f"unsub-{uid()}", version=version)
    await sub.subscribe(topic, qos=1)
    await sub.send(Unsubscribe(2, ("#/test/topic", topic, "a/#/b")))
    unsuback = await sub.expect(UnsubAck)
    assert unsuback.packet_id == 2
    if version == 5:
        assert unsuback.reason_codes == (0x8F, 0x00, 0x8F)
    await sub.send(Unsubscribe(3, ("#/test/topic",)))
    unsuback = await sub.expect(UnsubAck)
    assert unsuback.packet_id == 3
    if version == 5:
        assert unsuback.reason_codes == (0x8F,)
    await sub.close()
