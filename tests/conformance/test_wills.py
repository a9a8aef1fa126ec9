"""Wills cluster-wide (RF 2): kept in the session's partition, published like any message to
subscribers on every node, after the Will Delay Interval, not after a normal DISCONNECT or a
reconnect within the delay, retained when asked (and only then), and published even when the
node that held the client's connection dies. A Will at QoS 2 (MQTT 5.0 3.2.2.3.4, 3.1.2.6):
hexmq supports QoS 2, so a CONNECT with Will QoS 2 is accepted, and the will, published when
the connection is lost, reaches a QoS 2 subscriber on another node through the whole QoS 2
flow, once."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest

from hexmq.hashring import assign, partition_of
from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscription,
    Will,
)
from services.edge.passwd import set_password
from tests.support.placement import client_id_on
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.support.v5client import connect, open_v5, publish, receive, subscribe

PARTITIONS = 32  # as the `trio` fixture (tests/conformance/conftest.py)


async def connect_with_will(
    port: int,
    client_id: str,
    will: Will,
    *,
    version: int = 5,
    clean_start: bool = True,
    expiry: int = 0,
) -> RawClient:
    props = Properties(session_expiry_interval=expiry) if version == 5 and expiry else Properties()
    client, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=clean_start, properties=props, will=will
    )
    assert connack.reason_code == 0
    return client


async def watcher(port: int, topic: str, client_id: str | None = None) -> RawClient:
    client, _ = await RawClient.connect(port, client_id or f"watch-{uid()}", version=5)
    await client.subscribe(topic, qos=1)
    return client


async def nothing_within(client: RawClient, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        await client.recv(timeout=seconds)


async def drop(client: RawClient) -> None:
    """Close the socket without DISCONNECT (a lost connection)."""
    client.writer.transport.abort()
    await client.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_2_8_a_lost_connection_publishes_the_will_on_every_node(
    trio,
    version: int,
) -> None:
    """MQTT-3.1.2-8: the Will is published after the connection is lost.

    To subscribers on every node, 3.1.1 and 5.0. Also G6.
    """
    topic = f"will/{uid()}"
    watchers = [await watcher(trio.mqtt_port(i), topic) for i in (1, 2, 3)]
    client = await connect_with_will(
        trio.mqtt_port(1), f"dying-{uid()}", Will(topic, b"gone", qos=1), version=version
    )
    await drop(client)
    for w in watchers:
        packet = await w.expect(Publish, timeout=10)
        assert (packet.topic, packet.payload, packet.qos) == (topic, b"gone", 1)
        await w.close()


async def test_mqtt_3_14_4_3_a_normal_disconnect_discards_the_will(trio) -> None:
    """MQTT-3.14.4-3: a DISCONNECT 0x00 from the client discards the Will.

    Also MQTT-3.1.2-10 (the Will is removed).
    """
    topic = f"will/{uid()}"
    w = await watcher(trio.mqtt_port(2), topic)
    client = await connect_with_will(trio.mqtt_port(1), f"polite-{uid()}", Will(topic, b"x"))
    await client.send(Disconnect())
    await client.close()
    await nothing_within(w, 2.5)
    await w.close()


async def test_s3_14_2_1_disconnect_with_will_message_sends_it(trio) -> None:
    """§3.14.2.1: DISCONNECT 0x04 (Disconnect with Will Message) publishes the Will."""
    topic = f"will/{uid()}"
    w = await watcher(trio.mqtt_port(3), topic)
    client = await connect_with_will(trio.mqtt_port(1), f"leaving-{uid()}", Will(topic, b"bye"))
    await client.send(Disconnect(0x04))
    await client.close()
    assert (await w.expect(Publish, timeout=10)).payload == b"bye"
    await w.close()


async def test_mqtt_3_1_2_8_will_delay_is_waited_for(trio) -> None:
    """MQTT-3.1.2-8: the Will is published once the Will Delay Interval has passed."""
    topic = f"will/{uid()}"
    w = await watcher(trio.mqtt_port(2), topic)
    will = Will(topic, b"late", properties=Properties(will_delay_interval=2))
    client = await connect_with_will(trio.mqtt_port(1), f"slow-{uid()}", will, expiry=60)
    lost_at = time.monotonic()
    await drop(client)
    packet = await w.expect(Publish, timeout=10)
    assert packet.payload == b"late"
    assert time.monotonic() - lost_at >= 1.9
    await w.close()


@pytest.mark.parametrize("node", [1, 3], ids=["same-node", "other-node"])
async def test_mqtt_3_1_3_9_a_reconnect_within_the_delay_cancels_the_will(trio, node: int) -> None:
    """MQTT-3.1.3-9: a new connection within the Will Delay Interval: the Will is not sent.

    Clean Start 0 resumes the session, through the node of the lost connection or another.
    """
    topic = f"will/{uid()}"
    cid = f"back-{uid()}"
    w = await watcher(trio.mqtt_port(2), topic)
    will = Will(topic, b"never", properties=Properties(will_delay_interval=2))
    client = await connect_with_will(trio.mqtt_port(1), cid, will, expiry=60)
    await drop(client)
    again, connack = await RawClient.connect(
        trio.mqtt_port(node),
        cid,
        version=5,
        clean_start=False,
        properties=Properties(session_expiry_interval=60),
    )
    assert connack.session_present is True
    await nothing_within(w, 3.5)
    for c in (again, w):
        await c.close()


async def test_s3_1_3_2_2_a_clean_start_reconnect_ends_the_session_and_sends_its_will(
    trio,
) -> None:
    """§3.1.3.2.2: the Will waits for its delay "or the Session ends, whichever happens first".

    A reconnect with Clean Start 1 within the delay discards the session (MQTT-3.1.2-4): it is
    not a connection "to this Session" (MQTT-3.1.3-9), so the Will goes out then, long before
    its 30 s delay, once (MQTT-3.1.2-10), and the new connection has Session Present 0.
    """
    topic = f"will/{uid()}"
    cid = f"anew-{uid()}"
    w = await watcher(trio.mqtt_port(2), topic)
    will = Will(topic, b"session over", properties=Properties(will_delay_interval=30))
    client = await connect_with_will(trio.mqtt_port(1), cid, will, clean_start=False, expiry=60)
    await drop(client)
    await nothing_within(w, 1.0)  # waiting for its delay
    again, connack = await RawClient.connect(
        trio.mqtt_port(3),
        cid,
        version=5,
        clean_start=True,
        properties=Properties(session_expiry_interval=60),
    )
    assert connack.session_present is False
    assert (await w.expect(Publish)).payload == b"session over"
    await nothing_within(w, 1.5)  # once
    for c in (again, w):
        await c.close()


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_2_8_a_takeover_publishes_the_old_connections_will(
    trio, version: int
) -> None:
    """MQTT-3.1.2-8: a takeover closes the old connection, so its Will is published.

    A kept session taken over by a connection with Clean Session/Start 0, through another
    node. 3.1.1: the network connection closes without a DISCONNECT from the client, so the
    will is published (MQTT-3.1.2-8 (3.1.1), 3.1.2.5). 5.0: with Will Delay 0 it is due at
    once as the connection closes (3.1.3.2.2); the new connection comes no sooner. Session
    Present 1 (MQTT-3.2.2-3). Also MQTT-3.1.2-10 (then removed: published once).
    """
    topic = f"will/{uid()}"
    cid = f"taken-{uid()}"
    w = await watcher(trio.mqtt_port(3), topic)
    first = await connect_with_will(
        trio.mqtt_port(1), cid, Will(topic, b"old"), version=version, clean_start=False, expiry=60
    )
    second, connack = await RawClient.connect(
        trio.mqtt_port(2),
        cid,
        version=version,
        clean_start=False,
        properties=Properties(session_expiry_interval=60) if version == 5 else Properties(),
    )
    assert connack.session_present is True
    assert (await w.expect(Publish, timeout=10)).payload == b"old"
    await nothing_within(w, 1.5)  # once
    for c in (first, second, w):
        await c.close()


async def test_mqtt_3_1_3_9_a_takeover_within_the_will_delay_cancels_the_will(trio) -> None:
    """MQTT-3.1.3-9: a takeover is a new connection to the session: within the Will Delay
    Interval, the old connection's Will is not sent (5.0; through another node)."""
    topic = f"will/{uid()}"
    cid = f"kept-{uid()}"
    w = await watcher(trio.mqtt_port(3), topic)
    will = Will(topic, b"never", properties=Properties(will_delay_interval=2))
    first = await connect_with_will(trio.mqtt_port(1), cid, will, clean_start=False, expiry=60)
    second, connack = await RawClient.connect(
        trio.mqtt_port(2),
        cid,
        version=5,
        clean_start=False,
        properties=Properties(session_expiry_interval=60),
    )
    assert connack.session_present is True
    await nothing_within(w, 3.5)
    for c in (first, second, w):
        await c.close()


