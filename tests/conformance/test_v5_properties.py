"""MQTT 5.0 properties across three nodes (RF 2), publisher and subscriber on different nodes:
Message Expiry Interval, the PUBLISH properties (Payload Format Indicator, Content Type,
Response Topic, Correlation Data, User Properties) forwarded unaltered, No Local, and the
Authentication Method. Other 5.0 features are in their own modules: Session Expiry
(test_sessions), Subscription Identifiers (test_overlapping_subscriptions), Receive Maximum
(test_flow_control), Topic Aliases (test_topic_aliases), Maximum Packet Size
(test_maximum_packet_size). tests.support.v5client says how "nothing else arrives" is shown."""

from __future__ import annotations

import asyncio

from hexmq.mqtt import NO_PROPERTIES, ConnAck, Connect, Properties, PubAck, Publish, Subscription
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.support.v5client import KEEP, connect, leave, open_v5, publish, receive, subscribe

# ----- Message Expiry Interval (MQTT-3.3.2-5, MQTT-3.3.2-6) --------------------------------


async def test_mqtt_3_3_2_5_message_expiry_interval(trio) -> None:
    """MQTT-3.3.2-5: a message past its Message Expiry Interval is not delivered.

    Queued and retained. Also MQTT-3.3.2-6 (the forwarded interval is less the time waited:
    queued, retained and live).
    """
    u = uid()
    topic, retained = f"exp/{u}/q", f"exp/{u}/r"
    client_id = f"exp-{u}"
    sub, _ = await connect(trio.mqtt_port(1), client_id, session_expiry_interval=KEEP)
    assert await subscribe(sub, Subscription(topic, 1)) == (1,)
    await leave(sub)

    pub, _ = await connect(trio.mqtt_port(2))
    await publish(pub, topic, b"short", message_expiry_interval=1)
    await publish(pub, topic, b"long", message_expiry_interval=60)
    await publish(pub, topic, b"forever")
    # Retained ones expire too; in topic order the expiring one would come first.
    await publish(pub, f"{retained}/a", b"short", retain=True, message_expiry_interval=1)
    await publish(pub, f"{retained}/b", b"long", retain=True, message_expiry_interval=60)
    await asyncio.sleep(2.5)  # the 1 s messages expire while the subscriber is away

    sub, connack = await connect(
        trio.mqtt_port(3), client_id, clean_start=False, session_expiry_interval=KEEP
    )
    assert connack.session_present is True
    queued = [await receive(sub), await receive(sub)]
    # MQTT-3.3.2-5: the expired message is not delivered; the others are, in order.
    assert [p.payload for p in queued] == [b"long", b"forever"]
    # MQTT-3.3.2-6: what remains of the 60 s, less the 2.5 s it waited (rounded up).
    remaining = queued[0].properties.message_expiry_interval
    assert remaining is not None
    assert 50 <= remaining <= 58
    assert queued[1].properties.message_expiry_interval is None

    assert await subscribe(sub, Subscription(f"{retained}/+", 1)) == (1,)
    kept = await receive(sub)
    assert (kept.topic, kept.payload, kept.retain) == (f"{retained}/b", b"long", True)
    remaining = kept.properties.message_expiry_interval
    assert remaining is not None
    assert 50 <= remaining <= 58

    # A live delivery carries the interval too (at most what was published).
    await publish(pub, topic, b"live", message_expiry_interval=30)
    live = await receive(sub)
    assert live.payload == b"live"
    remaining = live.properties.message_expiry_interval
    assert remaining is not None
    assert 25 <= remaining <= 30


# ----- PUBLISH properties forwarded unaltered (MQTT-3.3.2-4, -15, -16, -17, -18, -20) -------


FULL = Properties(
    payload_format_indicator=1,
    content_type="application/json; charset=utf-8",
    response_topic="reply/ünïcode/x",
    correlation_data=bytes(range(256)),
    user_properties=(
        ("b", "2"),
        ("a", "1"),
        ("b", "3"),  # a repeated name, and out of alphabetical order
        ("ключ", "значение"),
        ("empty", ""),
    ),
)


SMALL = Properties(payload_format_indicator=0, user_properties=(("only", "one"),))


async def test_mqtt_3_3_2_4_publish_properties_reach_subscribers_unaltered(trio) -> None:
    """MQTT-3.3.2-4: the Payload Format Indicator is forwarded unaltered.

    So are the Response Topic, Correlation Data, User Properties (in order) and Content Type:
    MQTT-3.3.2-15, -16, -17, -18, -20; to live QoS 0 and 1, queued and retained deliveries.
    """
    u = uid()
    topic = f"props/{u}"
    queued_id = f"props-q-{u}"
    live1, _ = await connect(trio.mqtt_port(1))
    live0, _ = await connect(trio.mqtt_port(3))
    assert await subscribe(live1, Subscription(topic, 1)) == (1,)
    assert await subscribe(live0, Subscription(topic, 0)) == (0,)
    queued, _ = await connect(trio.mqtt_port(1), queued_id, session_expiry_interval=KEEP)
    assert await subscribe(queued, Subscription(topic, 1)) == (1,)
    await leave(queued)

    pub, _ = await connect(trio.mqtt_port(2))
    sent = [(b'{"n": 1}', FULL), (b"\x00\xff binary", SMALL), (b"none", NO_PROPERTIES)]
    for payload, props in sent:
        await publish(pub, topic, payload, properties=props)
    await publish(pub, f"{topic}/kept", b'{"n": 1}', retain=True, properties=FULL)

    queued, connack = await connect(
        trio.mqtt_port(3), queued_id, clean_start=False, session_expiry_interval=KEEP
    )
    assert connack.session_present is True
    for client in (live1, live0, queued):
        got = [await receive(client) for _ in sent]
        assert [(p.payload, p.properties) for p in got] == sent

    # The retained copy keeps them too.
    later, _ = await connect(trio.mqtt_port(3))
    assert await subscribe(later, Subscription(f"{topic}/kept", 1)) == (1,)
    kept = await receive(later)
    assert (kept.payload, kept.retain, kept.properties) == (b'{"n": 1}', True, FULL)


