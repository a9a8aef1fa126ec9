"""One logical broker in time: what a node received first counts first (issue 16).

A PUBLISH that an edge receives after a SUBSCRIBE from another client on the same edge reaches
that subscription, as on a single broker (mosquitto handles packets in the order it reads
them), even while the subscription is still being made durable and spread to the other edges;
and a PUBLISH received after an UNSUBSCRIBE does not reach it. Every test runs on one node and
on a three-node cluster (RF 2) with both clients on node 1 and the subscriber's session
mastered on node 2, so the commands cross nodes.

"After" is made certain without waiting for the SUBACK: the subscriber sends its SUBSCRIBE and
then a PINGREQ, and the publisher publishes only once the PINGRESP has come back (the edge
handles one connection's packets in order, so it has read the SUBSCRIBE by then). The SUBACK
itself needs a round trip to the session's partition, a commit and every edge's index
acknowledgement, so it is usually still on its way: each case runs several rounds, each with new
topics, and every round must hold (before the fix, nearly every round lost the message).

"Nothing else arrives" is shown with sentinels, without sleeping: a session's deliveries come
in the order its partition queued them, and the retained messages of one SUBSCRIBE are queued
together, in topic order.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hexmq.hashring import partition_of
from hexmq.mqtt import (
    ConnAck,
    Connect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
)
from hexmq_cli.clusterstate import DEFAULT_PARTITIONS
from tests.conftest import HexmqCluster
from tests.support import placement
from tests.support import v5client as v5
from tests.support.rawclient import RawClient
from tests.support.unique import uid

PARTITIONS = 32  # as the `trio` fixture (tests/conformance/conftest.py)
ROUNDS = 8
# A session that outlives the test.
KEEP = Properties(session_expiry_interval=600)


class Place:
    """Where a test's clients connect (node 1) and which client ids they use: on the three-node
    cluster the subscriber's session is mastered on node 2, the publisher's on node 3."""

    def __init__(self, cluster: HexmqCluster, nodes: int) -> None:
        self.port = cluster.mqtt_port(1)
        self.nodes = nodes

    def client_id(self, prefix: str, node: str) -> str:
        if self.nodes == 1:
            return f"{prefix}-{uid()}"
        return placement.client_id_on(node, self.nodes, prefix, rf=2, partitions=PARTITIONS)

    def other_partition(self, client_id: str, prefix: str, node: str) -> str:
        """A client id as `client_id` would give, whose session is in another partition."""
        partitions = PARTITIONS if self.nodes > 1 else DEFAULT_PARTITIONS
        while True:
            other = self.client_id(prefix, node)
            if partition_of(other, partitions) != partition_of(client_id, partitions):
                return other


@pytest.fixture(params=["one-node", "three-nodes"])
def place(request: pytest.FixtureRequest) -> Place:
    if request.param == "one-node":
        return Place(request.getfixturevalue("node"), 1)
    return Place(request.getfixturevalue("trio"), 3)


async def read_by_edge(client: RawClient, *packets: Packet) -> list[Packet]:
    """Send `packets`, then PINGREQ, and wait for the PINGRESP: the edge has read them. Returns
    what arrived before the PINGRESP (QoS 1 PUBLISHes acknowledged)."""
    for sent in packets:
        await client.send(sent)
    await client.send(PingReq())
    before: list[Packet] = []
    while True:
        packet = await client.recv()
        assert packet is not None, f"the server closed the connection; got {before}"
        if isinstance(packet, PingResp):
            return before
        await acknowledge(client, packet)
        before.append(packet)


async def at_once(*sends: tuple[RawClient, Packet]) -> None:
    """Write every packet before waiting for any socket to drain."""
    for client, packet in sends:
        client.writer.write(client.codec.send(packet))
    for client, _ in sends:
        await client.writer.drain()


async def acknowledge(client: RawClient, packet: Packet) -> None:
    if isinstance(packet, Publish) and packet.qos == 1:
        assert packet.packet_id is not None
        await client.send(PubAck(packet.packet_id))


async def read_until(
    client: RawClient, seen: list[Packet], done: Callable[[list[Packet]], bool]
) -> list[Packet]:
    """Read (acknowledging QoS 1 PUBLISHes) until `done(seen)`; `seen` grows in place."""
    while not done(seen):
        packet = await client.recv(timeout=10)
        assert packet is not None, f"the server closed the connection; got {seen}"
        await acknowledge(client, packet)
        seen.append(packet)
    return seen


def has(kind: type[Packet], **fields: object) -> Callable[[list[Packet]], bool]:
    def found(seen: list[Packet]) -> bool:
        return any(
            isinstance(p, kind) and all(getattr(p, k) == v for k, v in fields.items()) for p in seen
        )

    return found


def count(n: int) -> Callable[[list[Packet]], bool]:
    return lambda seen: len(seen) >= n


def both(*tests: Callable[[list[Packet]], bool]) -> Callable[[list[Packet]], bool]:
    return lambda seen: all(test(seen) for test in tests)


def publishes(seen: list[Packet], topic: str) -> list[Publish]:
    return [p for p in seen if isinstance(p, Publish) and p.topic == topic]


async def test_s4_6_a_publish_after_a_subscribe_on_the_same_node_reaches_it(place: Place) -> None:
    """The issue's case (§4.6: the server handles what one node received in that order): B
    subscribes to T (QoS 2, No Local), and A, subscribed to T the same way before, publishes
    at QoS 1 as soon as the edge has read B's SUBSCRIBE, without waiting for the SUBACK. B gets
    the message (before or after its SUBACK: the server may send matching PUBLISHes before it,
    §3.8.4), and A's PUBACK says it matched a subscriber."""
    a, _ = await v5.connect(place.port, place.client_id("a", "n3"))
    b, _ = await v5.connect(place.port, place.client_id("b", "n2"))
    sentinel = f"order/{uid()}/sentinel"
    await v5.subscribe(b, Subscription(sentinel, 1))
    missed = []
    for r in range(ROUNDS):
        topic = f"order/{uid()}/{r}"
        await v5.subscribe(a, Subscription(topic, 2, no_local=True))
        pid = b.next_packet_id()
        seen = await read_by_edge(b, Subscribe(pid, (Subscription(topic, 2, no_local=True),)))
        ack = await v5.publish(a, topic, b"after the subscribe", qos=1)
        assert ack is not None
        assert ack.reason_code == 0, ack
        await v5.publish(a, sentinel, b"sentinel")
        await read_until(b, seen, both(has(SubAck, packet_id=pid), has(Publish, topic=sentinel)))
        got = [(p.payload, p.qos) for p in publishes(seen, topic)]
        if got != [(b"after the subscribe", 1)]:
            missed.append((r, got))
    assert not missed, f"rounds whose message did not reach B once: {missed} of {ROUNDS}"