async def test_mqtt_3_1_2_15_a_retained_will_is_kept_for_later_subscribers(trio) -> None:
    """MQTT-3.1.2-15: a Will with Will Retain 1 is published as a retained message."""
    topic = f"will/{uid()}"
    client = await connect_with_will(
        trio.mqtt_port(1), f"status-{uid()}", Will(topic, b"offline", qos=1, retain=True)
    )
    await drop(client)
    deadline = time.monotonic() + 10
    while True:
        late, _ = await RawClient.connect(trio.mqtt_port(3), f"late-{uid()}", version=5)
        # The will may be published while this SUBSCRIBE is applied: its live delivery may
        # then come before the SUBACK (MQTT 5.0 3.8.4), and is read below.
        await late.subscribe(topic, qos=1, live_first=True)
        try:
            packet = await late.expect(Publish, timeout=1)
        except TimeoutError:
            await late.close()
            assert time.monotonic() < deadline, "the retained will never arrived"
            continue
        await late.close()
        assert packet.payload == b"offline"
        if packet.retain:
            break
        # Published while this subscriber was already subscribed: a live delivery, RETAIN 0
        # (MQTT-3.3.1-12). The will is retained by now: the next subscriber gets it as such.
        assert time.monotonic() < deadline, "the will never arrived as a retained message"


