"""The edge's configurable limits, on a real edge: maximum Keep Alive (5.0 Server Keep Alive),
topic length and levels, new connections a second (0x9F), the Server Reference sent with 0x9C
when the edge is full or shutting down, and the SUBACK code for an ACL denial. Each with the
exact codes for MQTT 3.1.1 and 5.0."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PubAck,
    Publish,
    PubRec,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from tests.support.edgeproc import edge_process, run_edge_expecting_failure
from tests.support.rawclient import RawClient

REFERENCE = "other.example:1883"


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="module")
def cluster(hexmq_cluster_module: Any) -> Any:
    return hexmq_cluster_module(nodes=1)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limits")


@pytest.fixture(scope="module")
def keepalive_max(cluster: Any, workdir: Path) -> Iterator[int]:
    """An edge granting a Keep Alive of at most 2 s."""
    with edge_process(cluster, workdir, ["--max-keepalive=2"], name="keepalive") as proc:
        yield proc.port


@pytest.fixture(scope="module")
def limited(cluster: Any, workdir: Path) -> Iterator[int]:
    """An edge taking topics of at most 32 bytes and 4 levels."""
    args = ["--max-topic-length=32", "--max-topic-levels=4"]
    with edge_process(cluster, workdir, args, name="topics") as proc:
        yield proc.port


# ----- Keep Alive ------------------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "told"), [(60, 2), (0, 2), (1, None), (2, None)])
async def test_mqtt_3_2_2_21_server_keep_alive_replaces_a_longer_or_no_keep_alive(
    keepalive_max: int, asked: int, told: int | None
) -> None:
    """MQTT-3.2.2-21/-22: the Server Keep Alive in CONNACK is the one the client must use; sent
    only when it differs from the client's (here: over --max-keepalive, or 0)."""
    client, connack = await RawClient.connect(
        keepalive_max, f"ka-{uid()}", version=5, keepalive=asked
    )
    assert connack.reason_code == 0
    assert connack.properties.server_keep_alive == told
    await client.close()


async def test_mqtt_3_1_2_22_the_server_keep_alive_is_the_one_enforced(keepalive_max: int) -> None:
    """MQTT-3.1.2-22 with Server Keep Alive: 1.5 x the granted 2 s of silence ends the
    connection (0x8D), though the client asked for 60 s."""
    client, connack = await RawClient.connect(keepalive_max, f"ka-{uid()}", version=5, keepalive=60)
    assert connack.properties.server_keep_alive == 2
    started = time.monotonic()
    packets = await client.wait_closed(timeout=10)
    waited = time.monotonic() - started
    assert [p.reason_code for p in packets if isinstance(p, Disconnect)] == [0x8D]
    assert 2.5 <= waited < 6, waited
    await client.close()


@pytest.mark.parametrize(("asked", "code"), [(60, 2), (0, 2), (2, 0)])
async def test_v311_keep_alive_over_the_maximum_is_refused(
    keepalive_max: int, asked: int, code: int
) -> None:
    """3.1.1 has no Server Keep Alive: over --max-keepalive (or 0) is refused with return code 2
    Identifier rejected, as mosquitto's max_keepalive does."""
    client, connack = await RawClient.connect(
        keepalive_max, f"ka-{uid()}", version=4, keepalive=asked
    )
    assert connack.reason_code == code
    if code:
        assert await client.recv() is None
    await client.close()


# ----- topic length and levels ----------------------------------------------------------------


async def test_mqtt_3_3_2_topics_over_the_limits_get_0x90(limited: int) -> None:
    """A topic name over --max-topic-length or --max-topic-levels: PUBACK/PUBREC 0x90 Topic Name
    invalid (5.0) and nothing is delivered; the connection stays."""
    watcher, _ = await RawClient.connect(limited, f"w-{uid()}", version=5)
    assert (await watcher.subscribe("#", qos=1)).reason_codes == (1,)
    client, _ = await RawClient.connect(limited, f"p-{uid()}", version=5)
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