async def test_s4_10_a_request_published_right_after_the_responders_subscribe_is_answered(
    place: Place,
) -> None:
    """Request/response (§4.10): the responder subscribes to its request topic; the requester,
    subscribed to its response topic, sends a request with a Response Topic and Correlation Data
    as soon as the edge has read the responder's SUBSCRIBE. The responder gets it with both
    properties and its response reaches the requester."""
    requester, _ = await v5.connect(place.port, place.client_id("req", "n3"))
    responder, _ = await v5.connect(place.port, place.client_id("resp", "n2"))
    sentinel = f"rr/{uid()}/sentinel"
    await v5.subscribe(responder, Subscription(sentinel, 1))
    missed = []
    for r in range(ROUNDS):
        requests, responses = f"rr/{uid()}/requests", f"rr/{uid()}/responses"
        await v5.subscribe(requester, Subscription(responses, 1))
        pid = responder.next_packet_id()
        seen = await read_by_edge(responder, Subscribe(pid, (Subscription(requests, 1),)))
        correlation = f"round {r}".encode()
        await v5.publish(
            requester,
            requests,
            b"what time is it",
            response_topic=responses,
            correlation_data=correlation,
        )
        await v5.publish(requester, sentinel, b"sentinel")
        await read_until(
            responder, seen, both(has(SubAck, packet_id=pid), has(Publish, topic=sentinel))
        )
        got = publishes(seen, requests)
        if len(got) != 1:
            missed.append((r, len(got)))
            continue
        props = got[0].properties
        assert (props.response_topic, props.correlation_data) == (responses, correlation)
        await v5.publish(responder, responses, b"noon", correlation_data=correlation)
        response = await v5.receive(requester)
        assert (response.topic, response.payload) == (responses, b"noon")
        assert response.properties.correlation_data == correlation
    assert not missed, f"rounds whose request did not reach the responder once: {missed}"