async def test_mqtt_3_1_2_14_a_will_without_retain_is_not_retained(trio) -> None:
    """MQTT-3.1.2-14: a Will with Will Retain 0 is published as a non-retained message."""
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


async def test_g6_the_will_is_published_when_the_node_holding_the_connection_dies(
    hexmq_cluster,
) -> None:
    """G6: the Will is published even when the node holding the connection dies.

    Also MQTT-3.1.2-8 (a connection lost with its node).
    """
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2"])
    table = assign(["n1", "n2", "n3"], PARTITIONS, 2)

    def away_from_n1(prefix: str) -> str:
        return next(
            c
            for c in (f"{prefix}-{uid()}" for _ in range(10_000))
            if "n1" not in table[partition_of(c, PARTITIONS)]
        )

    # The session lives on n2 and n3; the connection is on node 1, which dies. (So does the
    # watcher's session: node 1's partitions are unavailable once it is gone.)
    cid = away_from_n1("held")
    topic = f"will/{uid()}"
    w = await watcher(cluster.mqtt_port(3), topic, away_from_n1("watch"))
    client = await connect_with_will(cluster.mqtt_port(1), cid, Will(topic, b"node lost", qos=1))
    await asyncio.to_thread(cluster.kill, 1)
    packet = await w.expect(Publish, timeout=20)
    assert packet.payload == b"node lost"
    await client.close()
    await w.close()


