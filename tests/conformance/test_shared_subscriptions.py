"""Shared subscriptions ($share/{ShareName}/{filter}), cluster-wide: members on every node, each
message to exactly one member per group (besides every non-shared subscriber), online members
first, queued at an offline member when none is online, no retained messages on subscribe, a
failed PUBACK discarding the message, and the 5.0 and 3.1.1 rules for bad share names and No
Local.

Redelivery (MQTT 5.0 4.8.2), on a 2-node cluster with RF 2: the messages of a member whose
connection or session ends go to another member of the group, on any node; QoS 2 messages
already sent to it stay with it [MQTT-4.8.2-4] and go to nobody else if its session ends
[MQTT-4.8.2-5]. Those members are raw clients on the project's codec, so that a member can
receive PUBLISHes without acknowledging them and then lose its connection (the socket is
aborted: no DISCONNECT)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable

import pytest

from hexmq.hashring import assign, partition_of
from hexmq.mqtt import (
    Disconnect,
    Packet,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Subscription,
    Unsubscribe,
    encode,
)
from tests.support import v5client as v5
from tests.support.eventually import eventually
from tests.support.rawclient import RawClient
from tests.support.unique import uid
from tests.support.v5client import KEEP

PARTITIONS = 32  # as the `trio` fixture (tests/conformance/conftest.py)
PERSISTENT = Properties(session_expiry_interval=600)


def client_ids(prefix: str, count: int) -> list[str]:
    """Client ids whose sessions live in `count` different partitions."""
    out: list[str] = []
    used: set[int] = set()
    while len(out) < count:
        cid = f"{prefix}-{uid()}"
        p = partition_of(cid, PARTITIONS)
        if p not in used:
            used.add(p)
            out.append(cid)
    return out


class Collector:
    """Reads a subscribed client's PUBLISHes in the background, acknowledging QoS 1 ones."""

    def __init__(self, client: RawClient) -> None:
        self.client = client
        self.got: list[Publish] = []
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                packet = await self.client.recv(timeout=60)
            except TimeoutError:
                continue
            if packet is None:
                return
            if isinstance(packet, Publish):
                self.got.append(packet)
                if packet.qos:
                    assert packet.packet_id is not None
                    await self.client.send(PubAck(packet.packet_id))

    @property
    def payloads(self) -> list[bytes]:
        return [p.payload for p in self.got]

    async def close(self) -> None:
        self._task.cancel()
        await self.client.close()


async def member(
    port: int, client_id: str, *filters: str, version: int = 5, qos: int = 1, **kw: object
) -> Collector:
    client, connack = await RawClient.connect(port, client_id, version=version, **kw)
    assert connack.reason_code == 0
    if filters:
        suback = await client.subscribe(*filters, qos=qos)
        assert suback.reason_codes == (qos,) * len(filters)
    return Collector(client)


async def publish_all(
    port: int, topics: Iterable[str], *, qos: int = 1, start: int = 0
) -> list[bytes]:
    """Publish one message per topic (payload: its number, from `start`), each acknowledged."""
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    payloads = []
    for i, topic in enumerate(topics, start):
        payload = f"{i}".encode()
        ack = await pub.publish(topic, payload, qos=qos)
        if qos:
            assert ack is not None
            assert ack.reason_code == 0
        payloads.append(payload)
    await pub.close()
    return payloads


async def settle(collectors: Iterable[Collector], total: int, timeout: float = 20) -> None:
    """Until the collectors together hold `total` messages, then a moment for any extras."""
    collectors = list(collectors)
    await eventually(lambda: sum(len(c.got) for c in collectors) >= total, timeout, "messages")
    await asyncio.sleep(0.5)


def exactly_once(groups: Iterable[Collector], payloads: list[bytes]) -> Counter[bytes]:
    seen = Counter(p for c in groups for p in c.payloads)
    assert sorted(seen) == sorted(payloads)
    assert set(seen.values()) == {1}, [p for p, n in seen.items() if n > 1]
    return seen


def in_order(payloads: list[bytes]) -> bool:
    numbers = [int(p) for p in payloads]
    return numbers == sorted(numbers)


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