async def test_s4_6_a_publish_acknowledged_before_a_subscribe_on_another_node_never_reaches_it(
    trio: HexmqCluster,
) -> None:
    """Across nodes (issue 29 item 7): A, on node 1, publishes to T at QoS 1 and has its PUBACK
    (0x10: nothing matched) before B, on node 2, sends its SUBSCRIBE to T; after B's SUBACK, A
    publishes to T again. B gets the second message only (had the first reached it, it would
    have come first: one publisher's messages to one topic keep their order, MQTT-4.6.0-5). A
    message whose publish was done before the subscription was asked for never reaches it, on
    one broker or across nodes. (What is not promised across nodes is the other order: a
    PUBLISH that another node reads right after a SUBSCRIBE, before its SUBACK. Counting it by
    the nodes' clocks with a tolerance for their reading jitter would break this test.)"""
    a, _ = await v5.connect(trio.mqtt_port(1), f"a-{uid()}")
    b, _ = await v5.connect(trio.mqtt_port(2), f"b-{uid()}")
    for r in range(ROUNDS):
        topic = f"before/{uid()}/{r}"
        ack = await v5.publish(a, topic, b"before the subscribe", qos=1)
        assert ack is not None
        assert ack.reason_code == 0x10, ack
        await v5.subscribe(b, Subscription(topic, 1))
        ack = await v5.publish(a, topic, b"after the suback", qos=1)
        assert ack is not None
        assert ack.reason_code == 0, ack
        seen = await read_until(b, [], has(Publish, topic=topic, payload=b"after the suback"))
        assert [p.payload for p in publishes(seen, topic)] == [b"after the suback"], f"round {r}"


async def test_mqtt_3_10_4_2_a_publish_after_an_unsubscribe_on_the_same_node_is_not_delivered(
    place: Place,
) -> None:
    """MQTT-3.10.4-2: after an UNSUBSCRIBE no new messages for the filter. A publishes to T as
    soon as the edge has read B's UNSUBSCRIBE of T, then to a sentinel topic B still holds: B
    gets the sentinel and nothing on T. (This held before issue 16: the UNSUBSCRIBE reaches the
    session's partition ahead of the PUBLISH, which the partition then matches against the
    remaining subscriptions.)"""
    a, _ = await v5.connect(place.port, place.client_id("a", "n3"))
    b, _ = await v5.connect(place.port, place.client_id("b", "n2"))
    for r in range(ROUNDS):
        topic, sentinel = f"unsub/{uid()}/{r}", f"unsub/{uid()}/sentinel"
        await v5.subscribe(b, Subscription(topic, 1), Subscription(sentinel, 1))
        pid = b.next_packet_id()
        seen = await read_by_edge(b, Unsubscribe(pid, (topic,)))
        await v5.publish(a, topic, b"after the unsubscribe")
        await v5.publish(a, sentinel, b"sentinel")
        await read_until(b, seen, both(has(UnsubAck, packet_id=pid), has(Publish, topic=sentinel)))
        assert publishes(seen, topic) == [], f"round {r}: delivered after the UNSUBSCRIBE"


