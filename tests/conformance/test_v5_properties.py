"""MQTT 5.0 features across three nodes (RF 2), publisher and subscriber on different nodes:
Message Expiry Interval, the PUBLISH properties forwarded unaltered, No Local, Subscription
Identifiers on live and queued deliveries, Session Expiry Interval, the server's Receive
Maximum window, topic aliases per connection, and a few smaller rules (DUP, RETAIN 0, Will
Retain 0, Maximum QoS, authentication methods, shared-subscription PUBACK failures).

"Nothing else arrives" is shown without sleeping where the broker's ordering allows it: a
sentinel that must come after the message that must not arrive (one publisher's messages reach
a session in publish order; a session's queued messages come right after CONNACK; retained
messages of one SUBSCRIBE come in one batch, in topic order)."""

from __future__ import annotations

import asyncio
import time
import unicodedata
import uuid
from collections.abc import AsyncIterator

import pytest

from hexmq.mqtt import (
    NO_PROPERTIES,
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from tests.support.rawclient import RawClient

KEEP = 600  # a Session Expiry Interval that outlives the test


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def trio(hexmq_cluster_module):  # type: ignore[no-untyped-def]
    return hexmq_cluster_module(nodes=3, partitions=32, extra=["--rf", "2"])


# Every client a test opens, closed when it ends (pass or fail).
_open: list[RawClient] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


async def open_v5(port: int) -> RawClient:
    client = await RawClient.open(port, 5)
    _open.append(client)
    return client


async def connect(
    port: int, client_id: str | None = None, *, clean_start: bool = True, **props: object
) -> tuple[RawClient, ConnAck]:
    """A 5.0 connection; `props` are CONNECT properties (e.g. session_expiry_interval=60)."""
    client = await open_v5(port)
    await client.send(
        Connect(
            client_id=client_id or f"c-{uid()}",
            protocol_version=5,
            clean_start=clean_start,
            properties=Properties(**props) if props else NO_PROPERTIES,  # type: ignore[arg-type]
        )
    )
    connack = await client.expect(ConnAck)
    assert connack.reason_code == 0, connack
    return client, connack


async def subscribe(
    client: RawClient, *subscriptions: Subscription, sub_id: int | None = None
) -> tuple[int, ...]:
    """SUBSCRIBE (with a Subscription Identifier if given); the SUBACK's reason codes."""
    pid = client.next_packet_id()
    props = Properties(subscription_identifiers=(sub_id,)) if sub_id else NO_PROPERTIES
    await client.send(Subscribe(pid, subscriptions, props))
    suback = await client.expect(SubAck)
    assert suback.packet_id == pid  # MQTT-3.8.4-2
    return suback.reason_codes


async def publish(
    client: RawClient,
    topic: str,
    payload: bytes,
    *,
    qos: int = 1,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    properties: Properties | None = None,
    **props: object,
) -> PubAck | None:
    """PUBLISH with `properties` (or `props` as its properties); for QoS 1 the PUBACK, which
    must carry the PUBLISH's packet id (MQTT-2.2.1-5) and not be a failure."""
    pid = (packet_id or client.next_packet_id()) if qos else None
    if properties is None:
        properties = Properties(**props) if props else NO_PROPERTIES  # type: ignore[arg-type]
    await client.send(Publish(topic, payload, qos, retain, dup, pid, properties))
    if not qos:
        return None
    ack = await client.expect(PubAck)
    assert ack.packet_id == pid
    assert ack.reason_code < 0x80, ack
    return ack


async def receive(client: RawClient, timeout: float = 10.0) -> Publish:
    """The next PUBLISH, acknowledged if QoS 1."""
    packet = await client.expect(Publish, timeout)
    if packet.qos:
        assert packet.packet_id is not None
        await client.send(PubAck(packet.packet_id))
    return packet


async def leave(client: RawClient, **props: object) -> None:
    """A normal DISCONNECT (with `props`, e.g. a new session_expiry_interval), then close."""
    properties = Properties(**props) if props else NO_PROPERTIES  # type: ignore[arg-type]
    await client.send(Disconnect(0, properties))
    await client.close()


async def nothing_within(client: RawClient, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        await client.recv(timeout=seconds)


# ----- Message Expiry Interval (MQTT-3.3.2-5, MQTT-3.3.2-6) --------------------------------


async def test_message_expiry_interval(trio) -> None:  # type: ignore[no-untyped-def]
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


async def test_publish_properties_reach_subscribers_unaltered(trio) -> None:  # type: ignore[no-untyped-def]
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


async def test_empty_content_type_and_correlation_data_are_forwarded(trio) -> None:  # type: ignore[no-untyped-def]
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


async def test_no_local(trio) -> None:  # type: ignore[no-untyped-def]
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


# ----- Subscription Identifiers and overlapping subscriptions (MQTT-3.3.4-2/-3/-4) --------


async def test_subscription_identifiers_on_live_and_queued_deliveries(trio) -> None:  # type: ignore[no-untyped-def]
    u = uid()
    base = f"si/{u}"
    sub_id = f"si-{u}"
    big = 268_435_455  # the largest Variable Byte Integer
    sub, _ = await connect(trio.mqtt_port(1), sub_id, session_expiry_interval=KEEP)
    assert await subscribe(sub, Subscription(f"{base}/+/x", 0), sub_id=7) == (0,)
    assert await subscribe(sub, Subscription(f"{base}/a/#", 1), sub_id=big) == (1,)
    assert await subscribe(sub, Subscription(f"{base}/plain/#", 1)) == (1,)  # no identifier
    pub, _ = await connect(trio.mqtt_port(2))

    cases = [
        # topic, delivered QoS, identifiers: one copy per message at the highest granted QoS
        # of the matching subscriptions, with the identifier of each that has one.
        ("a/x", 1, [7, big]),
        ("b/x", 0, [7]),
        ("a/y", 1, [big]),
        ("plain/x", 1, [7]),
        ("plain/y", 1, []),
    ]
    for topic, _, _ in cases:
        await publish(pub, f"{base}/{topic}", topic.encode())
    await publish(pub, f"{base}/plain/end", b"end")  # no second copy of any before this
    got = [await receive(sub) for _ in range(len(cases) + 1)]
    assert [(p.topic, p.qos, sorted(p.properties.subscription_identifiers)) for p in got] == [
        *((f"{base}/{topic}", qos, ids) for topic, qos, ids in cases),
        (f"{base}/plain/end", 1, []),
    ]

    # Queued while the session is offline, delivered on another node: the same identifiers.
    await leave(sub)
    await publish(pub, f"{base}/a/x", b"queued")
    sub, connack = await connect(
        trio.mqtt_port(3), sub_id, clean_start=False, session_expiry_interval=KEEP
    )
    assert connack.session_present is True
    got1 = await receive(sub)
    assert (got1.payload, got1.qos) == (b"queued", 1)
    assert sorted(got1.properties.subscription_identifiers) == [7, big]

    # A subscription replaced without an identifier loses it.
    assert await subscribe(sub, Subscription(f"{base}/a/#", 1)) == (1,)
    await publish(pub, f"{base}/a/y", b"replaced")
    got1 = await receive(sub)
    assert (got1.payload, got1.properties.subscription_identifiers) == (b"replaced", ())


# ----- Session Expiry Interval (MQTT-4.1.0-2, MQTT-3.1.2-23) -------------------------------


async def test_session_expiry_interval(trio) -> None:  # type: ignore[no-untyped-def]
    u = uid()
    ids = {name: f"se-{name}-{u}" for name in ("short", "lowered", "long", "zero")}
    topics = {name: f"se/{u}/{name}" for name in ids}
    pub, _ = await connect(trio.mqtt_port(2))

    # No expiry (0): the session ends with the connection.
    zero, _ = await connect(trio.mqtt_port(1), ids["zero"], clean_start=False)
    assert await subscribe(zero, Subscription(topics["zero"], 1)) == (1,)
    await leave(zero)
    zero, connack = await connect(trio.mqtt_port(1), ids["zero"], clean_start=False)
    assert connack.session_present is False
    await zero.close()

    # 2 s from CONNECT, 2 s set by DISCONNECT (down from 600), and 60 s.
    expiries = {"short": 2, "lowered": KEEP, "long": 60}
    clients = {}
    for name, expiry in expiries.items():
        client, _ = await connect(trio.mqtt_port(1), ids[name], session_expiry_interval=expiry)
        assert await subscribe(client, Subscription(topics[name], 1)) == (1,)
        clients[name] = client
    await leave(clients["short"])
    await leave(clients["lowered"], session_expiry_interval=2)
    await leave(clients["long"])
    gone_at = time.monotonic() + 3
    for name in expiries:
        await publish(pub, topics[name], b"queued")
    await asyncio.sleep(gone_at - time.monotonic())

    for name in ("short", "lowered"):
        client, connack = await connect(
            trio.mqtt_port(3), ids[name], clean_start=False, session_expiry_interval=2
        )
        assert (name, connack.session_present) == (name, False)
        # Neither its queued message nor its subscription is left: the first thing it gets
        # is the sentinel, published after a message on its old topic.
        assert await subscribe(client, Subscription(f"{topics[name]}/sentinel", 1)) == (1,)
        await publish(pub, topics[name], b"after")
        await publish(pub, f"{topics[name]}/sentinel", b"sentinel")
        got = await receive(client)
        assert (name, got.payload) == (name, b"sentinel")
        await leave(client, session_expiry_interval=0)

    client, connack = await connect(
        trio.mqtt_port(3), ids["long"], clean_start=False, session_expiry_interval=60
    )
    assert connack.session_present is True
    got = await receive(client)
    assert (got.topic, got.payload) == (topics["long"], b"queued")
    await leave(client, session_expiry_interval=0)


async def test_disconnect_cannot_give_an_expiry_to_a_session_without_one(trio) -> None:  # type: ignore[no-untyped-def]
    # 3.14.2.2.2: with Session Expiry Interval 0 in CONNECT, a non-zero one in DISCONNECT is a
    # Protocol Error; the server does not take it as a valid DISCONNECT, so the session still
    # ends with the connection (Session Expiry Interval 0, MQTT-3.1.2-23 / MQTT-4.1.0-2).
    client_id = f"se-bad-{uid()}"
    client, _ = await connect(trio.mqtt_port(1), client_id, clean_start=False)
    await client.send(Disconnect(0, Properties(session_expiry_interval=KEEP)))
    seen = await client.wait_closed()
    assert [(type(p), getattr(p, "reason_code", None)) for p in seen] == [(Disconnect, 0x82)]
    await client.close()
    client, connack = await connect(
        trio.mqtt_port(1), client_id, clean_start=False, session_expiry_interval=0
    )
    assert connack.session_present is False


# ----- The server's sending window and packet identifiers (MQTT-3.3.4-9, MQTT-2.2.1-4) ------


async def test_deliveries_stay_within_the_clients_receive_maximum(trio) -> None:  # type: ignore[no-untyped-def]
    topic = f"rmax/{uid()}"
    sub, _ = await connect(trio.mqtt_port(1), receive_maximum=3)
    assert await subscribe(sub, Subscription(topic, 1)) == (1,)
    pub, _ = await connect(trio.mqtt_port(2))
    for i in range(10):
        await publish(pub, topic, f"{i}".encode())
    got: list[Publish] = []
    while len(got) < 10:
        window = [await sub.expect(Publish) for _ in range(min(3, 10 - len(got)))]
        await nothing_within(sub, 0.5)  # no more than 3 unacknowledged at a time
        got += window
        for packet in window:
            assert packet.packet_id is not None
            await sub.send(PubAck(packet.packet_id))
    assert [p.payload for p in got] == [f"{i}".encode() for i in range(10)]


async def test_unacknowledged_deliveries_have_distinct_packet_ids(trio) -> None:  # type: ignore[no-untyped-def]
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


# ----- Smaller rules --------------------------------------------------------------------


async def test_outgoing_dup_is_the_brokers_own(trio) -> None:  # type: ignore[no-untyped-def]
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


async def test_maximum_qos_2_and_subscribe_at_qos_2(trio) -> None:  # type: ignore[no-untyped-def]
    # MQTT-3.2.2-9: no Maximum QoS in CONNACK means QoS 2 is supported; a SUBSCRIBE at QoS 2 is
    # granted 2 and a QoS 1 publish arrives at QoS 1 (min of the two). MQTT-4.12.0-6: no
    # Authentication Method asked, none in CONNACK.
    topic = f"qos2/{uid()}"
    sub, connack = await connect(trio.mqtt_port(1))
    assert connack.properties.maximum_qos is None
    assert connack.properties.authentication_method is None
    assert connack.properties.authentication_data is None
    assert await subscribe(sub, Subscription(topic, 2)) == (2,)
    pub, _ = await connect(trio.mqtt_port(2))
    await publish(pub, topic, b"x")
    got = await receive(sub)
    assert (got.payload, got.qos) == (b"x", 1)


async def test_an_unsupported_authentication_method_is_refused(trio) -> None:  # type: ignore[no-untyped-def]
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


async def test_retain_0_neither_stores_nor_removes(trio) -> None:  # type: ignore[no-untyped-def]
    # MQTT-3.3.1-8. In topic order a retained message on ".../a-never" would come before the
    # one on ".../b-kept": the first retained message a new subscriber gets shows there is none.
    base = f"ret0/{uid()}"
    # A live subscriber, so that the RETAIN 0 publishes go through the partitions.
    live, _ = await connect(trio.mqtt_port(1))
    assert await subscribe(live, Subscription(f"{base}/+", 1)) == (1,)
    pub, _ = await connect(trio.mqtt_port(2))
    sent = [
        ("b-kept", b"kept", True),
        ("b-kept", b"live", False),
        ("b-kept", b"", False),  # an empty payload without RETAIN removes nothing
        ("a-never", b"live", False),
    ]
    for topic, payload, retain in sent:
        await publish(pub, f"{base}/{topic}", payload, retain=retain)
    got_live = [await receive(live) for _ in sent]
    assert [(p.topic, p.payload) for p in got_live] == [(f"{base}/{t}", b) for t, b, _ in sent]
    sub, _ = await connect(trio.mqtt_port(3))
    assert await subscribe(sub, Subscription(f"{base}/+", 1)) == (1,)
    got = await receive(sub)
    assert (got.topic, got.payload, got.retain) == (f"{base}/b-kept", b"kept", True)


async def test_a_will_without_retain_is_not_retained(trio) -> None:  # type: ignore[no-untyped-def]
    # MQTT-3.1.2-14: published as a non-retained message (RETAIN 0 even to a subscriber with
    # Retain As Published), and not kept for later subscribers.
    base = f"will0/{uid()}"
    pub, _ = await connect(trio.mqtt_port(2))
    await publish(pub, f"{base}/zz-marker", b"marker", retain=True)
    watcher, _ = await connect(trio.mqtt_port(3))
    assert await subscribe(watcher, Subscription(f"{base}/w", 1, retain_as_published=True)) == (1,)
    dying = await open_v5(trio.mqtt_port(1))
    await dying.send(
        Connect(
            client_id=f"will0-{uid()}",
            protocol_version=5,
            will=Will(f"{base}/w", b"gone", qos=1, retain=False),
        )
    )
    assert (await dying.expect(ConnAck)).reason_code == 0
    dying.writer.transport.abort()  # a lost connection: the will is published
    await dying.close()
    got = await receive(watcher)
    assert (got.topic, got.payload, got.retain) == (f"{base}/w", b"gone", False)

    later, _ = await connect(trio.mqtt_port(1))
    assert await subscribe(later, Subscription(f"{base}/#", 1)) == (1,)
    got = await receive(later)  # the will's topic sorts before the marker's
    assert (got.topic, got.payload) == (f"{base}/zz-marker", b"marker")


async def test_topic_aliases_are_per_connection(trio) -> None:  # type: ignore[no-untyped-def]
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


async def next_publishes(
    clients: list[RawClient], timeout: float = 10.0
) -> list[tuple[int, Publish]]:
    """The next PUBLISH of whichever of `clients` get one first (several if they come at
    once), each with the index of its client."""
    tasks = [asyncio.create_task(c.expect(Publish, timeout)) for c in clients]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED, timeout=timeout)
    finally:
        for task in tasks:
            task.cancel()  # a read cancelled while waiting for bytes loses none
        results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, Exception):
            raise result
    got = [(i, r) for i, r in enumerate(results) if isinstance(r, Publish)]
    assert got, f"no PUBLISH within {timeout}s"
    return got


