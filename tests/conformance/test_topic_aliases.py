"""MQTT 5.0 Topic Aliases. From the client: set and used, refused when never set or above the
server's Topic Alias Maximum, every alias up to the maximum accepted, none kept across
connections. `limits_node` announces Topic Alias Maximum 4 (tests/conformance/conftest.py).

To the client: the aliases the broker assigns to the PUBLISHes it sends (MQTT 5.0 3.1.2.11.5,
3.3.2.3.4), on two nodes of their own: publishers on node 1, subscribers on node 2, so every
delivery crosses the cluster. The raw client (our codec in client role) shows the exact packets:
topic name, Topic Alias and nothing else; paho-mqtt shows that another client's parser reads
them. (mosquitto_sub 2.0.11 cannot: it ends the connection at the first PUBLISH with an empty
topic name, as in mosquitto issue 1468, so it is not used here.) An extra `hexmq edge` joins
the cluster where another `--max-outbound-topic-aliases` is needed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from hexmq.mqtt import NO_PROPERTIES, Disconnect, Properties, PubAck, Publish, Subscription
from tests.conftest import HexmqCluster
from tests.support import v5client as v5
from tests.support.edgeproc import edge_process, run_edge_expecting_failure
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.support.v5client import KEEP


async def test_mqtt_3_3_2_9_inbound_topic_aliases(limits_node) -> None:
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
        assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, code)]
    for client in (pub, sub):
        await client.close()


async def test_mqtt_3_3_2_7_topic_aliases_are_per_connection(trio) -> None:
    """MQTT-3.3.2-7: Topic Alias mappings do not carry over to another connection.

    Also MQTT-3.3.2-12 (every alias from 1 to the announced maximum is accepted).
    """
    # MQTT-3.3.2-12: every alias from 1 to the announced maximum works; MQTT-3.3.2-7: none of
    # them carries over to the client's next connection.
    base = f"alias/{uid()}"
    watcher, _ = await v5.connect(trio.mqtt_port(3))
    assert await v5.subscribe(watcher, Subscription(f"{base}/#", 1)) == (1,)
    client_id = f"alias-{uid()}"
    client, connack = await v5.connect(trio.mqtt_port(1), client_id, session_expiry_interval=KEEP)
    maximum = connack.properties.topic_alias_maximum
    assert maximum is not None
    assert maximum > 0
    for alias in range(1, maximum + 1):
        await v5.publish(client, f"{base}/{alias}", b"set", topic_alias=alias)
    for alias in range(1, maximum + 1):
        await v5.publish(client, "", b"used", topic_alias=alias)
    got = [await v5.receive(watcher) for _ in range(2 * maximum)]
    assert [(p.topic, p.payload) for p in got] == [
        *((f"{base}/{alias}", b"set") for alias in range(1, maximum + 1)),
        *((f"{base}/{alias}", b"used") for alias in range(1, maximum + 1)),
    ]
    await v5.leave(client)

    client, connack = await v5.connect(
        trio.mqtt_port(1), client_id, clean_start=False, session_expiry_interval=0
    )
    assert connack.session_present is True
    await client.send(Publish("", b"stale", 1, packet_id=1, properties=Properties(topic_alias=1)))
    seen = await client.wait_closed()
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x82)]


# ----- aliases the broker assigns (2 nodes) ------------------------------------------------


# Three topics taking turns at two aliases: every case of the least-recently-used choice.
TURNS = "aabacabcb"


@pytest.fixture(scope="module")
def pair(hexmq_cluster_module: Callable[..., HexmqCluster]) -> HexmqCluster:
    return hexmq_cluster_module(nodes=2, partitions=16)


# Every raw client a test opens, closed when it ends (pass or fail).
_open: list[RawClient] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    yield
    while _open:
        await _open.pop().close()


async def connect(
    port: int,
    *,
    version: int = 5,
    client_id: str | None = None,
    clean_start: bool = True,
    **props: Any,
) -> RawClient:
    """A connection; `props` are CONNECT properties (e.g. topic_alias_maximum=2)."""
    client, connack = await RawClient.connect(
        port,
        client_id or f"c-{uid()}",
        version=version,
        clean_start=clean_start,
        properties=Properties(**props) if props else NO_PROPERTIES,
    )
    _open.append(client)
    assert connack.reason_code == 0, connack
    return client


async def receive(client: RawClient, count: int, *, ack: bool = True) -> list[Publish]:
    """The next `count` PUBLISHes, each acknowledged (QoS 1) unless `ack` is False."""
    got = []
    for _ in range(count):
        packet = await client.expect(Publish)
        if ack and packet.packet_id is not None:
            await client.send(PubAck(packet.packet_id))
        got.append(packet)
    return got


def wire(packets: Sequence[Publish]) -> list[tuple[str, int | None, Properties, bytes]]:
    """What each PUBLISH carried: topic name, Topic Alias, all its properties, payload."""
    return [(p.topic, p.properties.topic_alias, p.properties, p.payload) for p in packets]


def alias(n: int) -> Properties:
    return Properties(topic_alias=n)


async def publish_all(port: int, messages: Sequence[tuple[str, bytes]]) -> None:
    """Publish at QoS 1, in order, from one client (so each subscriber gets them in order)."""
    pub = await connect(port)
    for topic, payload in messages:
        ack = await pub.publish(topic, payload, qos=1)
        assert ack is not None
        assert ack.reason_code == 0, ack


async def test_mqtt_3_3_2_11_aliases_up_to_the_clients_maximum_least_recently_used_replaced(
    pair: HexmqCluster,
) -> None:
    """'A Server MUST NOT send a PUBLISH packet with a Topic Alias greater than the Topic Alias
    Maximum value sent by the Client in the CONNECT packet.'"""
    base = f"lru/{uid()}"
    a, b, c = f"{base}/a", f"{base}/b", f"{base}/c"
    sub = await connect(pair.mqtt_port(2), topic_alias_maximum=2)
    await sub.subscribe(f"{base}/#", qos=1)
    order = [{"a": a, "b": b, "c": c}[x] for x in TURNS]
    await publish_all(pair.mqtt_port(1), [(t, f"m{i}".encode()) for i, t in enumerate(order)])
    got = await receive(sub, len(order))
    assert wire(got) == [
        (a, 1, alias(1), b"m0"),  # first use: the full name and a new alias
        ("", 1, alias(1), b"m1"),  # then the alias alone
        (b, 2, alias(2), b"m2"),
        ("", 1, alias(1), b"m3"),  # a is now the most recently used, b the least
        (c, 2, alias(2), b"m4"),  # both taken: b's alias 2 now means c
        ("", 1, alias(1), b"m5"),
        (b, 2, alias(2), b"m6"),  # c was least recently used: alias 2 means b again
        (c, 1, alias(1), b"m7"),  # a was: alias 1 now means c
        ("", 2, alias(2), b"m8"),
    ]
    assert max(p.properties.topic_alias or 0 for p in got) == 2