async def test_s4_8_2_a_publish_after_a_shared_subscribe_on_the_same_node_reaches_the_group(
    place: Place,
) -> None:
    """§4.8.2: B becomes the only member of a new shared group, and A publishes to its filter
    as soon as the edge has read the SUBSCRIBE: the group (B) gets the message."""
    a, _ = await v5.connect(place.port, place.client_id("a", "n3"))
    b, _ = await v5.connect(place.port, place.client_id("b", "n2"))
    sentinel = f"share/{uid()}/sentinel"
    await v5.subscribe(b, Subscription(sentinel, 1))
    missed = []
    for r in range(ROUNDS):
        topic = f"share/{uid()}/{r}"
        pid = b.next_packet_id()
        seen = await read_by_edge(b, Subscribe(pid, (Subscription(f"$share/g{r}/{topic}", 1),)))
        ack = await v5.publish(a, topic, b"to the group")
        await v5.publish(a, sentinel, b"sentinel")
        await read_until(b, seen, both(has(SubAck, packet_id=pid), has(Publish, topic=sentinel)))
        got = [p.payload for p in publishes(seen, topic)]
        if ack is None or ack.reason_code != 0 or got != [b"to the group"]:
            missed.append((r, ack, got))
    assert not missed, f"rounds whose message did not reach the group once: {missed}"