async def test_s4_8_2_one_member_per_message_across_nodes(trio) -> None:
    """§4.8.2: each message goes to one member of the group, besides every plain subscriber.

    Members on three nodes. Also MQTT-4.6.0-6 (the plain subscriber gets them in order).
    """
    topic = f"sh/{uid()}/t"
    ids = client_ids("m", 3)
    members = [
        await member(trio.mqtt_port(i + 1), cid, f"$share/g/{topic}") for i, cid in enumerate(ids)
    ]
    plain = await member(trio.mqtt_port(2), f"plain-{uid()}", topic)
    payloads = await publish_all(trio.mqtt_port(1), [topic] * 300)
    await settle([*members, plain], 600)
    exactly_once(members, payloads)
    assert all(m.got for m in members), [len(m.got) for m in members]  # spread over the group
    assert all(in_order(m.payloads) for m in members)
    assert plain.payloads == payloads  # the non-shared subscriber gets every one, in order
    assert all(p.qos == 1 and not p.retain for m in members for p in m.got)
    for c in (*members, plain):
        await c.close()


async def test_mqtt_4_8_2_3_each_group_gets_every_message_once(trio) -> None:
    """MQTT-4.8.2-3: a member gets a message at most at the QoS granted to it.

    Two groups, each gets every message once. Also MQTT-3.8.4-7, -8 and MQTT-3.10.4-1 (an
    UNSUBSCRIBE takes a member out of its group).
    """
    topic = f"sh/{uid()}/t"
    ids = client_ids("g", 4)
    g = [
        await member(trio.mqtt_port(n), cid, f"$share/g/{topic}")
        for n, cid in zip((1, 2), ids[:2], strict=True)
    ]
    # Group h at subscription QoS 0: its members get QoS 0 (min of message and subscription).
    h = [
        await member(trio.mqtt_port(n), cid, f"$share/h/{topic}", qos=0)
        for n, cid in zip((2, 3), ids[2:], strict=True)
    ]
    payloads = await publish_all(trio.mqtt_port(3), [topic] * 100)
    await settle([*g, *h], 200)
    exactly_once(g, payloads)
    exactly_once(h, payloads)
    assert {p.qos for c in g for p in c.got} == {1}
    assert {p.qos for c in h for p in c.got} == {0}
    # A member that leaves the group (UNSUBSCRIBE) gets no more; the other gets them all.
    leaver, stayer = g
    before, other = len(leaver.got), len(stayer.got)
    await leaver.client.send(Unsubscribe(leaver.client.next_packet_id(), (f"$share/g/{topic}",)))
    await asyncio.sleep(0.5)
    more = await publish_all(trio.mqtt_port(1), [topic] * 20, start=100)
    await settle([stayer], other + 20)
    assert len(leaver.got) == before
    assert stayer.payloads[other:] == more
    for c in (*g, *h):
        await c.close()


async def test_s4_8_2_wildcard_shared_filters(trio) -> None:
    """§4.8.2: a group is its whole filter: `$share/w/a/+/x` and `$share/w/a/#` are two.

    Also MQTT-3.3.2-3 (the delivered Topic Names match the filter).
    """
    base = f"sh/{uid()}"
    ids = client_ids("w", 4)
    plus = [
        await member(trio.mqtt_port(n), cid, f"$share/w/{base}/+/x")
        for n, cid in zip((1, 2), ids[:2], strict=True)
    ]
    hash_ = [
        await member(trio.mqtt_port(n), cid, f"$share/w/{base}/#")
        for n, cid in zip((3, 1), ids[2:], strict=True)
    ]
    topics = [f"{base}/{i % 3}/{'x' if i % 2 else 'y'}" for i in range(60)]
    payloads = await publish_all(trio.mqtt_port(2), topics)
    x_payloads = [p for p, t in zip(payloads, topics, strict=True) if t.endswith("/x")]
    await settle([*plus, *hash_], len(payloads) + len(x_payloads))
    # "$share/w/a/+/x" and "$share/w/a/#" are two groups (a group is the whole filter).
    exactly_once(plus, x_payloads)
    exactly_once(hash_, payloads)
    assert {p.topic for c in plus for p in c.got} == {t for t in topics if t.endswith("/x")}
    for c in (*plus, *hash_):
        await c.close()


