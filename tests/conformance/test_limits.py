"""Limits the broker keeps: a session's queue is bounded (--max-queued-messages: past it the
newest message is not queued for that session, or with --queue-overflow drop-oldest the oldest
makes room); --max-connections across listeners; a QoS 0 flood is throttled, not wedged. And
the edge's configurable limits, each with the exact codes for MQTT 3.1.1 and 5.0: topic length
and levels, new connections a second (0x9F), the Server Reference sent with 0x9C when the edge
is full or shutting down, and the SUBACK code for an ACL denial; a bad value stops the edge at
startup. (The edge's maximum Keep Alive is in test_keepalive.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect as ws_connect

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    MQTTConnection,
    PubAck,
    Publish,
    PubRec,
    Role,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from tests.support.edgeproc import edge_process, run_edge_expecting_failure
from tests.support.metrics import scrape
from tests.support.ports import free_ports
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.support.wsclient import ws_packets

REFERENCE = "other.example:1883"
FLOOD_DRAINED_S = 60.0


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("drop-newest", [b"0", b"1", b"2", b"3", b"4"]),
        ("drop-oldest", [b"3", b"4", b"5", b"6", b"7"]),
    ],
)
async def test_s4_1_1_a_full_session_queue_drops_by_policy(
    hexmq_cluster, policy: str, expected: list[bytes]
) -> None:
    """§4.1.1: the server may bound the session state it stores: a full queue drops by policy.

    --max-queued-messages=5: drop-newest keeps the first five, drop-oldest the last five; the
    publisher still gets PUBACK 0x00, and the three dropped are counted.
    """
    cluster = hexmq_cluster(
        nodes=1,
        extra=[
            "--partition-arg=--max-queued-messages=5",
            f"--partition-arg=--queue-overflow={policy}",
        ],
    )
    port = cluster.mqtt_port(1)
    client_id, topic = f"bounded-{uid(8)}", f"b/{uid(8)}"
    sub, _ = await RawClient.connect(port, client_id, clean_start=False)
    await sub.subscribe(topic, qos=1)
    await sub.send(Disconnect())
    await sub.close()
    pub, _ = await RawClient.connect(port, f"pub-{uid(8)}")
    for i in range(8):
        ack = await pub.publish(topic, f"{i}".encode(), qos=1)
        assert ack is not None
        assert ack.reason_code == 0  # the publisher is not punished for a slow subscriber
    await pub.close()

    sub, connack = await RawClient.connect(port, client_id, clean_start=False)
    assert connack.session_present is True
    got = []
    for _ in range(5):
        packet = await sub.expect(Publish)
        got.append(packet.payload)
        assert packet.packet_id is not None
        await sub.send(PubAck(packet.packet_id))
    assert got == expected
    # Nothing beyond the limit was kept: a marker published now is the next delivery.
    pub, _ = await RawClient.connect(port, f"pub-{uid(8)}")
    await pub.publish(topic, b"marker", qos=1)
    assert (await sub.expect(Publish)).payload == b"marker"
    for client in (pub, sub):
        await client.close()

    # The three messages the limit turned away are counted.
    port = cluster.node(1)["metrics_ports"]["partition"]
    dropped = ("hexmq_dropped_messages_total", (("reason", "queue_full"),))
    counted = None
    async with asyncio.timeout(10):  # the partition copies its counters out once a second
        while counted != 3:
            await asyncio.sleep(0.2)
            counted = (await asyncio.to_thread(scrape, port)).get(dropped)


async def test_mqtt_3_3_4_1_a_qos0_flood_does_not_wedge_the_connection(node) -> None:
    """MQTT-3.3.4-1: after a flood of QoS 0, a QoS 1 PUBLISH still gets its PUBACK.

    100 000 QoS 0 PUBLISHes written at once, faster than the partition link drains (the edge
    pauses reading meanwhile); afterwards the same connection still gets its QoS 1
    acknowledged. That reading was paused is not observed here.
    """
    port = node.mqtt_port(1)
    topic = f"flood/{uid()}"
    sub, _ = await RawClient.connect(port, f"flood-sub-{uid()}")
    pub: RawClient | None = None
    try:
        await sub.subscribe(topic, qos=0)
        pub, _ = await RawClient.connect(port, f"flood-pub-{uid()}")
        chunk = b"".join(pub.codec.send(Publish(topic, b"x" * 64)) for _ in range(1000))
        for _ in range(100):  # 100 000 QoS 0 messages, written without waiting for anything
            pub.writer.write(chunk)
        await pub.writer.drain()
        # The flood goes through first: about 3 s on a quiet machine here (2 cores), 10 s and
        # more beside the rest of make test. Wedged is never; a minute tells them apart.
        ack = await pub.publish(f"{topic}/after", b"qos1", qos=1, timeout=FLOOD_DRAINED_S)
        assert ack is not None
        assert ack.reason_code == 0
    finally:
        for client in (pub, sub):
            if client is not None:
                await client.close()


# ----- --max-connections -------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited(node: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    (ws,) = free_ports(1)
    args = ["--max-connections=2", f"--ws-listen=127.0.0.1:{ws}"]
    with edge_process(node, tmp_path_factory.mktemp("limited"), args, name="lim1") as proc:
        yield proc.port, ws


async def connect_raw(port: int, version: int) -> tuple[RawClient, ConnAck]:
    return await RawClient.connect(port, f"lim-{uid()}", version=version)


async def test_mqtt_3_2_2_7_max_connections_refuses_with_quota_exceeded(
    limited: tuple[int, int],
) -> None:
    """MQTT-3.2.2-7: past --max-connections, CONNACK 0x97 (3.1.1: 0x03), then close.

    The WebSocket listener counts against the same limit; a closed connection frees its place.
    Also MQTT-4.13.2-1.
    """
    port, ws_port = limited
    held = []
    for _ in range(2):
        client, connack = await connect_raw(port, 5)
        assert connack.reason_code == 0
        held.append(client)

    client, connack = await connect_raw(port, 5)
    assert connack.reason_code == 0x97  # Quota exceeded
    assert await client.recv() is None  # and closed
    await client.close()
    client, connack = await connect_raw(port, 4)
    assert connack.reason_code == 3  # 3.1.1: Server unavailable
    await client.close()

    # The WebSocket listener counts against the same limit.
    codec = MQTTConnection(Role.CLIENT, protocol_version=5)
    async with ws_connect(f"ws://127.0.0.1:{ws_port}/mqtt", subprotocols=["mqtt"]) as ws:
        await ws.send(codec.send(Connect(client_id=f"lim-ws-{uid()}", protocol_version=5)))
        (connack,) = await ws_packets(ws, codec, 1)
        assert isinstance(connack, ConnAck)
        assert connack.reason_code == 0x97

    # A closed connection frees its place.
    await held.pop().close()
    async with asyncio.timeout(10):
        while True:
            client, connack = await connect_raw(port, 5)
            if connack.reason_code == 0:
                held.append(client)
                break
            await client.close()
            await asyncio.sleep(0.05)
    for client in held:
        await client.close()


# ----- topic length and levels ----------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limits")


@pytest.fixture(scope="module")
def topic_limited(node: Any, workdir: Path) -> Iterator[int]:
    """An edge taking topics of at most 32 bytes and 4 levels."""
    args = ["--max-topic-length=32", "--max-topic-levels=4"]
    with edge_process(node, workdir, args, name="topics") as proc:
        yield proc.port


async def test_s3_3_2_1_topics_over_the_limits_get_0x90(topic_limited: int) -> None:
    """A topic name over --max-topic-length or --max-topic-levels: PUBACK/PUBREC 0x90 Topic Name
    invalid (5.0) and nothing is delivered; the connection stays."""
    watcher, _ = await RawClient.connect(topic_limited, f"w-{uid()}", version=5)
    assert (await watcher.subscribe("#", qos=1)).reason_codes == (1,)
    client, _ = await RawClient.connect(topic_limited, f"p-{uid()}", version=5)
    for topic, qos, kind in [
        ("a/b/c/d/e", 1, PubAck),  # 5 levels
        ("x" * 33, 1, PubAck),  # 33 bytes
        ("é" * 17, 2, PubRec),  # 34 bytes of UTF-8 in 17 characters
    ]:
        pid = client.next_packet_id()
        await client.send(Publish(topic=topic, payload=b"no", qos=qos, packet_id=pid))
        ack = await client.expect(kind)
        assert (ack.packet_id, ack.reason_code) == (pid, 0x90), topic
        assert ack.properties.reason_string
    # At the limits exactly: accepted and delivered.
    ok = await client.publish("a/b/c/" + "d" * 26, b"yes", qos=1)
    assert ok is not None
    assert ok.reason_code == 0
    delivered = await watcher.expect(Publish)
    assert delivered.payload == b"yes"
    assert await watcher.silent()
    await client.close()
    await watcher.close()


async def test_s3_3_2_1_v311_topics_over_the_limits_are_acknowledged_and_dropped(
    topic_limited: int,
) -> None:
    """3.1.1 cannot be told: the PUBACK is sent (as for an ACL denial) and nothing delivered."""
    watcher, _ = await RawClient.connect(topic_limited, f"w-{uid()}", version=4)
    await watcher.subscribe("#", qos=1)
    client, _ = await RawClient.connect(topic_limited, f"p-{uid()}", version=4)
    ack = await client.publish("a/b/c/d/e", b"no", qos=1)
    assert ack is not None
    assert ack.reason_code == 0
    assert await watcher.silent()
    await client.close()
    await watcher.close()


@pytest.mark.parametrize(("version", "refused"), [(5, 0x8F), (4, 0x80)])
async def test_s3_9_3_filters_over_the_limits_get_0x8f(
    topic_limited: int, version: int, refused: int
) -> None:
    """SUBACK 0x8F Topic Filter invalid (5.0) or 0x80 (3.1.1) for each filter over a limit, the
    inner filter of a shared subscription counting; the others in the packet are granted."""
    client, _ = await RawClient.connect(topic_limited, f"s-{uid()}", version=version)
    filters = ["a/b/c/d/e", "a/+/c/#", "$share/g/a/b/c/d/e", "$share/g/a/b/c/d", "x" * 33]
    await client.send(
        Subscribe(client.next_packet_id(), tuple(Subscription(f, qos=1) for f in filters))
    )
    suback = await client.expect(SubAck)
    assert suback.reason_codes == (refused, 1, refused, 1, refused)
    await client.close()


@pytest.mark.parametrize(("version", "code"), [(5, 0x90), (4, 3)])
async def test_s3_3_2_1_a_will_topic_over_the_limits_refuses_the_connect(
    topic_limited: int, version: int, code: int
) -> None:
    """The Will Topic is a topic name like any other: CONNACK 0x90 (5.0) or 3 (3.1.1)."""
    client = await RawClient.open(topic_limited, version)
    will = Will(topic="w/1/2/3/4/5", payload=b"bye", qos=0, retain=False)
    await client.send(Connect(client_id=f"will-{uid()}", protocol_version=version, will=will))
    connack = await client.expect(ConnAck)
    assert connack.reason_code == code
    assert await client.recv() is None
    await client.close()


# ----- connection rate, Server Reference -------------------------------------------------------


async def test_s3_2_2_2_connection_rate_over_the_limit_gets_0x9f(node: Any, workdir: Path) -> None:
    """--max-connection-rate 5: a burst of 5 gets in, the next CONNECTs in the same second get
    CONNACK 0x9F Connection rate exceeded (5.0) or 3 Server unavailable (3.1.1); a second
    later there is room again."""
    with edge_process(node, workdir, ["--max-connection-rate=5"], name="rate") as proc:
        clients = []
        codes = []
        for version in (5, 5, 5, 5, 5, 5, 4):
            client, connack = await RawClient.connect(proc.port, f"r-{uid()}", version=version)
            clients.append(client)
            codes.append(connack.reason_code)
        assert codes[:5] == [0] * 5
        assert codes[5:] == [0x9F, 3]
        await asyncio.sleep(1.1)
        client, connack = await RawClient.connect(proc.port, f"r-{uid()}", version=5)
        assert connack.reason_code == 0
        for c in [*clients, client]:
            await c.close()


async def test_s4_11_server_reference_when_full_and_when_shutting_down(
    node: Any, workdir: Path
) -> None:
    """With --server-reference, a 5.0 client the full edge cannot take gets CONNACK 0x9C Use
    another server with the reference (3.1.1: 3), and a connected 5.0 client gets DISCONNECT 0x9C
    with it when the edge shuts down, instead of 0x8B."""
    args = ["--max-connections=1", f"--server-reference={REFERENCE}"]
    with edge_process(node, workdir, args, name="full") as proc:
        first, connack = await RawClient.connect(proc.port, f"f-{uid()}", version=5)
        assert connack.reason_code == 0
        for version, code in ((5, 0x9C), (4, 3)):
            extra, connack = await RawClient.connect(proc.port, f"x-{uid()}", version=version)
            assert connack.reason_code == code
            assert connack.properties.server_reference == (REFERENCE if version == 5 else None)
            assert await extra.recv() is None
            await extra.close()
        proc.stop()
        packets = await first.wait_closed()
        disconnects = [p for p in packets if isinstance(p, Disconnect)]
        assert [d.reason_code for d in disconnects] == [0x9C]
        assert disconnects[0].properties.server_reference == REFERENCE
        await first.close()


# ----- ACL denial code -------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "code"), [(5, 0x80), (4, 0x80)])
async def test_s3_9_3_acl_denial_uses_the_configured_reason_code(
    node: Any, workdir: Path, version: int, code: int
) -> None:
    """--acl-deny-reason-code 0x80: a subscription the ACL denies gets that code in 5.0 (the
    default is 0x87, tests/conformance/test_authorization.py) and 0x80 in 3.1.1."""
    acl = workdir / f"acl-{version}"
    acl.write_text("topic readwrite open/#\n")
    args = [f"--acl-file={acl}", "--acl-deny-reason-code=0x80"]
    with edge_process(node, workdir, args, name=f"acl{version}") as proc:
        client, _ = await RawClient.connect(proc.port, f"a-{uid()}", version=version)
        await client.send(
            Subscribe(
                client.next_packet_id(),
                (Subscription("open/1", qos=1), Subscription("closed/1", qos=1)),
            )
        )
        assert (await client.expect(SubAck)).reason_codes == (1, code)
        await client.close()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--acl-deny-reason-code=0x90"], "--acl-deny-reason-code"),
        (["--max-keepalive=70000"], "--max-keepalive"),
        (["--max-topic-length=0"], "--max-topic-length"),
        (["--max-topic-levels=-1"], "--max-topic-levels"),
        (["--max-connection-rate=-1"], "--max-connection-rate"),
    ],
)
def test_bad_limit_values_name_the_option(args: list[str], named: str) -> None:
    code, stderr = run_edge_expecting_failure(args)
    assert code == 2
    assert named in stderr
