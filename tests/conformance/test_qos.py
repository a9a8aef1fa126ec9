"""QoS 0 and 1: redelivery with DUP on reconnect, the server's packet identifiers and its own
DUP flag. (QoS 2 is tests/conformance/test_qos2.py; Receive Maximum is test_flow_control.py.)"""

from __future__ import annotations

from hexmq.mqtt import PubAck, Publish, Subscription
from tests.support.rawclient import RawClient
from tests.support.sessions import publish_acked, subscribe_then_leave
from tests.support.unique import uid
from tests.support.v5client import connect, publish, receive, subscribe


async def test_mqtt_4_4_0_1_unacknowledged_delivery_is_resent_with_dup(hexmq_cluster) -> None:
    """MQTT-4.4.0-1: on reconnect, an unacknowledged PUBLISH is resent with its packet id.

    Also MQTT-3.3.1-1 (DUP 1 on the resend, 0 the first time).
    """
    cluster = hexmq_cluster(nodes=1)
    port = cluster.mqtt_port(1)
    client_id, topic = f"dup-{uid()}", f"d/{uid()}"
    await subscribe_then_leave(port, client_id, 4, topic)
    sub, _ = await RawClient.connect(port, client_id, clean_start=False)
    await publish_acked(port, 4, topic, 1)
    first = await sub.expect(Publish)
    assert first.dup is False
    await sub.close()  # gone without PUBACK

    sub, connack = await RawClient.connect(port, client_id, clean_start=False)
    assert connack.session_present is True
    again = await sub.expect(Publish)
    # MQTT-4.4.0-1: resent with its original packet identifier, flagged DUP.
    assert (again.payload, again.packet_id, again.dup) == (first.payload, first.packet_id, True)
    await sub.close()


async def test_mqtt_2_2_1_4_unacknowledged_deliveries_have_distinct_packet_ids(trio) -> None:
    """MQTT-2.2.1-4: each QoS > 0 PUBLISH the server sends has an unused non-zero packet id.

    100 deliveries in flight at once.
    """
    topic = f"pid/{uid()}"
    sub, _ = await connect(trio.mqtt_port(1))
    assert await subscribe(sub, Subscription(topic, 1)) == (1,)
    pub, _ = await connect(trio.mqtt_port(2))
    for i in range(100):
        await publish(pub, topic, f"{i}".encode())
    got = [await sub.expect(Publish) for _ in range(100)]  # none acknowledged yet
    ids = [p.packet_id for p in got]
    assert None not in ids
    assert 0 not in ids
    assert len(set(ids)) == 100
    for pid in ids:
        assert pid is not None
        await sub.send(PubAck(pid))


async def test_mqtt_3_3_1_3_outgoing_dup_is_the_brokers_own(trio) -> None:
    """MQTT-3.3.1-3: the outgoing DUP is the server's own, not the incoming PUBLISH's.

    Also MQTT-2.2.1-5 (each PUBACK carries its PUBLISH's packet id, 65535 included).
    """
    # MQTT-3.3.1-3: a PUBLISH that came in with DUP 1 goes out with DUP 0 (a first delivery);
    # each PUBACK carries its PUBLISH's packet id, whatever the id (MQTT-2.2.1-5).
    topic = f"dup/{uid()}"
    sub, _ = await connect(trio.mqtt_port(1))
    assert await subscribe(sub, Subscription(topic, 1)) == (1,)
    pub, _ = await connect(trio.mqtt_port(2))
    await publish(pub, topic, b"resent", dup=True, packet_id=65535)
    await publish(pub, topic, b"first", packet_id=1)
    await publish(pub, topic, b"resent again", dup=True, packet_id=300)
    got = [await receive(sub) for _ in range(3)]
    assert [(p.payload, p.dup) for p in got] == [
        (b"resent", False),
        (b"first", False),
        (b"resent again", False),
    ]