async def test_s4_8_2_no_retained_messages_on_shared_subscribe(trio) -> None:
    """§4.8.2: a shared subscribe gets no retained messages (3.1.1 and 5.0 members)."""
    topic = f"sh/{uid()}/r"
    pub, _ = await RawClient.connect(trio.mqtt_port(1), f"pub-{uid()}")
    await pub.send(Publish(topic, b"kept", qos=1, retain=True, packet_id=1))
    await pub.expect(PubAck)
    shared = await member(trio.mqtt_port(2), f"s-{uid()}", f"$share/g/{topic}")
    shared11 = await member(trio.mqtt_port(3), f"s-{uid()}", f"$share/h/{topic}", version=4)
    plain = await member(trio.mqtt_port(3), f"p-{uid()}", topic)
    await settle([plain], 1)
    assert [(p.payload, p.retain) for p in plain.got] == [(b"kept", True)]
    assert shared.got == []
    assert shared11.got == []
    # Live messages reach the groups as usual.
    await pub.send(Publish(topic, b"live", qos=1, packet_id=2))
    await pub.expect(PubAck)
    await settle([shared, shared11], 2)
    assert [(p.payload, p.retain) for p in (*shared.got, *shared11.got)] == [(b"live", False)] * 2
    await pub.close()
    for c in (shared, shared11, plain):
        await c.close()


async def test_mqtt_4_8_2_2_bad_share_names_and_no_local(trio) -> None:
    """MQTT-4.8.2-2: a ShareName has no `/`, `+` or `#` and is followed by `/` and a filter.

    5.0 gets 0x8F, 3.1.1 0x80 per bad filter, in one SUBACK. Also MQTT-4.8.2-1 (an empty
    ShareName), MQTT-3.8.3-4 (No Local on a shared subscription: DISCONNECT 0x82),
    MQTT-3.8.4-1, -5, -6 and MQTT-3.9.3-1.
    """
    client, connack = await RawClient.connect(trio.mqtt_port(1), f"v5-{uid()}", version=5)
    assert connack.properties.shared_subscription_available is True
    bad = ("$share//t", "$share/g+/t", "$share/#/t", "$share/g", "$share/g/")
    suback = await client.subscribe(*bad, f"$share/ok/{uid()}")
    assert suback.reason_codes == (0x8F,) * len(bad) + (1,)  # Topic Filter invalid

    old, _ = await RawClient.connect(trio.mqtt_port(2), f"v4-{uid()}", version=4)
    suback = await old.subscribe(*bad, f"$share/ok/{uid()}")
    assert suback.reason_codes == (0x80,) * len(bad) + (1,)  # Failure
    await old.close()

    # No Local on a shared subscription is a Protocol Error (MQTT-3.8.3-4). Our codec will not
    # encode it, so the options byte is set by hand.
    data = encode(Subscribe(client.next_packet_id(), (Subscription("$share/g/t", 1),)), 5)
    assert data[-1] == 0x01
    await client.send_bytes(data[:-1] + bytes((0x05,)))
    seen = await client.wait_closed()
    assert [(type(p), p.reason_code) for p in seen] == [(Disconnect, 0x82)]
    await client.close()


async def test_s4_8_2_v311_members(trio) -> None:
    """§4.8.2: 3.1.1 and 5.0 clients are members of one group alike."""
    topic = f"sh/{uid()}/t"
    ids = client_ids("v", 3)
    members = [
        await member(trio.mqtt_port(1), ids[0], f"$share/g/{topic}", version=4),
        await member(trio.mqtt_port(2), ids[1], f"$share/g/{topic}", version=4),
        await member(trio.mqtt_port(3), ids[2], f"$share/g/{topic}", version=5),
    ]
    payloads = await publish_all(trio.mqtt_port(2), [topic] * 90)
    await settle(members, 90)
    exactly_once(members, payloads)
    assert all(m.got for m in members)
    for c in members:
        await c.close()