async def test_a_failed_puback_from_a_shared_member_discards_the_message(trio) -> None:  # type: ignore[no-untyped-def]
    # MQTT-4.8.2-6: the member that got it answers PUBACK 0x80: the message is neither sent to
    # the other member nor resent to this one when it comes back.
    u = uid()
    group = f"$share/g{u}/shared/{u}"
    topic = f"shared/{u}"
    ids = [f"member-{i}-{u}" for i in (1, 3)]
    ports = [trio.mqtt_port(1), trio.mqtt_port(3)]
    members = []
    for client_id, port in zip(ids, ports, strict=True):
        member, _ = await connect(port, client_id, session_expiry_interval=KEEP)
        assert await subscribe(member, Subscription(group, 1)) == (1,)
        members.append(member)
    pub, _ = await connect(trio.mqtt_port(2))
    await publish(pub, topic, b"refused")
    [(which, got)] = await next_publishes(members)
    assert got.payload == b"refused"
    assert got.packet_id is not None
    await members[which].send(PubAck(got.packet_id, 0x80))
    await leave(members[which])
    members[which], connack = await connect(
        ports[which], ids[which], clean_start=False, session_expiry_interval=KEEP
    )
    assert connack.session_present is True

    sentinels = {f"s{i}".encode() for i in range(6)}
    for payload in sorted(sentinels):
        await publish(pub, topic, payload)
    seen: list[bytes] = []
    while not sentinels <= set(seen):
        for index, packet in await next_publishes(members):
            seen.append(packet.payload)
            assert packet.packet_id is not None
            await members[index].send(PubAck(packet.packet_id))
    assert sorted(seen) == sorted(sentinels)  # "refused" came to no one again


async def test_topic_matching_does_not_normalize(trio) -> None:  # type: ignore[no-untyped-def]
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