# ----- Will QoS 2 (2 nodes) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def duo(hexmq_cluster_module: Any) -> Any:
    return hexmq_cluster_module(nodes=2)


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_2_2_12_will_qos_2_is_accepted_and_published_at_qos_2(
    duo: Any, version: int
) -> None:
    """MQTT-3.2.2-12: an unsupported Will QoS is refused (0x9B); hexmq supports QoS 2, uses it."""
    c = duo
    topic = f"wills/{uid(8)}"
    sub = await RawClient.open(c.mqtt_port(2), 5)
    await sub.send(Connect(client_id=client_id_on("n2", 2, "sub"), protocol_version=5))
    assert (await sub.expect(ConnAck)).reason_code == 0
    assert (await sub.subscribe(topic, qos=2)).reason_codes == (2,)

    dying = await RawClient.open(c.mqtt_port(1), version)
    will = Will(topic, b"gone", qos=2)
    await dying.send(
        Connect(client_id=client_id_on("n1", 2, "dying"), protocol_version=version, will=will)
    )
    assert (await dying.expect(ConnAck)).reason_code == 0  # not 0x9B
    await dying.close()  # lost without DISCONNECT: the will is due at once

    got = await sub.expect(Publish, timeout=10)
    assert (got.topic, got.payload, got.qos) == (topic, b"gone", 2)
    assert got.packet_id is not None
    await sub.send(PubRec(got.packet_id))
    assert await sub.expect(PubRel) == PubRel(got.packet_id)
    await sub.send(PubComp(got.packet_id))
    # Once: the next delivery is a marker, not the will again.
    marker, _ = await RawClient.connect(c.mqtt_port(1), client_id_on("n1", 2, "marker"))
    await marker.publish(topic, b"marker", qos=1)
    assert (await sub.expect(Publish)).payload == b"marker"
    for client in (sub, marker):
        await client.close()


# ----- wills under the ACL (issue 25) -----------------------------------------------------------

WILL_USERS = {"alice": "alice-pw", "eve": "eve-pw"}
# eve may write only eve/#; alice anything, and read $SYS.
WILL_ACL = """\
user eve
topic readwrite eve/#
user alice
topic readwrite #
topic read $SYS/#
"""
# The same, but eve's write rule is gone (a reload between her CONNECT and her will).
WILL_ACL_EVE_READ_ONLY = WILL_ACL.replace("topic readwrite eve/#", "topic read eve/#")