async def test_s4_8_2_offline_members_get_messages_only_when_none_is_online(trio) -> None:
    """§4.8.2: online members first; with every member offline, each message queued at one."""
    topic = f"sh/{uid()}/t"
    flt = f"$share/g/{topic}"
    a_id, b_id = client_ids("o", 2)
    a = await member(trio.mqtt_port(1), a_id, flt, clean_start=False, properties=PERSISTENT)
    b = await member(trio.mqtt_port(2), b_id, flt, version=4, clean_start=False)
    # a leaves (its session stays): b, online, gets every message.
    await a.client.send(Disconnect())
    await a.close()
    await asyncio.sleep(0.5)  # the index update (no online member in a's partition) spreads
    first = await publish_all(trio.mqtt_port(3), [topic] * 50)
    await settle([b], 50)
    assert b.payloads == first
    # b leaves too: with every member offline, each message is queued at one of them.
    await b.client.send(Disconnect())
    await b.close()
    await asyncio.sleep(0.5)
    second = await publish_all(trio.mqtt_port(3), [topic] * 20, start=100)
    a = await member(trio.mqtt_port(2), a_id, clean_start=False, properties=PERSISTENT)
    b = await member(trio.mqtt_port(3), b_id, version=4, clean_start=False)
    await settle([a, b], 20)
    exactly_once([a, b], second)  # nothing of the first 50 reached a
    assert a.got
    assert b.got
    assert in_order(a.payloads)
    assert in_order(b.payloads)
    for c in (a, b):
        await c.close()


async def test_mqtt_4_8_2_6_a_failed_puback_from_a_shared_member_discards_the_message(trio) -> None:
    """MQTT-4.8.2-6: a member's PUBACK of 0x80 or more discards the message for every member."""
    # MQTT-4.8.2-6: the member that got it answers PUBACK 0x80: the message is neither sent to
    # the other member nor resent to this one when it comes back.
    u = uid()
    group = f"$share/g{u}/shared/{u}"
    topic = f"shared/{u}"
    ids = [f"member-{i}-{u}" for i in (1, 3)]
    ports = [trio.mqtt_port(1), trio.mqtt_port(3)]
    members = []
    for client_id, port in zip(ids, ports, strict=True):
        member, _ = await v5.connect(port, client_id, session_expiry_interval=KEEP)
        assert await v5.subscribe(member, Subscription(group, 1)) == (1,)
        members.append(member)
    pub, _ = await v5.connect(trio.mqtt_port(2))
    await v5.publish(pub, topic, b"refused")
    [(which, got)] = await next_publishes(members)
    assert got.payload == b"refused"
    assert got.packet_id is not None
    await members[which].send(PubAck(got.packet_id, 0x80))
    await v5.leave(members[which])
    members[which], connack = await v5.connect(
        ports[which], ids[which], clean_start=False, session_expiry_interval=KEEP
    )
    assert connack.session_present is True

    sentinels = {f"s{i}".encode() for i in range(6)}
    for payload in sorted(sentinels):
        await v5.publish(pub, topic, payload)
    seen: list[bytes] = []
    while not sentinels <= set(seen):
        for index, packet in await next_publishes(members):
            seen.append(packet.payload)
            assert packet.packet_id is not None
            await members[index].send(PubAck(packet.packet_id))
    assert sorted(seen) == sorted(sentinels)  # "refused" came to no one again


# ----- redelivery (2 nodes, RF 2) ----------------------------------------------------------


RF = 2
NODES = ("n1", "n2")
TABLE = assign(list(NODES), PARTITIONS, RF)


@pytest.fixture(scope="module")
def duo(hexmq_cluster_module):
    return hexmq_cluster_module(nodes=2, partitions=PARTITIONS, extra=["--rf", str(RF)])


def client_id(prefix: str, fits: Callable[[int], bool]) -> str:
    """A fresh client id whose session partition p satisfies fits(p)."""
    while True:
        cid = f"{prefix}-{uid()}"
        if fits(partition_of(cid, PARTITIONS)):
            return cid


def mastered_by(node: str) -> Callable[[int], bool]:
    return lambda p: TABLE[p][0] == node