async def test_mqtt_3_1_2_27_no_aliases_without_a_topic_alias_maximum(pair: HexmqCluster) -> None:
    """'If Topic Alias Maximum is absent or zero, the Server MUST NOT send any Topic Aliases to
    the Client.' (A 3.1.1 client has no aliases at all.)"""
    topic = f"none/{uid()}/t"
    port = pair.mqtt_port(2)
    absent = await connect(port)
    zero = await connect(port, topic_alias_maximum=0)
    v311 = await connect(port, version=4)
    for client in (absent, zero, v311):
        await client.subscribe(topic, qos=1)
    await publish_all(pair.mqtt_port(1), [(topic, b"one"), (topic, b"two"), (topic, b"three")])
    for client in (absent, zero, v311):
        got = await receive(client, 3)
        assert wire(got) == [(topic, None, NO_PROPERTIES, p) for p in (b"one", b"two", b"three")]


async def test_mqtt_3_3_2_7_a_new_connection_starts_without_aliases(pair: HexmqCluster) -> None:
    """'A receiver MUST NOT carry forward any Topic Alias mappings from one Network Connection to
    another': a resend after reconnecting, and what follows, name the topic again."""
    topic = f"reconnect/{uid()}/t"
    cid = f"sess-{uid()}"
    port = pair.mqtt_port(2)
    first = await connect(
        port, client_id=cid, clean_start=False, session_expiry_interval=KEEP, topic_alias_maximum=2
    )
    await first.subscribe(topic, qos=1)
    await publish_all(pair.mqtt_port(1), [(topic, b"one"), (topic, b"two")])
    got = await receive(first, 1) + await receive(first, 1, ack=False)
    assert wire(got) == [(topic, 1, alias(1), b"one"), ("", 1, alias(1), b"two")]
    await first.close()  # "two" is not acknowledged: it is resent on the next connection
    second = await connect(
        port, client_id=cid, clean_start=False, session_expiry_interval=KEEP, topic_alias_maximum=2
    )
    (resent,) = await receive(second, 1)
    assert (resent.dup, resent.packet_id) == (True, got[1].packet_id)
    assert wire([resent]) == [(topic, 1, alias(1), b"two")]
    await publish_all(pair.mqtt_port(1), [(topic, b"three")])
    assert wire(await receive(second, 1)) == [("", 1, alias(1), b"three")]


async def test_mqtt_3_1_2_25_a_discarded_delivery_sets_no_alias(pair: HexmqCluster) -> None:
    """'Where a Packet is too large to send, the Server MUST discard it without sending it': the
    alias it would have set is not in use for the next delivery, which names the topic."""
    topic = f"mps/{uid()}/t"
    # A QoS 1 delivery of this topic without properties is 2 + 2 + len(topic) + 2 + 1 bytes
    # before its payload (one-byte remaining length); a Topic Alias adds 3.
    limit = 100
    fits_plain = b"p" * (limit - (7 + len(topic)))
    sub = await connect(pair.mqtt_port(2), topic_alias_maximum=2, maximum_packet_size=limit)
    await sub.subscribe(topic, qos=1)
    await publish_all(
        pair.mqtt_port(1),
        [(topic, b"x" * 500), (topic, fits_plain), (topic, b"small"), (topic, b"again")],
    )
    got = await receive(sub, 3)
    assert wire(got) == [
        # b"x" * 500 is discarded, and its alias with it.
        (topic, None, NO_PROPERTIES, fits_plain),  # fits only without an alias: sent without
        (topic, 1, alias(1), b"small"),
        ("", 1, alias(1), b"again"),
    ]


