"""Live MQTT connections at the edge during a failover, without processes: a ClientConnection
over a fake socket, the edge's real links and dispatcher, and the partition played by hand
(answers fed into the links). Publishes, CONNECTs and SUBSCRIBEs wait for a partition without a
reachable master and go on when it has one, or are refused past the bound; a live connection is
re-attached with its delivery state, never disconnected, and keeps its packet ids."""

from __future__ import annotations

import asyncio

import pytest

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
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
)
from services.edge.qos2_origins import RoutedOrigin
from services.edge.server import Edge
from tests.support.edge_harness import (
    HOLD,
    Client,
    Clock,
    client_id_in,
    connected,
    make_edge,
    ok,
    taken,
    up,
    view,
)
from tests.support.edge_harness import queued as qos

SC = pb.StatusCode


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def edge(clock: Clock) -> Edge:
    edge = make_edge(clock)
    for link in edge.router.links.values():
        up(link)
    assert edge.router.index_complete
    return edge


async def test_a_live_subscriber_is_re_attached_with_its_delivery_state(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    sub = await connected(edge, "sub")
    conn = sub.conn
    edge.on_delivery(
        n1,
        pb.Delivery(
            client_id="sub",
            connection_id=conn.connection_id,
            messages=[
                qos(1, 1),
                qos(2, 2),
                pb.QueuedMessage(message_id=3, qos=2, released=True),
                qos(4, 1),
            ],
        ),
    )
    packets = await sub.received()
    assert [(type(p).__name__, p.packet_id) for p in packets] == [
        ("Publish", 1),
        ("Publish", 2),
        ("PubRel", 3),
        ("Publish", 4),
    ]
    sub.send(PubAck(4))
    (ack,) = taken(n1)
    assert list(ack.delivery_ack.message_ids) == [4]
    assert ack.request_id

    n1._fail("killed")  # the partition service is gone; it comes back (same epoch)
    up(n1)
    (attach,) = taken(n1)
    state = attach.attach_session
    assert (state.client_id, state.connection_id) == ("sub", conn.connection_id)
    assert sorted(state.inflight_ids) == [1, 2]  # QoS 1 unacknowledged, QoS 2 before PUBREC
    assert list(state.released_ids) == [3]  # PUBREL sent, PUBCOMP not back
    assert list(state.acked_ids) == [4]  # its DeliveryAck's result never came
    assert list(state.received_ids) == []
    # The client acknowledges meanwhile: the ack waits for the re-attach, and still maps.
    sub.send(PubAck(1))
    sub.send(PubRec(2))
    assert taken(n1) == []
    ok(n1, attach)
    (after,) = taken(n1)
    assert list(after.delivery_ack.message_ids) == [1]
    assert list(after.delivery_ack.received_ids) == [2]
    assert await sub.received() == []  # no DISCONNECT, nothing resent by the edge
    assert not sub.transport.closed
    # Confirmed acknowledgements are not carried by the next re-attach.
    ok(n1, after)
    n1._fail("killed again")
    up(n1)
    (attach,) = taken(n1)
    assert list(attach.attach_session.acked_ids) == []
    assert list(attach.attach_session.inflight_ids) == []
    assert list(attach.attach_session.released_ids) == [3]


async def test_a_session_moved_by_the_view_is_re_attached_at_the_new_master(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    cid = client_id_in(5, "mover")
    sub = await connected(edge, cid)
    edge.on_delivery(
        n1, pb.Delivery(client_id=cid, connection_id=sub.conn.connection_id, messages=[qos(7, 1)])
    )
    await sub.received()
    edge.apply_view(view(2, {5: ("n2", 2)}))
    (attach,) = taken(n2)
    assert (attach.partition, attach.partition_epoch) == (5, 2)
    assert list(attach.attach_session.inflight_ids) == [7]
    sub.send(Subscribe(1, (Subscription("t/#", 1),)))  # waits behind the re-attach
    assert taken(n2) == []
    assert taken(n1) == []
    ok(n2, attach)
    (subscribe,) = taken(n2)
    assert subscribe.HasField("subscribe")
    assert subscribe.partition_epoch == 2
    ok(n2, subscribe, filter_outcomes=[pb.FILTER_OUTCOME_GRANTED_QOS_1], existed=[False])
    (suback,) = await sub.received()
    assert isinstance(suback, SubAck)
    assert suback.reason_codes == (1,)
    taken(n1), taken(n2)  # (the retained messages asked of every node)
    sub.send(PubAck(7))  # the delivery of the old master, acknowledged to the new one
    (ack,) = taken(n2)
    assert list(ack.delivery_ack.message_ids) == [7]


async def test_deliveries_from_a_master_the_session_left_are_dropped(edge: Edge) -> None:
    """Once a connection's re-attach went to its new master, a delivery still arriving from
    the old one is not sent: it would be in flight without the new master knowing, which
    would send it again (a QoS 2 message twice). The new master sends it instead."""
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    cid = client_id_in(5, "late")
    sub = await connected(edge, cid)
    edge.apply_view(view(2, {5: ("n2", 2)}))
    (attach,) = taken(n2)
    late = pb.Delivery(client_id=cid, connection_id=sub.conn.connection_id, messages=[qos(8, 2)])
    edge.on_delivery(n1, late)
    assert await sub.received() == []
    assert edge.stale_deliveries == 1
    ok(n2, attach)
    edge.on_delivery(n2, late)  # the new master's is taken
    (publish,) = await sub.received()
    assert publish.packet_id == 8


async def test_publishes_wait_for_a_link_and_are_acknowledged_after_it_returns(
    edge: Edge,
) -> None:
    n1 = edge.router.links["n1"]
    pub = await connected(edge, client_id_in(1, "pub"))
    n1._fail("killed")
    for pid in (1, 2):
        pub.send(Publish("t/x", b"m%d" % pid, qos=1, packet_id=pid))
    assert await pub.received() == []
    assert taken(n1) == []
    up(n1)
    # The publisher's session is re-attached; the publishes, held per target partition (0
    # and 3, both on n1), go in order in each.
    attach, *publishes = taken(n1)
    assert attach.HasField("attach_session")
    assert [(c.publish.targets[0].partition, c.publish.message.payload) for c in publishes] == [
        (0, b"m1"),
        (0, b"m2"),
        (3, b"m1"),
        (3, b"m2"),
    ]
    ok(n1, *publishes[:3])
    assert [(type(p), p.packet_id) for p in await pub.received()] == [(PubAck, 1)]
    ok(n1, publishes[3], attach)
    assert [(type(p), p.packet_id, p.reason_code) for p in await pub.received()] == [
        (PubAck, 2, 0),
    ]


async def test_past_the_bound_5_0_hears_why_3_1_1_is_closed_and_sessions_stay(
    edge: Edge, clock: Clock
) -> None:
    n1 = edge.router.links["n1"]
    pub5 = await connected(edge, client_id_in(1, "pub5"))
    pub4 = await connected(edge, client_id_in(2, "pub4"), version=4)
    n1._fail("killed")
    pub5.send(Publish("t/x", b"held", qos=1, packet_id=7))
    pub5.send(Subscribe(8, (Subscription("t/#", 1), Subscription("u/#", 0))))
    pub4.send(Publish("t/x", b"held", qos=1, packet_id=9))
    late5, late4 = Client(edge), Client(edge, version=4)
    late5.send(Connect("late5", protocol_version=5))
    late4.send(Connect("late4", protocol_version=4))
    clock.now += HOLD - 1
    edge.dispatcher._tick()
    assert await pub5.received() == []
    assert await late5.received() == []
    clock.now += 1
    edge.dispatcher._tick()
    puback, suback = await pub5.received()
    assert isinstance(puback, PubAck)
    assert (puback.packet_id, puback.reason_code) == (7, 0x80)
    why = puback.properties.reason_string
    assert why is not None
    assert why.startswith("partition 0 has no master"), why
    assert isinstance(suback, SubAck)
    assert suback.reason_codes == (0x80, 0x80)
    assert pub4.transport.closed  # 3.1.1 has no failing PUBACK
    (connack5,) = await late5.received()
    (connack4,) = await late4.received()
    assert isinstance(connack5, ConnAck)
    assert connack5.reason_code == 0x88
    assert connack5.properties.reason_string
    assert "no master" in connack5.properties.reason_string
    assert isinstance(connack4, ConnAck)
    assert connack4.reason_code == 3
    # The 5.0 publisher's connection stays (its re-attach waits on), and works once the
    # partition service is back.
    assert not pub5.transport.closed
    up(n1)
    held = taken(n1)
    # pub5's re-attach, and the 3.1.1 publisher's CloseSession (which must not be lost).
    assert sorted(c.WhichOneof("command") for c in held) == ["attach_session", "close_session"]
    ok(n1, *held)
    pub5.send(Publish("t/x", b"after", qos=1, packet_id=10))
    (publish,) = taken(n1)
    ok(n1, publish)
    assert [(type(p), p.reason_code) for p in await pub5.received()] == [(PubAck, 0)]


async def test_a_connect_waits_for_its_sessions_partition(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    n1._fail("killed")
    client = Client(edge)
    client.send(Connect("waiting", protocol_version=5))
    assert await client.received() == []
    assert taken(n1) == []
    up(n1)
    (open_session,) = taken(n1)
    ok(n1, open_session, session_present=False)
    (connack,) = await client.received()
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == 0


@pytest.mark.parametrize("ends", ["refused at the hold", "client gone"])
async def test_an_open_given_up_is_not_sent_to_the_new_master_after_a_heal(
    edge: Edge, ends: str
) -> None:
    """Fault seed 3032: a CONNECT's OpenSession went to a master cut off from its followers,
    which could not answer; after the heal it answered STALE, and the edge sent the open to
    the new master, taking the session from the client's newer connection on another node.
    Given up (refused at the hold, or the client gone), it is never sent again."""
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    client = Client(edge)
    client.send(Connect("cut-off", protocol_version=5))
    p = edge.router.session_partition("cut-off")
    (open_session,) = taken(n1)
    if ends == "client gone":
        client.conn.connection_lost(None)
    else:
        session = client.conn.session
        late = asyncio.get_running_loop().time() + HOLD
        client.conn.carry_out(session.tick(late))
        (connack,) = await client.received()
        assert isinstance(connack, ConnAck)
        assert connack.reason_code == 0x88
        assert client.transport.closed
    assert edge.answers_due == 0  # (a stop does not wait for it)
    edge.apply_view(view(2, {p: ("n2", 2)}))
    ok(n1, open_session, status=SC.STATUS_CODE_STALE_EPOCH)
    edge.dispatcher._tick()
    assert taken(n2) == []
    assert edge.dispatcher.held == 0


async def test_a_qos0_publish_without_a_master_is_dropped_and_counted(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    pub = await connected(edge, client_id_in(1, "q0"))
    n1._fail("killed")
    pub.send(Publish("t/x", b"gone", qos=0))
    up(n1)
    (attach,) = taken(n1)
    ok(n1, attach)
    assert taken(n1) == []
    assert edge.dispatcher.core.dropped_qos0 == 2  # partitions 0 and 3 subscribe to t/#


async def test_a_disconnect_is_sent_again_when_its_link_broke_first(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    client = await connected(edge, client_id_in(4, "leaver"))
    client.send(Disconnect())
    (close,) = taken(n1)
    assert close.close_session.graceful
    assert close.request_id
    n1._fail("killed")
    up(n1)
    (again,) = taken(n1)
    assert again.HasField("close_session")
    assert again.command_id == close.command_id


async def test_a_will_and_its_confirmation_wait_for_their_partitions(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    will_of = client_id_in(6, "dead")
    edge.apply_view(view(2, {6: ("n2", 2)}))  # the will's session lives on n2
    handed_out = pb.PublishWill(
        client_id=will_of, will_id=3, message=cpb.Message(topic="t/w", qos=1, payload=b"bye")
    )
    n2._dispatch(pb.PartitionFrame(events=[pb.PartitionEvent(publish_will=handed_out)]))
    (publish,) = taken(n1)  # its subscribers are in partitions 0 and 3, on n1
    n1._fail("killed")  # before the answer: the publish is held and sent again
    n2._fail("killed")
    up(n1)
    again = taken(n1)  # one part per target partition, with the command's id
    assert [c.command_id for c in again] == [publish.command_id] * 2
    ok(n1, *again)
    assert taken(n2) == []  # WillPublished waits for the session's partition
    up(n2)
    (confirm,) = taken(n2)
    assert confirm.will_published.will_id == 3
    assert (confirm.partition, confirm.partition_epoch) == (6, 2)


async def test_qos2_forgets_go_per_master_and_wait_for_partitions_without_one(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    edge.apply_view(view(2, {5: ("n2", 2)}))
    n2._fail("killed")
    routing = []
    for node, partitions in (("n1", (0, 3)), ("n2", (5,))):
        cmd = pb.EdgeCommand()
        for p in partitions:
            cmd.publish.targets.add(partition=p, epoch=1)
        routing.append((node, cmd))
    edge.qos2_forgets.forget(RoutedOrigin(b"origin", routing))
    edge.qos2_forgets.flush()
    (now,) = taken(n1)  # one command for n1's partitions, at their epochs
    assert [(o.partition, o.epoch, o.origin) for o in now.qos2_forget.origins] == [
        (0, 1, b"origin"),
        (3, 1, b"origin"),
    ]
    assert not now.request_id  # fire and forget
    up(n2)
    (held,) = taken(n2)  # partition 5's, held until its master is back, at its epoch now
    assert [(o.partition, o.epoch) for o in held.qos2_forget.origins] == [(5, 2)]


async def test_a_command_submitted_by_an_answer_does_not_pass_commands_already_released(
    edge: Edge,
) -> None:
    """A CONNECT's wait for its partition ends in the same pump that releases the commands
    held behind it; its OpenSession, submitted from that answer, goes after them."""
    n1 = edge.router.links["n1"]
    n1._fail("killed")

    def on_open(result: pb.Result) -> None:
        edge.dispatcher.request(1, pb.EdgeCommand(open_session=pb.OpenSession()), lambda r: None)

    edge.dispatcher.gate(1, on_open)
    edge.dispatcher.request(1, pb.EdgeCommand(subscribe=pb.Subscribe()), lambda r: None)
    up(n1)
    assert [c.WhichOneof("command") for c in taken(n1)] == ["subscribe", "open_session"]


async def test_a_publish_waits_until_every_partitions_index_has_arrived(clock: Clock) -> None:
    edge = make_edge(clock, view(1, {7: ("n2", 1)}))  # n2 masters partition 7, its link down
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    up(n1)
    assert not edge.router.index_complete
    pub = await connected(edge, client_id_in(1, "early"))
    pub.send(Publish("t/x", b"early", qos=1, packet_id=1))
    assert taken(n1) == []
    assert await pub.received() == []
    up(n2, {7: ["t/#"]})
    assert edge.router.index_complete
    (to_n1,) = taken(n1)
    (to_n2,) = taken(n2)
    assert [t.partition for t in to_n1.publish.targets] == [0, 3]
    assert [t.partition for t in to_n2.publish.targets] == [7]
    ok(n1, to_n1)
    ok(n2, to_n2)
    assert [(type(p), p.packet_id) for p in await pub.received()] == [(PubAck, 1)]