class Member:
    """A connected member of a group that records every PUBLISH it gets. With `ack` it
    acknowledges them (PUBACK; PUBREC then PUBCOMP for QoS 2); without, it never answers."""

    def __init__(self, client: RawClient, *, ack: bool) -> None:
        self.client = client
        self.ack = ack
        self.got: list[Publish] = []
        self.completed: list[int] = []  # QoS 2 packet ids whose PUBREL it answered
        self._task = asyncio.create_task(self._read())

    @classmethod
    async def join(
        cls,
        port: int,
        cid: str,
        group: str | None,
        *,
        ack: bool,
        qos: int = 1,
        expiry: int = KEEP,
        receive_maximum: int | None = None,
        clean_start: bool = True,
    ) -> Member:
        props = Properties(session_expiry_interval=expiry, receive_maximum=receive_maximum)
        client, connack = await RawClient.connect(
            port, cid, version=5, clean_start=clean_start, properties=props
        )
        assert connack.reason_code == 0
        if group is not None:
            assert (await client.subscribe(group, qos=qos)).reason_codes == (qos,)
        return cls(client, ack=ack)

    async def _read(self) -> None:
        while True:
            try:
                packet: Packet | None = await self.client.recv(timeout=60)
            except TimeoutError:
                continue
            if packet is None:
                return
            if isinstance(packet, Publish):
                self.got.append(packet)
                if self.ack and packet.qos == 1:
                    await self.client.send(PubAck(packet.packet_id))
                elif self.ack and packet.qos == 2:
                    await self.client.send(PubRec(packet.packet_id))
            elif isinstance(packet, PubRel):
                self.completed.append(packet.packet_id)
                await self.client.send(PubComp(packet.packet_id))

    @property
    def payloads(self) -> list[bytes]:
        return [p.payload for p in self.got]

    async def drop(self) -> None:
        """The connection is lost: no DISCONNECT, the socket just goes."""
        self._task.cancel()
        self.client.writer.transport.abort()

    async def close(self) -> None:
        self._task.cancel()
        await self.client.close()


async def publish(port: int, topic: str, count: int, qos: int) -> list[bytes]:
    """`count` messages numbered in their payloads, each stored by the broker (PUBACK, or
    PUBREC then PUBCOMP) before the next."""
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    payloads = []
    for i in range(count):
        payload = b"%03d" % i
        pid = pub.next_packet_id()
        await pub.send(Publish(topic, payload, qos=qos, packet_id=pid))
        if qos == 1:
            assert (await pub.expect(PubAck)).reason_code == 0
        else:
            assert (await pub.expect(PubRec)).reason_code == 0
            await pub.send(PubRel(pid))
            await pub.expect(PubComp)
        payloads.append(payload)
    await pub.close()
    return payloads


@pytest.mark.parametrize("where", ["other-node", "same-partition"])
async def test_s4_8_2_qos1_unacknowledged_messages_of_a_lost_member_go_to_another_member(
    duo,
    where: str,
) -> None:
    """§4.8.2: on a lost connection the Server MAY send the QoS 1 message to another member."""
    topic = f"rd/{uid()}"
    group = f"$share/g/{topic}"
    a_id = client_id("a", mastered_by("n1"))
    a_p = partition_of(a_id, PARTITIONS)
    if where == "same-partition":
        b_id = client_id("b", lambda p: p == a_p)  # moved in one write batch
    else:
        b_id = client_id("b", mastered_by("n2"))  # handed over through an edge
    a = await Member.join(duo.mqtt_port(1), a_id, group, ack=False)
    b = await Member.join(duo.mqtt_port(2), b_id, group, ack=True)
    payloads = await publish(duo.mqtt_port(2), topic, 40, qos=1)
    await eventually(lambda: len(a.got) + len(b.got) == 40, 15)
    assert a.got
    assert b.got
    unacked = a.payloads
    before = len(b.got)
    await a.drop()
    # Every message A had, never acknowledged, reaches B, in order, once.
    await eventually(lambda: len(b.got) == 40, 15)
    await asyncio.sleep(0.5)
    assert sorted(b.payloads) == payloads
    assert b.payloads[before:] == unacked
    assert all(p.qos == 1 and not p.dup for p in b.got[before:])
    # A's session lives on, without them: back, it gets nothing more.
    a = await Member.join(duo.mqtt_port(2), a_id, None, ack=True, clean_start=False)
    await asyncio.sleep(1.0)
    assert a.got == []
    for m in (a, b):
        await m.close()


async def test_s4_8_2_qos1_messages_of_a_member_whose_session_ends_go_to_an_offline_member(
    duo,
) -> None:
    """§4.8.2: if the member's Session terminates, the Server SHOULD send the message to
    another member (here the only other one, offline: it is queued for it)."""
    topic = f"rd/{uid()}"
    group = f"$share/g/{topic}"
    a_id = client_id("a", mastered_by("n2"))
    b_id = client_id("b", mastered_by("n1"))
    b = await Member.join(duo.mqtt_port(1), b_id, group, ack=True)
    await b.client.send(Disconnect())  # B's session stays, offline
    await b.close()
    a = await Member.join(duo.mqtt_port(2), a_id, group, ack=False, expiry=0)
    await asyncio.sleep(0.5)  # every edge hears that B's partition has nobody online
    payloads = await publish(duo.mqtt_port(1), topic, 20, qos=1)
    await eventually(lambda: len(a.got) == 20, 15)  # the only member online gets them all
    await a.drop()  # expiry 0: A's session ends with its connection
    await asyncio.sleep(1.0)
    b = await Member.join(duo.mqtt_port(2), b_id, None, ack=True, clean_start=False)
    await eventually(lambda: len(b.got) == 20, 15)
    await asyncio.sleep(0.5)
    assert b.payloads == payloads
    for m in (a, b):
        await m.close()


