"""Shared subscriptions (MQTT 5.0 4.8.2): the messages of a member whose connection or session
ends go to another member of the group, on any node; QoS 2 messages already sent to it stay
with it [MQTT-4.8.2-4] and go to nobody else if its session ends [MQTT-4.8.2-5].

Members are raw clients on the project's codec, so that a member can receive PUBLISHes without
acknowledging them and then lose its connection (the socket is aborted: no DISCONNECT)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

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
)
from tests.support.rawclient import RawClient

PARTITIONS = 32
RF = 2
NODES = ("n1", "n2")
TABLE = assign(list(NODES), PARTITIONS, RF)
PERSISTENT = 600


@pytest.fixture(scope="module")
def duo(hexmq_cluster_module):  # type: ignore[no-untyped-def]
    return hexmq_cluster_module(nodes=2, partitions=PARTITIONS, extra=["--rf", str(RF)])


def uid() -> str:
    return uuid.uuid4().hex[:10]


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
        expiry: int = PERSISTENT,
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
                    await self.client.send(PubAck(packet.packet_id))  # type: ignore[arg-type]
                elif self.ack and packet.qos == 2:
                    await self.client.send(PubRec(packet.packet_id))  # type: ignore[arg-type]
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


async def until(condition: Callable[[], bool], timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # noqa: ASYNC110 - polls the members' readers
            await asyncio.sleep(0.05)


def in_order(payloads: list[bytes]) -> bool:
    return payloads == sorted(payloads)


@pytest.mark.parametrize("where", ["other-node", "same-partition"])
async def test_4_8_2_qos1_unacknowledged_messages_of_a_lost_member_go_to_another_member(
    duo,  # type: ignore[no-untyped-def]
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
    await until(lambda: len(a.got) + len(b.got) == 40)
    assert a.got
    assert b.got
    unacked = a.payloads
    before = len(b.got)
    await a.drop()
    # Every message A had, never acknowledged, reaches B, in order, once.
    await until(lambda: len(b.got) == 40)
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


async def test_4_8_2_qos1_messages_of_a_member_whose_session_ends_go_to_an_offline_member(
    duo,  # type: ignore[no-untyped-def]
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
    await until(lambda: len(a.got) == 20)  # the only member online gets them all
    await a.drop()  # expiry 0: A's session ends with its connection
    await asyncio.sleep(1.0)
    b = await Member.join(duo.mqtt_port(2), b_id, None, ack=True, clean_start=False)
    await until(lambda: len(b.got) == 20)
    await asyncio.sleep(0.5)
    assert b.payloads == payloads
    for m in (a, b):
        await m.close()


async def qos2_members(
    duo,  # type: ignore[no-untyped-def]
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
    await until(lambda: len(a.got) == 2 and len(b.completed) == len(b.got))
    await asyncio.sleep(0.5)
    assert len(a.got) == 2  # its window: the rest of its share is queued, never sent to it
    assert 0 < len(b.got) < 18
    return a_id, a, b, payloads


async def test_mqtt_4_8_2_4_qos2_sent_to_a_lost_member_is_completed_with_it_on_reconnect(
    duo,  # type: ignore[no-untyped-def]
) -> None:
    """MQTT-4.8.2-4: the Server MUST complete the delivery of the QoS 2 message to that Client
    when it reconnects."""
    a_id, a, b, payloads = await qos2_members(duo, f"rd/{uid()}", a_expiry=PERSISTENT)
    sent_to_a = a.got
    await a.drop()
    # What A was never sent goes to B; the two PUBLISHes A has stay with A.
    await until(lambda: len(b.got) == 18)
    await asyncio.sleep(1.0)
    assert len(b.got) == 18
    assert sorted(b.payloads + [p.payload for p in sent_to_a]) == payloads
    await until(lambda: b.completed == [p.packet_id for p in b.got])
    # A comes back (through the other node): both are sent again, DUP, with their packet ids,
    # and their exchanges complete.
    a = await Member.join(duo.mqtt_port(2), a_id, None, ack=True, clean_start=False)
    await until(lambda: len(a.completed) == 2)
    assert [(p.payload, p.packet_id, p.qos, p.dup) for p in a.got] == [
        (p.payload, p.packet_id, 2, True) for p in sent_to_a
    ]
    await asyncio.sleep(0.5)
    assert len(b.got) == 18  # B never got them
    for m in (a, b):
        await m.close()


async def test_mqtt_4_8_2_5_qos2_sent_to_a_member_whose_session_ends_goes_to_nobody_else(
    duo,  # type: ignore[no-untyped-def]
) -> None:
    """MQTT-4.8.2-5: if the Client's Session terminates before the Client reconnects, the
    Server MUST NOT send the Application Message to any other subscribed Client."""
    a_id, a, b, payloads = await qos2_members(duo, f"rd/{uid()}", a_expiry=0)
    sent_to_a = {p.payload for p in a.got}
    await a.drop()  # expiry 0: A's session ends with its connection
    # What A was never sent goes to B (its session ended: SHOULD, 4.8.2); the two PUBLISHes
    # A had go to nobody.
    await until(lambda: len(b.got) == 18)
    await asyncio.sleep(1.5)
    assert len(b.got) == 18
    assert set(b.payloads) == set(payloads) - sent_to_a
    await until(lambda: b.completed == [p.packet_id for p in b.got])
    # A's session is gone, and with it the two messages.
    a = await Member.join(duo.mqtt_port(1), a_id, None, ack=True, clean_start=False)
    await asyncio.sleep(1.0)
    assert a.got == []
    for m in (a, b):
        await m.close()
