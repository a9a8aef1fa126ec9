"""Overlapping subscriptions: one copy of a message per client, at the highest granted QoS of
the matching subscriptions, with every matching Subscription Identifier, live and queued."""

from __future__ import annotations

from hexmq.mqtt import Subscription
from tests.support.unique import uid
from tests.support.v5client import (
    KEEP,
    connect,
    leave,
    publish,
    receive,
    receive_resumed,
    subscribe,
)


async def test_mqtt_3_3_4_3_subscription_identifiers_on_live_and_queued_deliveries(trio) -> None:
    """MQTT-3.3.4-3: a delivery carries the Subscription Identifiers of the overlapping ones.

    Live and queued. Also MQTT-3.3.4-2 (one copy, at the highest granted QoS), MQTT-3.3.4-4
    (every matching identifier on the single copy), MQTT-3.8.4-2 (the SUBACK's packet id) and
    MQTT-3.8.4-3 (a subscription replaced without an identifier loses it).
    """
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
    got1 = await receive_resumed(sub, acknowledged=[p.payload for p in got if p.qos])
    # Its DUP may be 1: the publish and the subscriber's DISCONNECT are two clients' packets,
    # in no order, and when the publish reaches the session's master first the message goes
    # to the old connection and comes again here as a redelivery (MQTT-3.3.1-1).
    assert (got1.payload, got1.qos) == (b"queued", 1)
    assert sorted(got1.properties.subscription_identifiers) == [7, big]

    # A subscription replaced without an identifier loses it.
    assert await subscribe(sub, Subscription(f"{base}/a/#", 1)) == (1,)
    await publish(pub, f"{base}/a/y", b"replaced")
    got1 = await receive(sub)
    assert (got1.payload, got1.properties.subscription_identifiers) == (b"replaced", ())