async def qos2_members(
    duo,
    topic: str,
    *,
    a_expiry: int,
) -> tuple[str, Member, Member, list[bytes]]:
    """A (on n1, a window of 2, never answering) and B (on n2, completing every exchange) share
    `topic` at QoS 2, and 20 QoS 2 messages are published. Returns (A's client id, A, B, the
    payloads) once A holds its 2 PUBLISHes and B has completed its share."""
    group = f"$share/g/{topic}"
    a_id = client_id("a", mastered_by("n1"))
    b_id = client_id("b", mastered_by("n2"))
    a = await Member.join(
        duo.mqtt_port(1), a_id, group, ack=False, qos=2, expiry=a_expiry, receive_maximum=2
    )
    b = await Member.join(duo.mqtt_port(2), b_id, group, ack=True, qos=2)
    payloads = await publish(duo.mqtt_port(2), topic, 20, qos=2)
    await eventually(lambda: len(a.got) == 2 and len(b.completed) == len(b.got), 15)
    await asyncio.sleep(0.5)
    assert len(a.got) == 2  # its window: the rest of its share is queued, never sent to it
    assert 0 < len(b.got) < 18
    return a_id, a, b, payloads


async def test_mqtt_4_8_2_4_qos2_sent_to_a_lost_member_is_completed_with_it_on_reconnect(
    duo,
) -> None:
    """MQTT-4.8.2-4: the Server MUST complete the delivery of the QoS 2 message to that Client
    when it reconnects."""
    a_id, a, b, payloads = await qos2_members(duo, f"rd/{uid()}", a_expiry=KEEP)
    sent_to_a = a.got
    await a.drop()
    # What A was never sent goes to B; the two PUBLISHes A has stay with A.
    await eventually(lambda: len(b.got) == 18, 15)
    await asyncio.sleep(1.0)
    assert len(b.got) == 18
    assert sorted(b.payloads + [p.payload for p in sent_to_a]) == payloads
    await eventually(lambda: b.completed == [p.packet_id for p in b.got], 15)
    # A comes back (through the other node): both are sent again, DUP, with their packet ids,
    # and their exchanges complete.
    a = await Member.join(duo.mqtt_port(2), a_id, None, ack=True, clean_start=False)
    await eventually(lambda: len(a.completed) == 2, 15)
    assert [(p.payload, p.packet_id, p.qos, p.dup) for p in a.got] == [
        (p.payload, p.packet_id, 2, True) for p in sent_to_a
    ]
    await asyncio.sleep(0.5)
    assert len(b.got) == 18  # B never got them
    for m in (a, b):
        await m.close()


async def test_mqtt_4_8_2_5_qos2_sent_to_a_member_whose_session_ends_goes_to_nobody_else(
    duo,
) -> None:
    """MQTT-4.8.2-5: if the Client's Session terminates before the Client reconnects, the
    Server MUST NOT send the Application Message to any other subscribed Client."""
    a_id, a, b, payloads = await qos2_members(duo, f"rd/{uid()}", a_expiry=0)
    sent_to_a = {p.payload for p in a.got}
    await a.drop()  # expiry 0: A's session ends with its connection
    # What A was never sent goes to B (its session ended: SHOULD, 4.8.2); the two PUBLISHes
    # A had go to nobody.
    await eventually(lambda: len(b.got) == 18, 15)
    await asyncio.sleep(1.5)
    assert len(b.got) == 18
    assert set(b.payloads) == set(payloads) - sent_to_a
    await eventually(lambda: b.completed == [p.packet_id for p in b.got], 15)
    # A's session is gone, and with it the two messages.
    a = await Member.join(duo.mqtt_port(1), a_id, None, ack=True, clean_start=False)
    await asyncio.sleep(1.0)
    assert a.got == []
    for m in (a, b):
        await m.close()