async def test_v311_topics_over_the_limits_are_acknowledged_and_dropped(limited: int) -> None:
    """3.1.1 cannot be told: the PUBACK is sent (as for an ACL denial) and nothing delivered."""
    watcher, _ = await RawClient.connect(limited, f"w-{uid()}", version=4)
    await watcher.subscribe("#", qos=1)
    client, _ = await RawClient.connect(limited, f"p-{uid()}", version=4)
    ack = await client.publish("a/b/c/d/e", b"no", qos=1)
    assert ack is not None
    assert ack.reason_code == 0
    assert await watcher.silent()
    await client.close()
    await watcher.close()


@pytest.mark.parametrize(("version", "refused"), [(5, 0x8F), (4, 0x80)])
async def test_mqtt_3_9_3_filters_over_the_limits_get_0x8f(
    limited: int, version: int, refused: int
) -> None:
    """SUBACK 0x8F Topic Filter invalid (5.0) or 0x80 (3.1.1) for each filter over a limit, the
    inner filter of a shared subscription counting; the others in the packet are granted."""
    client, _ = await RawClient.connect(limited, f"s-{uid()}", version=version)
    filters = ["a/b/c/d/e", "a/+/c/#", "$share/g/a/b/c/d/e", "$share/g/a/b/c/d", "x" * 33]
    await client.send(
        Subscribe(client.next_packet_id(), tuple(Subscription(f, qos=1) for f in filters))
    )
    suback = await client.expect(SubAck)
    assert suback.reason_codes == (refused, 1, refused, 1, refused)
    await client.close()


@pytest.mark.parametrize(("version", "code"), [(5, 0x90), (4, 3)])
async def test_a_will_topic_over_the_limits_refuses_the_connect(
    limited: int, version: int, code: int
) -> None:
    """The Will Topic is a topic name like any other: CONNACK 0x90 (5.0) or 3 (3.1.1)."""
    client = await RawClient.open(limited, version)
    will = Will(topic="w/1/2/3/4/5", payload=b"bye", qos=0, retain=False)
    await client.send(Connect(client_id=f"will-{uid()}", protocol_version=version, will=will))
    connack = await client.expect(ConnAck)
    assert connack.reason_code == code
    assert await client.recv() is None
    await client.close()


# ----- connection rate, Server Reference -------------------------------------------------------


async def test_mqtt_3_2_2_connection_rate_over_the_limit_gets_0x9f(
    cluster: Any, workdir: Path
) -> None:
    """--max-connection-rate 5: a burst of 5 gets in, the next CONNECTs in the same second get
    CONNACK 0x9F Connection rate exceeded (5.0) or 3 Server unavailable (3.1.1); a second
    later there is room again."""
    with edge_process(cluster, workdir, ["--max-connection-rate=5"], name="rate") as proc:
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
    cluster: Any, workdir: Path
) -> None:
    """With --server-reference, a 5.0 client the full edge cannot take gets CONNACK 0x9C Use
    another server with the reference (3.1.1: 3), and a connected 5.0 client gets DISCONNECT 0x9C
    with it when the edge shuts down, instead of 0x8B."""
    args = ["--max-connections=1", f"--server-reference={REFERENCE}"]
    with edge_process(cluster, workdir, args, name="full") as proc:
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
async def test_mqtt_3_9_3_acl_denial_uses_the_configured_reason_code(
    cluster: Any, workdir: Path, version: int, code: int
) -> None:
    """--acl-deny-reason-code 0x80: a subscription the ACL denies gets that code in 5.0 (the
    default is 0x87, tests/conformance/test_authorization.py) and 0x80 in 3.1.1."""
    acl = workdir / f"acl-{version}"
    acl.write_text("topic readwrite open/#\n")
    args = [f"--acl-file={acl}", "--acl-deny-reason-code=0x80"]
    with edge_process(cluster, workdir, args, name=f"acl{version}") as proc:
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