async def test_mqtt_3_3_2_20_empty_content_type_and_correlation_data_are_forwarded(trio) -> None:
    """MQTT-3.3.2-20: the Content Type is forwarded unaltered, a zero-length one included.

    Also MQTT-3.3.2-16 (a zero-length Correlation Data).
    """
    # A zero-length UTF-8 string and zero-length Binary Data are valid values (1.5.4, 1.5.6):
    # a subscriber must see the property present and empty, as it was published.
    topic = f"props-empty/{uid()}"
    sub, _ = await connect(trio.mqtt_port(1))
    assert await subscribe(sub, Subscription(topic, 1)) == (1,)
    pub, _ = await connect(trio.mqtt_port(2))
    await publish(pub, topic, b"x", content_type="", correlation_data=b"")
    got = await receive(sub)
    assert (got.properties.content_type, got.properties.correlation_data) == ("", b"")


# ----- No Local (MQTT-3.8.3-3) ----------------------------------------------------------


async def publish_to_self(client: RawClient, topic: str, payload: bytes) -> list[Publish]:
    """A QoS 1 PUBLISH from a client that may itself be subscribed: the deliveries to it that
    came before its PUBACK (acknowledged)."""
    pid = client.next_packet_id()
    await client.send(Publish(topic, payload, 1, packet_id=pid))
    before = []
    while not isinstance(packet := await client.recv(), PubAck):
        assert isinstance(packet, Publish), packet
        assert packet.packet_id is not None
        await client.send(PubAck(packet.packet_id))
        before.append(packet)
    assert (packet.packet_id, packet.reason_code) == (pid, 0)
    return before


async def test_mqtt_3_8_3_3_no_local(trio) -> None:
    """MQTT-3.8.3-3: No Local: a message is not forwarded to the ClientID that published it.

    Also from a later connection of that ClientID, and with an overlapping plain subscription
    (MQTT-3.3.4-3: only that subscription's identifier).
    """
    u = uid()
    me_id = f"nl-me-{u}"
    quiet, loud, both = f"nl/{u}/quiet", f"nl/{u}/loud", f"nl/{u}/both/x"
    # Subscribed on one connection, published from a later one: No Local is about the
    # ClientID, not the connection.
    me, _ = await connect(trio.mqtt_port(1), me_id, session_expiry_interval=KEEP)
    codes = await subscribe(me, Subscription(quiet, 1, no_local=True), Subscription(loud, 1))
    assert codes == (1, 1)
    assert await subscribe(me, Subscription(both, 1, no_local=True), sub_id=1) == (1,)
    assert await subscribe(me, Subscription(f"nl/{u}/both/+", 1), sub_id=2) == (1,)
    await leave(me)
    me, connack = await connect(
        trio.mqtt_port(3), me_id, clean_start=False, session_expiry_interval=KEEP
    )
    assert connack.session_present is True
    other, _ = await connect(trio.mqtt_port(2))

    # My own publish on the No Local subscription does not come back; another client's does
    # (and would come after mine, had mine been delivered).
    assert await publish_to_self(me, quiet, b"mine") == []
    await publish(other, quiet, b"theirs")
    got = await receive(me)
    assert (got.topic, got.payload) == (quiet, b"theirs")
    # On a subscription without No Local my own publishes come back.
    (got,) = await publish_to_self(me, loud, b"mine") or [await receive(me)]
    assert (got.topic, got.payload) == (loud, b"mine")
    # Overlapping: my own publish comes by the plain subscription only (its identifier only).
    (got,) = await publish_to_self(me, both, b"mine") or [await receive(me)]
    assert (got.payload, got.properties.subscription_identifiers) == (b"mine", (2,))
    await publish(other, both, b"theirs")
    got = await receive(me)
    assert got.payload == b"theirs"
    assert sorted(got.properties.subscription_identifiers) == [1, 2]


# ----- Authentication Method (MQTT-4.12.0-1) ----------------------------------------------


async def test_mqtt_4_12_0_1_an_unsupported_authentication_method_is_refused(trio) -> None:
    """MQTT-4.12.0-1: an unsupported Authentication Method gets CONNACK 0x8C, then close."""
    # MQTT-4.12.0-1: CONNACK 0x8C (Bad authentication method), then the connection closes.
    client = await open_v5(trio.mqtt_port(1))
    await client.send(
        Connect(
            client_id=f"auth-{uid()}",
            protocol_version=5,
            properties=Properties(authentication_method="SCRAM-SHA-256"),
        )
    )
    connack = await client.expect(ConnAck)
    assert (connack.reason_code, connack.session_present) == (0x8C, False)
    assert await client.wait_closed() == []