async def test_s4_8_2_a_publish_after_a_members_unsubscribe_goes_to_another_member(
    place: Place,
) -> None:
    """§4.8.2, each message to one member of the group: B and C (sessions in different
    partitions) share a group; B unsubscribes, and every message published once the edge has
    read the UNSUBSCRIBE goes to C, the one member left, none to B's partition, where nobody of
    the group is left to take it."""
    a, _ = await v5.connect(place.port, place.client_id("a", "n3"))
    b_id = place.client_id("b", "n2")
    b, _ = await v5.connect(place.port, b_id)
    c, _ = await v5.connect(place.port, place.other_partition(b_id, "c", "n3"))
    missed = []
    for r in range(ROUNDS // 2):
        topic, sentinel = f"leave/{uid()}/{r}", f"leave/{uid()}/sentinel"
        group = f"$share/g{r}/{topic}"
        await v5.subscribe(b, Subscription(group, 1), Subscription(sentinel, 1))
        await v5.subscribe(c, Subscription(group, 1), Subscription(sentinel, 1))
        pid = b.next_packet_id()
        seen_b = await read_by_edge(b, Unsubscribe(pid, (group,)))
        # All four at once, so that the edge routes them together, right after it read the
        # UNSUBSCRIBE (the group's turns alternate between the two partitions).
        sent = [f"m{i}".encode() for i in range(4)]
        packets = [Publish(topic, m, 1, False, False, a.next_packet_id()) for m in sent]
        await at_once(*((a, packet) for packet in packets))
        await read_until(a, [], count(len(packets)))
        await v5.publish(a, sentinel, b"sentinel")
        seen_c = await read_until(c, [], has(Publish, topic=sentinel))
        got = [p.payload for p in publishes(seen_c, topic)]
        if got != sent:
            missed.append((r, got))
        await read_until(
            b, seen_b, both(has(UnsubAck, packet_id=pid), has(Publish, topic=sentinel))
        )
        assert publishes(seen_b, topic) == []
    assert not missed, f"rounds in which the member left did not get every message: {missed}"


async def test_mqtt_3_3_1_9_a_retained_message_set_around_a_subscribe_arrives_once(
    place: Place,
) -> None:
    """MQTT-3.3.1-9 with one node's order: a retained message set just before B's SUBSCRIBE
    reaches B once, as a retained message (RETAIN 1); one set just after it reaches B once,
    live (RETAIN 0, the subscription not asking for Retain As Published), as on a single broker,
    and not again among the retained messages gathered after the SUBACK.

    Each SUBSCRIBE (`base/+`) also gets a retained message on `base/~last`, which sorts after
    every other topic here: once it has come, the SUBSCRIBE's whole batch of retained messages
    has (they are queued together, in topic order). A sentinel published after both then
    follows everything queued for `base/t`."""
    a, _ = await v5.connect(place.port, place.client_id("a", "n3"))
    missed = []
    for r in range(ROUNDS // 2):
        for when in ("before", "after"):
            base = f"ret/{uid()}"
            topic, last, sentinel = f"{base}/t", f"{base}/~last", f"{base}/sentinel"
            await v5.publish(a, last, b"last", retain=True)
            b, _ = await v5.connect(place.port, place.client_id("b", "n2"))
            pid = b.next_packet_id()
            subscribe = Subscribe(pid, (Subscription(f"{base}/+", 1),))
            payload = f"{when} the subscribe".encode()
            retained_publish = Publish(topic, payload, 1, True, False, a.next_packet_id())
            if when == "before":
                published = await read_by_edge(a, retained_publish)
                seen = await read_by_edge(b, subscribe)
            else:
                seen = await read_by_edge(b, subscribe)
                published = await read_by_edge(a, retained_publish)
            await read_until(a, published, has(PubAck, packet_id=retained_publish.packet_id))
            (ack,) = [p for p in published if isinstance(p, PubAck)]
            assert ack.reason_code < 0x80, ack
            await read_until(
                b,
                seen,
                both(
                    has(SubAck, packet_id=pid), has(Publish, topic=last), has(Publish, topic=topic)
                ),
            )
            await v5.publish(a, sentinel, b"sentinel")
            await read_until(b, seen, has(Publish, topic=sentinel))
            copies = [(p.payload, p.retain) for p in publishes(seen, topic)]
            if copies != [(payload, when == "before")]:
                missed.append((r, when, copies))
            await b.close()
    assert not missed, f"(round, set, [(payload, RETAIN)]) not arriving once as expected: {missed}"


async def test_mqtt_3_1_4_3_a_subscribe_before_a_takeover_reaches_the_new_connection(
    place: Place,
) -> None:
    """MQTT-3.1.4-3 (a second connection takes the session over) on one node's order: B sends
    a SUBSCRIBE and, at once, a new connection with B's client id (Clean Start 0) takes the
    session over; a message published as soon as the edge has read the SUBSCRIBE reaches the
    session and so the new connection, which finds the subscription in it (Session Present 1).
    Then the new connection subscribes again and, at once, a third one takes over with Clean
    Start 1: a message published right after matches only the session that ended, and never
    reaches the third connection's new, empty session."""
    a, _ = await v5.connect(place.port, place.client_id("a", "n3"))
    missed = []
    for r in range(ROUNDS // 2):
        topic, sentinel = f"take/{uid()}/{r}", f"take/{uid()}/sentinel"
        cid = place.client_id("b", "n2")
        b, _ = await v5.connect(place.port, cid, clean_start=False, session_expiry_interval=600)
        await v5.subscribe(b, Subscription(sentinel, 1))
        b2 = await v5.open_v5(place.port)
        await read_by_edge(b, Subscribe(b.next_packet_id(), (Subscription(topic, 1),)))
        publish = Publish(topic, b"after the subscribe", 1, False, False, a.next_packet_id())
        takeover = Connect(cid, protocol_version=5, clean_start=False, properties=KEEP)
        await at_once((b2, takeover), (a, publish))
        ack = await a.expect(PubAck)
        await v5.publish(a, sentinel, b"sentinel")
        seen = await read_until(b2, [], has(Publish, topic=sentinel))
        connack = seen[0]
        assert isinstance(connack, ConnAck)
        assert connack.session_present
        got = [p.payload for p in publishes(seen, topic)]
        if ack.reason_code != 0 or got != [b"after the subscribe"]:
            missed.append((r, ack, got))

        # A SUBSCRIBE just before a takeover with Clean Start 1: the new session has nothing.
        await read_by_edge(b2, Subscribe(b2.next_packet_id(), (Subscription(f"{topic}/x", 1),)))
        b3 = await v5.open_v5(place.port)
        await b3.send(Connect(cid, protocol_version=5, clean_start=True))
        await v5.publish(a, f"{topic}/x", b"to the ended session")
        assert isinstance(await b3.expect(ConnAck), ConnAck)
        await v5.subscribe(b3, Subscription(sentinel, 1))
        await v5.publish(a, sentinel, b"sentinel")
        seen = await read_until(b3, [], has(Publish, topic=sentinel))
        assert publishes(seen, f"{topic}/x") == []
        for client in (b, b2, b3):
            await client.close()
    assert not missed, f"rounds whose message did not reach the new connection once: {missed}"


KEEP_600 = Properties(session_expiry_interval=600)
