"""Takeover: a CONNECT for a client id that is connected, on the same node or another, closes
the old connection (5.0: DISCONNECT 0x8E) and the new one has the session."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from hexmq.mqtt import ConnAck, Connect, Disconnect, Properties, PubAck, Publish, Will
from services.edge.passwd import set_password
from tests.support.rawclient import RawClient
from tests.support.unique import uid


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_4_3_second_connect_takes_the_session_over(node, version: int) -> None:
    """MQTT-3.1.4-3: a CONNECT for a connected ClientID closes the old connection (5.0: 0x8E).

    The new connection has the session and its subscription. Also MQTT-3.2.2-3 (Session
    Present 1).
    """
    port = node.mqtt_port(1)
    client_id, topic = f"take-{uid()}", f"tk/{uid()}"
    props = Properties(session_expiry_interval=600) if version == 5 else Properties()
    first, _ = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=props
    )
    await first.subscribe(topic, qos=1)
    second, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=props
    )
    assert connack.session_present is True
    seen = await first.wait_closed()
    await first.close()
    if version == 5:
        assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x8E)]
    else:
        assert seen == []
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    await pub.publish(topic, b"to the new connection", qos=1)
    assert (await second.expect(Publish)).payload == b"to the new connection"
    for client in (pub, second):
        await client.close()


async def test_mqtt_3_1_4_3_takeover_across_nodes(trio_256) -> None:
    """MQTT-3.1.4-3: the old connection gets DISCONNECT 0x8E, also when it is on another node.

    Also G5 (one live connection per client id in the whole cluster).
    """
    client_id = f"one-{uid()}"
    first, _ = await RawClient.connect(trio_256.mqtt_port(1), client_id, version=5)
    second, connack = await RawClient.connect(trio_256.mqtt_port(2), client_id, version=5)
    assert connack.reason_code == 0
    seen = await first.wait_closed()
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x8E)]
    assert isinstance(seen[0], Disconnect)
    assert seen[0].properties.reason_string == (
        "another connection with this client id took the session over"
    )
    for client in (first, second):
        await client.close()


@pytest.fixture(scope="module")
def edges_apart(hexmq_cluster_module: Any) -> Any:
    """Three nodes at RF 2 with a process per service (make test-colocated too): a node's edge
    can be stopped while its partition service and agent run on."""
    return hexmq_cluster_module(nodes=3, extra=["--rf", "2", "--separate"])


async def test_g5_the_old_connection_is_closed_before_the_new_one_is_accepted(
    edges_apart: Any,
) -> None:
    """G5, strictly: the new connection's CONNACK comes only once the old one is closed.

    The old connection's edge (node 1) is stopped while the takeover through node 2 is on its
    way, so it acts on the Kick late (as a starved edge does): the master holds the new
    connection's answer until that edge has closed the old connection and said so. What is
    asserted is the order in which the two sockets hear of it, not how long anything took.
    """
    client_id = f"strict-{uid()}"
    first, _ = await RawClient.connect(edges_apart.mqtt_port(1), client_id, version=5)
    order: list[str] = []

    async def old_closed() -> object:
        packet = await first.recv(timeout=60)
        order.append("old connection closed")
        return packet

    async def new_accepted() -> tuple[RawClient, ConnAck]:
        accepted = await RawClient.connect(
            edges_apart.mqtt_port(2), client_id, version=5, timeout=60
        )
        order.append("new connection accepted")
        return accepted

    edge = edges_apart.pids(1)["edge"]
    os.kill(edge, signal.SIGSTOP)
    try:
        closing = asyncio.create_task(old_closed())
        accepting = asyncio.create_task(new_accepted())
        # Time for an answer that nothing holds to arrive (it did: a CONNACK while the old
        # connection was still open).
        await asyncio.wait({accepting}, timeout=1.0)
    finally:
        os.kill(edge, signal.SIGCONT)
    disconnect = await closing
    second, connack = await accepting
    assert connack.reason_code == 0
    assert isinstance(disconnect, Disconnect)
    assert disconnect.reason_code == 0x8E
    assert order == ["old connection closed", "new connection accepted"]
    for client in (first, second):
        await client.close()


# ----- client ids bound to users (issue 25) -----------------------------------------------------

BOUND_USERS = {"alice": "alice-pw", "eve": "eve-pw"}


@pytest.fixture(scope="module")
def bound_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("bound-ids")
    for user, password in BOUND_USERS.items():
        set_password(work / "passwd", user, password, 101)
    return work


@pytest.fixture(scope="module", params=["prefixes", "username"])
def bound(request: pytest.FixtureRequest, hexmq_cluster_module: Any, bound_files: Path) -> Any:
    """A node whose edge binds client ids to users: `--clientid-prefixes=%u-` (a user's ids
    start with its name and a dash) or `--use-username-as-clientid`."""
    option = (
        "--edge-arg=--clientid-prefixes=%u-"
        if request.param == "prefixes"
        else "--edge-arg=--use-username-as-clientid"
    )
    cluster = hexmq_cluster_module(
        nodes=1, extra=[f"--edge-arg=--password-file={bound_files / 'passwd'}", option]
    )
    cluster.binding = request.param
    return cluster


async def login(
    port: int, user: str, client_id: str, *, version: int = 5, clean_start: bool = False
) -> tuple[RawClient, ConnAck]:
    client = await RawClient.open(port, version)
    props = Properties(session_expiry_interval=600) if version == 5 else Properties()
    await client.send(
        Connect(
            client_id,
            protocol_version=version,
            clean_start=clean_start,
            username=user,
            password=BOUND_USERS[user].encode(),
            properties=props,
        )
    )
    return client, await client.expect(ConnAck)


@pytest.mark.parametrize("version", [4, 5])
async def test_s5_4_2_a_user_cannot_take_over_another_users_session(
    bound: Any, version: int
) -> None:
    """With client ids bound to users, eve cannot resume (or take over) alice's persistent
    session by naming its client id: `--clientid-prefixes` refuses her CONNECT with 0x85
    Client Identifier not valid (3.1.1: 2), `--use-username-as-clientid` gives her her own
    id instead. Either way alice's connection stays, and the messages queued for alice's
    session while she is away stay hers, delivered to her when she comes back."""
    port = bound.mqtt_port(1)
    alice_id = f"alice-{uid()}" if bound.binding == "prefixes" else "alice"
    topic = f"private/{uid()}"
    alice, connack = await login(port, "alice", alice_id, version=version)
    assert connack.reason_code == 0
    await alice.subscribe(topic, qos=1)
    await alice.send(Disconnect())
    await alice.close()
    # A message for alice's session while she is away.
    pub, _ = await login(port, "eve", f"eve-{uid()}", clean_start=True)
    await pub.publish(topic, b"for alice", qos=1)
    await pub.send(Disconnect())
    await pub.close()
    eve, connack = await login(port, "eve", alice_id, version=version)
    if bound.binding == "prefixes":
        assert connack.reason_code == (0x85 if version == 5 else 2)
        assert await eve.recv() is None
    else:
        assert connack.reason_code == 0  # as eve, in eve's own session: nothing of alice's
        assert await eve.silent(1.0)
        await eve.send(Disconnect())
    await eve.close()
    back, connack = await login(port, "alice", alice_id, version=version)
    assert connack.session_present
    message = await back.expect(Publish)
    assert message.payload == b"for alice"
    assert message.packet_id is not None
    await back.send(PubAck(message.packet_id))
    await back.send(Disconnect())
    await back.close()


# ----- takeovers and clean sessions (issue 29) --------------------------------------------------


async def connect_with_will(
    port: int, client_id: str, version: int, clean: bool, will: Will
) -> tuple[RawClient, ConnAck]:
    """3.1.1: Clean Session `clean`. 5.0: Clean Start `clean`, and a session that ends with its
    connection (Session Expiry 0) when clean, else one kept 600 s."""
    props = Properties(session_expiry_interval=600) if version == 5 and not clean else Properties()
    client, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=clean, properties=props, will=will
    )
    assert connack.reason_code == 0
    return client, connack


@pytest.mark.parametrize("second_node", [1, 2], ids=["same-node", "other-node"])
@pytest.mark.parametrize(("first_clean", "second_clean"), [(True, False), (False, True)])
@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_2_2_1_a_takeover_involving_a_clean_session_has_no_session_present(
    trio_256, version: int, first_clean: bool, second_clean: bool, second_node: int
) -> None:
    """MQTT-3.2.2-1: a takeover where either CONNECT asks for a clean session answers Session
    Present 0, and the new connection has none of the old session's subscriptions.

    A clean session does not outlive its connection (MQTT-3.1.2-6 (3.1.1); 5.0 3.1.2.11.2:
    Session Expiry 0 ends the session when the connection closes), and Clean Start 1 discards
    the session (MQTT-3.1.2-4). The old session ends, so its will goes out at once, long before
    its 5.0 Will Delay of 30 s: "the Will Delay Interval has passed or the Session ends,
    whichever happens first" (5.0 3.1.3.2.2, MQTT-3.1.2-8); 3.1.1 has no delay (MQTT-3.1.2-8
    (3.1.1)). The second connection goes through the same node or another one.
    """
    client_id, topic, will_topic = f"clean-{uid()}", f"ct/{uid()}", f"will/{uid()}"
    watcher, _ = await RawClient.connect(trio_256.mqtt_port(3), f"w-{uid()}", version=5)
    await watcher.subscribe(will_topic, qos=1)
    delay = Properties(will_delay_interval=30) if version == 5 else Properties()
    first, _ = await connect_with_will(
        trio_256.mqtt_port(1),
        client_id,
        version,
        first_clean,
        Will(will_topic, b"old", qos=1, properties=delay),
    )
    await first.subscribe(topic, qos=1)
    second, connack = await connect_with_will(
        trio_256.mqtt_port(second_node),
        client_id,
        version,
        second_clean,
        Will(will_topic, b"new", qos=1),
    )
    assert connack.session_present is False
    await first.wait_closed()
    await first.close()
    assert (await watcher.expect(Publish)).payload == b"old"
    pub, _ = await RawClient.connect(trio_256.mqtt_port(3), f"pub-{uid()}", version=version)
    await pub.publish(topic, b"for the old session only", qos=1)
    with pytest.raises(TimeoutError):  # the old session's subscription did not live on
        await second.recv(timeout=1.5)
    with pytest.raises(TimeoutError):  # the will went out once
        await watcher.recv(timeout=0.5)
    for client in (pub, second, watcher):
        await client.close()