@pytest.fixture(scope="module")
def will_acl_files(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("will-acl")
    for user, password in WILL_USERS.items():
        set_password(work / "passwd", user, password, 101)
    (work / "acl").write_text(WILL_ACL)
    return work


@pytest.fixture(scope="module")
def acl_duo(hexmq_cluster_module: Any, will_acl_files: Any) -> Any:
    """Two nodes (RF 2) whose edges all read the same password file and ACL, as a deployment
    has them: the will of a client of node 2 may be published by node 1's edge."""
    return hexmq_cluster_module(
        nodes=2,
        extra=[
            "--rf",
            "2",
            f"--edge-arg=--password-file={will_acl_files / 'passwd'}",
            f"--edge-arg=--acl-file={will_acl_files / 'acl'}",
        ],
    )


async def login_with_will(
    port: int, user: str, will: Will, *, version: int = 5, client_id: str = ""
) -> tuple[RawClient, ConnAck]:
    client = await RawClient.open(port, version)
    await client.send(
        Connect(
            client_id=client_id or f"{user}-{uid()}",
            protocol_version=version,
            username=user,
            password=WILL_USERS[user].encode(),
            will=will,
        )
    )
    return client, await client.expect(ConnAck)


async def alice_watching(port: int, topic: str) -> RawClient:
    client, connack = await login_with_will(port, "alice", Will("alice/unused", b"-"))
    assert connack.reason_code == 0
    await client.subscribe(topic, qos=1)
    return client


def reload_acl(cluster: Any, files: Any, text: str) -> None:
    """Write the ACL and SIGHUP every edge of `cluster`; wait until each has read it."""
    (files / "acl").write_text(text)
    for i in range(1, len(cluster.nodes) + 1):
        log = cluster.service_log(i, "edge")
        before = log.read_text(errors="replace").count("SIGHUP: ACL from")
        os.kill(cluster.service_pid(i, "edge"), signal.SIGHUP)
        deadline = time.monotonic() + 10
        while log.read_text(errors="replace").count("SIGHUP: ACL from") <= before:
            assert time.monotonic() < deadline, f"node {i}'s edge did not read the ACL again"
            time.sleep(0.05)


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 5)])
async def test_s5_4_2_a_will_the_acl_denies_refuses_the_connect(
    acl_duo: Any, version: int, code: int
) -> None:
    """A will is a PUBLISH of its client (MQTT 5.0 3.1.2.5, 5.4.2): eve, who may write only
    eve/#, asks for a retained will on alice/cmd. Refused at CONNECT (CONNACK 0x87 Not
    authorized / 3.1.1 return code 5, then closed), so the will is never stored: alice gets
    nothing live, and nothing retained later. (mosquitto accepts and drops such a will; a
    refusal tells the client and its operator at once.)"""
    topic = f"alice/cmd/{uid()}"
    alice = await alice_watching(acl_duo.mqtt_port(1), topic)
    eve, connack = await login_with_will(
        acl_duo.mqtt_port(2), "eve", Will(topic, b"rm -rf", qos=1, retain=True), version=version
    )
    assert connack.reason_code == code
    assert await eve.recv() is None  # closed
    await eve.close()
    await nothing_within(alice, 2.0)
    later = await alice_watching(acl_duo.mqtt_port(2), topic)
    await nothing_within(later, 1.0)  # nothing retained
    for c in (alice, later):
        await c.close()


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 5)])
async def test_s4_7_2_a_will_under_sys_refuses_the_connect(
    trio: Any, version: int, code: int
) -> None:
    """Only the broker publishes under $SYS/ (4.7.2), and a will is a publish: a will on
    `$SYS/broker/...` is refused at CONNECT even without an ACL, never stored or served as a
    retained $SYS message."""
    topic = f"$SYS/broker/fake/{uid()}"
    sys_watch = await watcher(trio.mqtt_port(1), topic)
    client = await RawClient.open(trio.mqtt_port(2), version)
    await client.send(
        Connect(
            f"sys-will-{uid()}",
            protocol_version=version,
            will=Will(topic, b"forged", qos=1, retain=True),
        )
    )
    assert (await client.expect(ConnAck)).reason_code == code
    assert await client.recv() is None
    await client.close()
    await nothing_within(sys_watch, 2.0)
    late = await watcher(trio.mqtt_port(3), topic)
    await nothing_within(late, 1.0)
    for c in (sys_watch, late):
        await c.close()


async def test_s5_4_2_a_will_is_checked_against_the_acl_when_it_is_published(
    acl_duo: Any, will_acl_files: Any
) -> None:
    """The will is checked again when an edge publishes it, with its owner's rights at that
    moment: eve connects through node 2 with a will on eve/status (allowed then); the ACL is
    changed so eve may no longer write there, and reloaded (SIGHUP, every edge); eve's
    connection is lost. The will is not published (the edge logs why), and not retained;
    with the ACL back, another will of eve's is published as usual."""
    topic = f"eve/status/{uid()}"
    alice = await alice_watching(acl_duo.mqtt_port(1), "eve/#")
    eve, connack = await login_with_will(
        acl_duo.mqtt_port(2), "eve", Will(topic, b"eve gone", qos=1, retain=True)
    )
    assert connack.reason_code == 0
    try:
        reload_acl(acl_duo, will_acl_files, WILL_ACL_EVE_READ_ONLY)
        await drop(eve)
        await nothing_within(alice, 3.0)
        later = await alice_watching(acl_duo.mqtt_port(2), topic)
        await nothing_within(later, 1.0)
        await later.close()
    finally:
        reload_acl(acl_duo, will_acl_files, WILL_ACL)
    logs = "".join(acl_duo.service_log(i, "edge").read_text(errors="replace") for i in (1, 2))
    assert "not publishing the will of eve-" in logs
    # Allowed again: the same kind of will goes out.
    again, connack = await login_with_will(acl_duo.mqtt_port(2), "eve", Will(topic, b"back"))
    assert connack.reason_code == 0
    await drop(again)
    message = await alice.expect(Publish)
    assert (message.topic, message.payload) == (topic, b"back")
    await alice.close()