async def test_mqtt_3_1_2_26_aliases_within_the_edges_cap(
    pair: HexmqCluster, tmp_path: Path
) -> None:
    """'The Server MUST NOT send a Topic Alias in a PUBLISH packet to the Client greater than
    Topic Alias Maximum': here the edge's own cap (3) is below the client's (10)."""
    base = f"cap/{uid()}"
    t = [f"{base}/{i}" for i in range(5)]
    with edge_process(pair, tmp_path, ["--max-outbound-topic-aliases=3"], name="cap3") as edge:
        sub = await connect(edge.port, topic_alias_maximum=10)
        await sub.subscribe(f"{base}/#", qos=1)
        order = [t[0], t[1], t[2], t[3], t[4], t[3], t[4], t[0]]
        await publish_all(pair.mqtt_port(1), [(x, b"m") for x in order])
        got = await receive(sub, len(order))
        await sub.close()
    assert [(p.topic, p.properties.topic_alias) for p in got] == [
        (t[0], 1),
        (t[1], 2),
        (t[2], 3),
        (t[3], 1),  # all three taken: the least recently used goes
        (t[4], 2),
        ("", 1),
        ("", 2),
        (t[0], 3),
    ]


async def test_s3_1_2_11_5_max_outbound_topic_aliases_0_disables_them(
    pair: HexmqCluster, tmp_path: Path
) -> None:
    """With `--max-outbound-topic-aliases 0` deliveries carry the full topic name, whatever the
    client's Topic Alias Maximum; a bad value stops the edge with a clear error."""
    topic = f"off/{uid()}/t"
    with edge_process(pair, tmp_path, ["--max-outbound-topic-aliases=0"], name="noalias") as edge:
        sub = await connect(edge.port, topic_alias_maximum=10)
        await sub.subscribe(topic, qos=1)
        await publish_all(pair.mqtt_port(1), [(topic, b"one"), (topic, b"two")])
        got = await receive(sub, 2)
        await sub.close()
    assert wire(got) == [(topic, None, NO_PROPERTIES, b"one"), (topic, None, NO_PROPERTIES, b"two")]
    code, err = await asyncio.to_thread(
        run_edge_expecting_failure, ["--max-outbound-topic-aliases=70000"]
    )
    assert code == 2
    assert "--max-outbound-topic-aliases must be 0-65535" in err


def test_s3_1_2_11_5_paho_reads_the_aliased_publishes(pair: HexmqCluster) -> None:
    """paho-mqtt (2.2) with Topic Alias Maximum 2 takes every aliased PUBLISH (acknowledged,
    properties parsed). It hands the application the topic name as sent (empty after the first
    use) and the alias, so the application maps aliases itself, as done here."""
    base = f"paho/{uid()}"
    order = [f"{base}/{x}" for x in TURNS]
    received: list[tuple[str, int | None, bytes]] = []
    done = threading.Event()
    subscribed = threading.Event()

    def on_message(client: paho.Client, userdata: object, message: paho.MQTTMessage) -> None:
        received.append(
            (message.topic, getattr(message.properties, "TopicAlias", None), bytes(message.payload))
        )
        if len(received) == len(order):
            done.set()

    props = PahoProperties(PacketTypes.CONNECT)
    props.TopicAliasMaximum = 2
    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"sub-{uid()}", protocol=paho.MQTTv5)
    sub.on_message = on_message
    sub.on_subscribe = lambda *a: subscribed.set()
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{uid()}", protocol=paho.MQTTv5)
    sub.connect("127.0.0.1", pair.mqtt_port(2), properties=props)
    pub.connect("127.0.0.1", pair.mqtt_port(1))
    sub.loop_start()
    pub.loop_start()
    try:
        sub.subscribe(f"{base}/#", qos=1)
        assert subscribed.wait(5)
        for i, topic in enumerate(order):
            pub.publish(topic, f"m{i}".encode(), qos=1).wait_for_publish(5)
        assert done.wait(10), f"got {len(received)} of {len(order)}"
    finally:
        for client in (sub, pub):
            client.disconnect()
            client.loop_stop()
    topics: dict[int, str] = {}
    resolved = []
    for topic, number, _ in received:
        assert number in (1, 2), received
        if topic:
            topics[number] = topic
        resolved.append(topics[number])
    assert resolved == order
    assert [payload for _, _, payload in received] == [f"m{i}".encode() for i in range(len(order))]
