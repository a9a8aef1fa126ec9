"""The edge's MQTT session core (services/edge/session/), driven directly: packets in, partition
answers by token, timer ticks at given moments; the exact packets and commands out. What only a
real process reached before (Receive Maximum, QoS 2 claims, Reason String sizing, Keep Alive)
is shown here as plain functions, no event loop (tests/support/edge_harness.py)."""

from __future__ import annotations

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
)
from hexmq.mqtt.reason_codes import ConnectReturnCode, ReasonCode
from services.edge.limits import Admission, TopicLimits
from services.edge.session import Pause
from services.edge.session import actions as act
from services.edge.tickets import Route
from tests.support.edge_harness import (
    HOLD,
    Clock,
    Driver,
    SessionEdge,
    client_id_in,
    commands,
    make_edge,
    of_kind,
    queued,
)

RC = ReasonCode
SC = pb.StatusCode
UNAVAILABLE = SC.STATUS_CODE_UNAVAILABLE
NO_MASTER = "partition 0 has no master within 10s"
ORIGIN = b"o" * 16
# The session of "c1" lives in partition 6 (tests/support/edge_harness.py: 8 partitions).
P = 6


def subscribed_edge(**overrides: object) -> SessionEdge:
    """Subscribers of t/# in partitions 0 (on n1) and 5 (on n2)."""
    return SessionEdge.make({0: ["t/#"], 5: ["t/#"]}, moved={5: ("n2", 1)}, **overrides)


def connected(edge: SessionEdge, version: int = 5, **fields: object) -> Driver:
    client = Driver(edge)
    connack = client.connect("c1", version, **fields)
    assert connack.reason_code == 0
    return client


# ----- CONNECT ------------------------------------------------------------------------------


def test_connect_opens_the_session_and_connack_follows_its_answer() -> None:
    edge = SessionEdge.make()
    client = Driver(edge)
    assert client.started == [act.SetTimer(100.0 + edge.config.connect_timeout)]
    sent = client.send(Connect("c1", protocol_version=5, keepalive=10, clean_start=False))
    assert sent == [
        act.PauseReading(Pause.CONNECT),
        act.Open(
            1,
            P,
            pb.EdgeCommand(
                open_session=pb.OpenSession(
                    client_id="c1",
                    connection_id="n1.1.1",
                    clean_start=False,
                    protocol_version=5,
                    # No Receive Maximum is 65535: --max-inflight-messages caps it (issue 25).
                    receive_maximum=edge.config.max_inflight,
                )
            ),
        ),
        # The CONNACK is due within the failover hold of the CONNECT.
        act.SetTimer(100.0 + HOLD),
    ]
    answered = client.answer(sent, session_present=True)
    assert client.packets(answered) == [
        ConnAck(
            session_present=True,
            reason_code=0,
            properties=Properties(
                receive_maximum=1024,
                topic_alias_maximum=64,
                maximum_packet_size=1024 * 1024,
                shared_subscription_available=True,
            ),
        )
    ]
    # The Keep Alive timer (1.5 x 10 s from the last read), then reading again.
    assert answered[1:] == [act.SetTimer(115.0), act.ResumeReading(Pause.CONNECT)]
    assert edge.stats.connects == 1


def test_a_connect_waits_for_its_partition_and_is_refused_past_the_bound() -> None:
    edge = SessionEdge.make()
    edge.closed.add(P)
    client = Driver(edge)
    sent = client.send(Connect("c1", protocol_version=5))
    assert sent == [act.PauseReading(Pause.CONNECT), act.Gate(1, P)]
    refused = client.answer(sent, status=UNAVAILABLE, message=NO_MASTER)
    (connack,) = client.packets(refused)
    assert (connack.reason_code, connack.properties.reason_string) == (0x88, NO_MASTER)
    # The close lingers, so that the CONNACK reaches a client that sent more after CONNECT.
    assert refused[1:] == [act.Close(0x88, f"CONNECT refused (0x88): {NO_MASTER}", linger=True)]
    # 3.1.1 hears return code 3.
    client = Driver(edge)
    refused = client.answer(client.send(Connect("c2", protocol_version=4)), status=UNAVAILABLE)
    assert client.packets(refused) == [ConnAck(False, ConnectReturnCode.SERVER_UNAVAILABLE)]


def test_a_connect_whose_partition_opens_goes_on_to_open_the_session() -> None:
    edge = SessionEdge.make()
    edge.closed.add(P)
    client = Driver(edge)
    gate = client.send(Connect("c1", protocol_version=5))
    opened = client.answer(gate)
    assert opened[0] == act.ResumeReading(Pause.CONNECT)
    assert [kind for kind, _ in commands(opened)] == ["open_session"]


@pytest.mark.parametrize(
    ("version", "code"), [(5, 0x88), (4, ConnectReturnCode.SERVER_UNAVAILABLE)]
)
def test_a_session_not_opened_within_the_hold_is_refused_and_its_open_taken_back(
    version: int, code: int
) -> None:
    """An OpenSession taken by a master cut off from its followers is never answered until a
    heal deposes that master: the client hears CONNACK 0x88 (3.1.1: 3) at the hold, and the
    OpenSession is taken back, so that a resend after the heal cannot take the session from
    the client's newer connection elsewhere (fault seed 3032)."""
    client = Driver(SessionEdge.make())
    sent = client.send(Connect("c1", protocol_version=version))
    (opening,) = of_kind(sent, act.Open)
    assert of_kind(sent, act.SetTimer) == [act.SetTimer(100.0 + HOLD)]
    # A tick before the deadline (a timer set earlier) waits on.
    assert client.tick(100.0 + HOLD - 1) == [act.SetTimer(100.0 + HOLD)]
    refused = client.tick(100.0 + HOLD)
    (connack,) = client.packets(refused)
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == code
    assert refused[1:] == [
        act.Withdraw(),
        act.Close(
            0x88, f"CONNECT refused (0x88): session not opened within {HOLD:g}s", linger=True
        ),
    ]
    # The deposed master's OK after all (it applied the open): the session is let go.
    late = client.answer(opening)
    assert client.packets(late) == []
    assert [kind for kind, _ in commands(late)] == ["close_session"]


def test_a_client_gone_before_connack_takes_its_open_back_and_one_connected_does_not() -> None:
    edge = SessionEdge.make()
    leaving = Driver(edge)
    leaving.send(Connect("c1", protocol_version=5))
    assert of_kind(leaving.session.lost(), act.Withdraw) == [act.Withdraw()]
    assert of_kind(connected(edge).session.lost(), act.Withdraw) == []


def test_packets_read_while_the_session_opens_follow_its_connack() -> None:
    client = Driver(SessionEdge.make())
    sent = client.send(
        Connect("c1", protocol_version=5), Subscribe(1, (Subscription("a/b", 1),)), PingReq()
    )
    assert [kind for kind, _ in commands(sent)] == ["open_session"]
    after = client.answer(sent)
    assert [type(p) for p in client.packets(after)] == [ConnAck, PingResp]
    assert [kind for kind, _ in commands(after)] == ["subscribe"]


def test_an_edge_over_its_connection_limit_refuses_with_quota_exceeded() -> None:
    client = Driver(SessionEdge.make(), admission=Admission.REFUSE)
    (connack,) = client.packets(client.send(Connect("c1", protocol_version=5)))
    assert connack.reason_code == RC.QUOTA_EXCEEDED


def test_an_empty_client_id_is_assigned_one_by_the_edge() -> None:
    client = Driver(SessionEdge.make())
    sent = client.send(Connect("", protocol_version=5))
    ((_, open_cmd),) = commands(sent)
    assert open_cmd.open_session.client_id == "assigned-1"
    (connack,) = client.packets(client.answer(sent))
    assert connack.properties.assigned_client_identifier == "assigned-1"


# ----- PUBLISH QoS 0 and 1 -------------------------------------------------------------------


def test_qos1_is_acknowledged_once_every_target_node_stored_it() -> None:
    client = connected(subscribed_edge())
    sent = client.send(Publish("t/x", b"m", qos=1, packet_id=7))
    publishes = of_kind(sent, act.PublishCommand)
    assert [(p.node, [t.partition for t in p.command.publish.targets]) for p in publishes] == [
        ("n1", [0]),
        ("n2", [5]),
    ]
    message = publishes[0].command.publish.message
    assert (message.topic, message.payload, message.qos, message.publisher_id) == (
        "t/x",
        b"m",
        1,
        "c1",
    )
    assert message.published_at_ms == client.wall_ms
    assert client.answer(publishes[0]) == []
    assert client.packets(client.answer(publishes[1])) == [PubAck(7)]


def test_qos0_goes_to_every_target_node_unanswered() -> None:
    client = connected(subscribed_edge())
    sent = client.send(Publish("t/x", b"m", qos=0))
    assert [(p.token, p.node) for p in of_kind(sent, act.PublishCommand)] == [(0, "n1"), (0, "n2")]
    assert client.packets(sent) == []


def test_nothing_matching_is_answered_at_once_with_no_matching_subscribers() -> None:
    client = connected(subscribed_edge())
    assert client.packets(client.send(Publish("u/x", b"m", qos=1, packet_id=1))) == [
        PubAck(1, RC.NO_MATCHING_SUBSCRIBERS)
    ]


def test_a_refused_qos1_is_never_acknowledged_5_0_hears_why_3_1_1_is_closed() -> None:
    client = connected(subscribed_edge())
    n1, n2 = of_kind(client.send(Publish("t/x", b"m", qos=1, packet_id=7)), act.PublishCommand)
    client.answer(n1)
    refused = client.answer(n2, status=UNAVAILABLE, message=NO_MASTER)
    assert client.packets(refused) == [
        PubAck(7, RC.UNSPECIFIED_ERROR, Properties(reason_string=NO_MASTER))
    ]
    assert client.edge.stats.refused_publishes == 1

    old = connected(subscribed_edge(), version=4)
    n1, n2 = of_kind(old.send(Publish("t/x", b"m", qos=1, packet_id=7)), act.PublishCommand)
    old.answer(n1, status=UNAVAILABLE, message=NO_MASTER)
    refused = old.answer(n2)
    assert old.packets(refused) == []
    kinds = [(k, c.close_session.graceful) for k, c in commands(refused)]
    assert kinds == [("close_session", False)]
    assert isinstance(refused[-1], act.Close)


def test_a_publish_waits_for_the_subscription_index() -> None:
    edge = subscribed_edge()
    edge.router.index.indexed.discard(5)  # partition 5's index has never arrived
    client = connected(edge)
    sent = client.send(Publish("t/x", b"m", qos=1, packet_id=3))
    assert sent == [act.AwaitIndex(2)]
    edge.router.index.indexed.add(5)
    assert len(of_kind(client.answer(sent), act.PublishCommand)) == 2


def test_publishing_under_sys_is_refused() -> None:
    client = connected(subscribed_edge())
    (ack,) = client.packets(client.send(Publish("$SYS/x", b"m", qos=1, packet_id=2)))
    assert (ack.packet_id, ack.reason_code) == (2, RC.NOT_AUTHORIZED)


# ----- Receive Maximum (the inbound window) ---------------------------------------------------


def test_a_5_0_client_over_our_receive_maximum_is_disconnected_with_0x93() -> None:
    client = connected(subscribed_edge(receive_maximum=2))
    client.send(Publish("t/x", b"1", qos=1, packet_id=1))
    full = client.send(Publish("t/x", b"2", qos=1, packet_id=2))
    assert act.PauseReading(Pause.INFLIGHT) in full  # (a 5.0 client must stop by itself)
    over = client.send(Publish("t/x", b"3", qos=1, packet_id=3))
    assert [(k, c.close_session.graceful) for k, c in commands(over)] == [("close_session", False)]
    (disconnect,) = client.packets(over)
    assert disconnect.reason_code == RC.RECEIVE_MAXIMUM_EXCEEDED
    assert disconnect.properties.reason_string == "more than 2 unacknowledged QoS 1/2 publishes"
    assert over[-1] == act.Close(
        RC.RECEIVE_MAXIMUM_EXCEEDED, disconnect.properties.reason_string, linger=True
    )


def test_a_qos2_publish_counts_against_receive_maximum_until_pubcomp() -> None:
    client = connected(subscribed_edge(receive_maximum=2))
    for pid in (1, 2):
        claim = client.send(Publish("t/x", b"q2", qos=2, packet_id=pid))
        client.answer(claim, qos2_state=pb.QOS2_STATE_DUPLICATE)  # PUBREC at once
    # Two PUBREC'd, awaiting PUBREL: a third publish is one too many.
    over = client.send(Publish("t/x", b"q1", qos=1, packet_id=3))
    assert client.packets(over)[-1].reason_code == RC.RECEIVE_MAXIMUM_EXCEEDED
    # With one released (PUBREL, PUBCOMP), there is room again.
    client = connected(subscribed_edge(receive_maximum=2))
    for pid in (1, 2):
        client.answer(
            client.send(Publish("t/x", b"q2", qos=2, packet_id=pid)),
            qos2_state=pb.QOS2_STATE_DUPLICATE,
        )
    release = client.send(PubRel(1))
    assert client.packets(client.answer(release, qos2_state=pb.QOS2_STATE_RELEASED)) == [PubComp(1)]
    room = client.send(Publish("t/x", b"q1", qos=1, packet_id=3))
    assert len(of_kind(room, act.PublishCommand)) == 2


def test_a_3_1_1_client_at_the_window_is_not_read_until_half_of_it_is_stored() -> None:
    client = connected(subscribed_edge(receive_maximum=4), version=4)
    sent = [client.send(Publish("t/x", b"m", qos=1, packet_id=pid)) for pid in (1, 2, 3, 4)]
    assert act.PauseReading(Pause.INFLIGHT) in sent[3]
    answers = [client.answer(a) for s in sent[:2] for a in of_kind(s, act.PublishCommand)]
    assert act.ResumeReading(Pause.INFLIGHT) in answers[-1]  # 2 left: half the window
    assert not any(act.ResumeReading(Pause.INFLIGHT) in a for a in answers[:-1])


def test_payload_bytes_being_stored_pause_reading_too() -> None:
    client = connected(subscribed_edge(max_packet_size=16 << 20))
    big = b"x" * (9 * 1024 * 1024)
    first = client.send(Publish("t/x", big, qos=1, packet_id=1))
    assert act.PauseReading(Pause.INFLIGHT) not in first
    second = client.send(Publish("t/x", big, qos=1, packet_id=2))
    assert act.PauseReading(Pause.INFLIGHT) in second  # 18 MiB being stored: over 16 MiB
    stored = [client.answer(a) for a in of_kind(second, act.PublishCommand)]
    assert not any(act.ResumeReading(Pause.INFLIGHT) in a for a in stored)  # 9 MiB still
    stored = [client.answer(a) for a in of_kind(first, act.PublishCommand)]
    assert act.ResumeReading(Pause.INFLIGHT) in stored[-1]


# ----- QoS 2: claims ------------------------------------------------------------------------


def test_qos2_is_claimed_routed_recorded_then_pubrec_and_released_by_pubrel() -> None:
    client = connected(subscribed_edge())
    claim = client.send(Publish("t/x", b"m", qos=2, packet_id=9))
    ((kind, receive),) = commands(claim)
    assert (kind, receive.qos2_receive.packet_id) == ("qos2_receive", 9)
    assert of_kind(claim, act.Request)[0].partition == P
    routing = client.answer(claim, qos2_state=pb.QOS2_STATE_NEW, qos2_origin=ORIGIN)
    publishes = of_kind(routing, act.PublishCommand)
    assert [p.command.publish.qos2_origin for p in publishes] == [ORIGIN, ORIGIN]
    client.answer(publishes[0])
    record = client.answer(publishes[1])
    assert [(k, c.qos2_routed.ok, c.qos2_routed.keep_claim) for k, c in commands(record)] == [
        ("qos2_routed", True, False)
    ]
    recorded = client.answer(record)
    (forget,) = of_kind(recorded, act.ForgetOrigins)
    assert forget.routed.origin == ORIGIN
    assert client.packets(recorded) == [PubRec(9)]
    # A resend of the same PUBLISH now: PUBREC again, nothing routed (MQTT-4.3.3-9).
    again = client.send(Publish("t/x", b"m", qos=2, packet_id=9, dup=True))
    assert (client.packets(again), commands(again)) == ([PubRec(9)], [])
    release = client.send(PubRel(9))
    assert [k for k, _ in commands(release)] == ["qos2_release"]
    assert client.packets(client.answer(release, qos2_state=pb.QOS2_STATE_RELEASED)) == [PubComp(9)]
    unknown = client.send(PubRel(10))
    assert client.packets(client.answer(unknown, qos2_state=pb.QOS2_STATE_NOT_FOUND)) == [
        PubComp(10, RC.PACKET_IDENTIFIER_NOT_FOUND)
    ]


def test_a_resend_while_its_claim_is_routed_is_ignored() -> None:
    client = connected(subscribed_edge())
    claim = client.send(Publish("t/x", b"m", qos=2, packet_id=9))
    assert client.send(Publish("t/x", b"m", qos=2, packet_id=9, dup=True)) == []
    client.answer(claim, qos2_state=pb.QOS2_STATE_IN_PROGRESS)  # another attempt PUBRECs
    assert client.session.inbound is not None
    assert client.session.inbound.count == 0


def test_a_failed_qos2_routing_drops_its_claim_before_a_5_0_pubrec_0x80() -> None:
    client = connected(subscribed_edge())
    routing = client.answer(
        client.send(Publish("t/x", b"m", qos=2, packet_id=4)),
        qos2_state=pb.QOS2_STATE_NEW,
        qos2_origin=ORIGIN,
    )
    n1, n2 = of_kind(routing, act.PublishCommand)
    client.answer(n1)
    record = client.answer(n2, status=UNAVAILABLE, message=NO_MASTER)
    assert [(c.qos2_routed.ok, c.qos2_routed.keep_claim) for _, c in commands(record)] == [
        (False, False)
    ]
    dropped = client.answer(record)
    assert of_kind(dropped, act.ForgetOrigins)  # the targets that stored it forget it
    assert client.packets(dropped) == [
        PubRec(4, RC.UNSPECIFIED_ERROR, Properties(reason_string=NO_MASTER))
    ]


def test_a_3_1_1_failed_qos2_routing_keeps_its_claim_and_closes() -> None:
    client = connected(subscribed_edge(), version=4)
    routing = client.answer(
        client.send(Publish("t/x", b"m", qos=2, packet_id=4)),
        qos2_state=pb.QOS2_STATE_NEW,
        qos2_origin=ORIGIN,
    )
    n1, n2 = of_kind(routing, act.PublishCommand)
    client.answer(n1, status=UNAVAILABLE, message=NO_MASTER)
    record = client.answer(n2)
    assert [c.qos2_routed.keep_claim for _, c in commands(record)] == [True]
    closed = client.answer(record)
    assert not of_kind(closed, act.ForgetOrigins)  # the resend takes the claim over
    assert isinstance(closed[-1], act.Close)


def test_a_routing_that_could_not_be_recorded_is_recorded_again_after_a_reattach() -> None:
    edge = subscribed_edge()
    client = connected(edge)
    routing = client.answer(
        client.send(Publish("t/x", b"m", qos=2, packet_id=4)),
        qos2_state=pb.QOS2_STATE_NEW,
        qos2_origin=ORIGIN,
    )
    for publish in of_kind(routing, act.PublishCommand):
        record = client.answer(publish)
    assert client.answer(record, status=UNAVAILABLE, message=NO_MASTER) == []  # no PUBREC
    edge.routes[P] = Route("n2", 2, 1)  # the session's partition moved
    moved, attach = client.session.reattach()
    assert moved
    again = client.answer(attach)
    assert [(k, c.qos2_routed.packet_id) for k, c in commands(again)] == [("qos2_routed", 4)]
    assert client.packets(client.answer(again)) == [PubRec(4)]


# ----- Reason Strings -------------------------------------------------------------------------


def test_reason_strings_are_left_out_when_the_client_asks_for_none() -> None:
    client = connected(subscribed_edge(), properties=Properties(request_problem_information=False))
    n1, n2 = of_kind(client.send(Publish("t/x", b"m", qos=1, packet_id=7)), act.PublishCommand)
    client.answer(n1)
    refused = client.answer(n2, status=UNAVAILABLE, message=NO_MASTER)
    assert client.packets(refused) == [PubAck(7, RC.UNSPECIFIED_ERROR)]
    # A DISCONNECT still says why (MQTT-3.1.2-29 covers acknowledgements only).
    bad_alias = Publish("t/x", b"m", qos=0, properties=Properties(topic_alias=99))
    (disconnect,) = client.packets(client.send(bad_alias))
    assert disconnect.properties.reason_string


def test_a_reason_string_that_would_exceed_the_clients_maximum_packet_size_is_left_out() -> None:
    for size, expect_reason in ((len(NO_MASTER) + 10, True), (len(NO_MASTER) + 6, False)):
        client = connected(subscribed_edge(), properties=Properties(maximum_packet_size=size))
        n1, n2 = of_kind(client.send(Publish("t/x", b"m", qos=1, packet_id=7)), act.PublishCommand)
        client.answer(n1)
        (puback,) = client.packets(client.answer(n2, status=UNAVAILABLE, message=NO_MASTER))
        assert (puback.properties.reason_string is not None) is expect_reason, size


# ----- the timer: Keep Alive and the CONNECT timeout -------------------------------------------


def test_keep_alive_ends_a_quiet_connection_after_one_and_a_half_intervals() -> None:
    client = connected(SessionEdge.make(), keepalive=2)
    # Due at 103.0; a PINGREQ at 102 moves it: the tick at 103 asks again for 105.
    client.now = 102.0
    assert client.packets(client.send(PingReq())) == [PingResp()]
    assert client.tick(103.0) == [act.SetTimer(105.0)]
    ended = client.tick(105.0)
    (disconnect,) = client.packets(ended)
    assert disconnect.reason_code == RC.KEEP_ALIVE_TIMEOUT
    assert [(k, c.close_session.graceful) for k, c in commands(ended)] == [("close_session", False)]
    assert isinstance(ended[-1], act.Close)


def test_a_keep_alive_over_the_maximum_is_lowered_for_5_0_and_refused_for_3_1_1() -> None:
    connack = Driver(SessionEdge.make(max_keepalive=30)).connect("c1", 5, keepalive=0)
    assert connack.properties.server_keep_alive == 30
    client = Driver(SessionEdge.make(max_keepalive=30))
    refused = client.send(Connect("c1", protocol_version=4, keepalive=60))
    assert client.packets(refused) == [ConnAck(False, ConnectReturnCode.IDENTIFIER_REJECTED)]


def test_no_connect_within_the_timeout_closes_the_socket() -> None:
    client = Driver(SessionEdge.make())
    assert client.tick(110.0) == [act.Close(0, "no CONNECT within 10s")]


# ----- deliveries and the outbound window ----------------------------------------------------


def test_deliveries_are_tracked_until_acknowledged_and_the_acks_go_back_in_one_command() -> None:
    client = connected(SessionEdge.make())
    sent = client.session.deliver(
        pb.Delivery(
            messages=[
                queued(1, 1),
                queued(2, 2),
                pb.QueuedMessage(message_id=3, qos=2, released=True),
                queued(4, 0),
            ]
        ),
        client.wall_ms,
        0,
    )
    assert [(type(p), getattr(p, "packet_id", None)) for p in client.packets(sent)] == [
        (Publish, 1),
        (Publish, 2),
        (PubRel, 3),
        (Publish, None),
    ]
    out = client.session.outbound
    assert out is not None
    assert out.window.count == 3
    assert (out.in_flight_ids(), out.released_ids()) == ([1, 2], [3])
    acked = client.send(PubAck(1), PubRec(2), PubComp(3), PubAck(2))  # the last one is stray
    ((kind, ack),) = commands(acked)
    assert kind == "delivery_ack"
    assert (list(ack.delivery_ack.message_ids), list(ack.delivery_ack.received_ids)) == (
        [1, 3],
        [2],
    )
    assert out.window.count == 0
    (acknowledge,) = of_kind(acked, act.Acknowledge)
    assert list(out.unconfirmed) == [acknowledge.token]
    assert client.answer(acknowledge) == []
    assert not out.unconfirmed


def test_a_qos1_ack_with_room_in_the_window_is_lazy_and_one_that_frees_it_is_not() -> None:
    """A DeliveryAck nothing waits on may wait for company on the link (hexmq/pacing.py): a QoS
    1 acknowledgement while the master, which counts it in flight until it arrives, has at
    least half the window free, and no earlier one of the session is unanswered. One the
    master may be blocked on, or a PUBREC whose PUBREL the client waits for, goes at once.
    (Without the unanswered rule, a subscriber acknowledging one message at a time stacked up
    lazy acknowledgements until the master's window was full: one-node QoS 1 fan-in at
    saturation fell from 14,336 to 11,744 deliveries a second.)"""
    client = connected(SessionEdge.make(), properties=Properties(receive_maximum=4))
    client.session.deliver(
        pb.Delivery(messages=[queued(i, 1) for i in range(1, 5)]), client.wall_ms, 0
    )
    out = client.session.outbound
    assert out is not None
    assert out.window.count == 4
    # The window is full: acknowledging one frees what the master holds back.
    (first,) = of_kind(client.send(PubAck(1)), act.Acknowledge)
    assert not first.lazy
    client.answer(first)
    # 2 in flight and 1 acknowledged: the master counts 3 of 4 until it hears.
    (second,) = of_kind(client.send(PubAck(2)), act.Acknowledge)
    assert not second.lazy
    # 1 in flight and 1 acknowledged: half the window is free at the master, but the last
    # acknowledgement is not answered yet.
    (third,) = of_kind(client.send(PubAck(3)), act.Acknowledge)
    assert not third.lazy
    client.answer(second)
    client.answer(third)
    (fourth,) = of_kind(client.send(PubAck(4)), act.Acknowledge)
    assert fourth.lazy
    client.answer(fourth)
    sent = client.session.deliver(pb.Delivery(messages=[queued(5, 2)]), client.wall_ms, 0)
    (publish,) = client.packets(sent)
    (rec,) = of_kind(client.send(PubRec(publish.packet_id)), act.Acknowledge)
    assert list(rec.command.delivery_ack.received_ids) == [5]
    assert not rec.lazy


def test_what_the_client_may_not_have_is_acknowledged_unsent() -> None:
    edge = SessionEdge.make()
    client = connected(edge, properties=Properties(maximum_packet_size=64))
    sent = client.session.deliver(
        pb.Delivery(messages=[queued(1, 1, payload=b"x" * 100), queued(2, 0)]), client.wall_ms, 0
    )
    assert [type(p) for p in client.packets(sent)] == [Publish]  # the QoS 0 one fits
    ((_, ack),) = commands(sent)
    assert list(ack.delivery_ack.message_ids) == [1]
    assert edge.stats.dropped_too_large == 1
    # QoS 0 is dropped for a client whose socket is backed up.
    sent = client.session.deliver(pb.Delivery(messages=[queued(3, 0)]), client.wall_ms, 5 << 20)
    assert client.packets(sent) == []
    assert edge.stats.dropped_qos0 == 1


def test_outgoing_topic_aliases_are_given_in_send_order() -> None:
    client = connected(SessionEdge.make(), properties=Properties(topic_alias_maximum=2))
    topics = ["a/1", "a/2", "a/1", "a/3"]
    sent = client.session.deliver(
        pb.Delivery(messages=[queued(i + 1, 0, topic=t) for i, t in enumerate(topics)]),
        client.wall_ms,
        0,
    )
    # (The client's codec resolves nothing: what is on the wire.)
    assert [(p.topic, p.properties.topic_alias) for p in client.packets(sent)] == [
        ("a/1", 1),
        ("a/2", 2),
        ("", 1),
        ("a/3", 2),  # all taken: the least recently used alias is remapped
    ]


# ----- takeover, reconnect, re-attach ---------------------------------------------------------


def test_a_kick_is_confirmed_to_the_master_that_sent_it_once_the_connection_is_closed() -> None:
    # G5: the master holds the new connection's CONNACK until it hears this (kick-acks).
    edge = SessionEdge.make()
    first = connected(edge, clean_start=False)
    kicked = first.session.kick(RC.SESSION_TAKEN_OVER, "n3")
    confirm = act.ConfirmKick(
        "n3",
        pb.EdgeCommand(kicked=pb.Kicked(client_id="c1", connection_id=first.session.connection_id)),
    )
    assert kicked[-2:] == [act.Close(RC.SESSION_TAKEN_OVER, "", linger=True), confirm]
    # Closed already: nothing to close, but it is not live, which is what the master asks.
    assert first.session.kick(RC.SESSION_TAKEN_OVER, "n3") == [confirm]


def test_a_kick_is_confirmed_only_to_a_master_that_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    # A master of an earlier release never asks (Kick.confirm) and would not know the command;
    # one of this release asks, and hears it even for a connection gone already.
    edge = make_edge(Clock())
    link = edge.router.links["n2"]
    sent: list[pb.EdgeCommand] = []

    def send(cmd: pb.EdgeCommand, *, urgent: bool = False) -> bool:
        sent.append(cmd)
        return True

    monkeypatch.setattr(link, "send", send)
    kick = pb.Kick(client_id="c1", connection_id="n1.1.77", reason=pb.KICK_REASON_TAKEN_OVER)
    edge.on_kick(link, kick)
    assert sent == []
    kick.confirm = True
    edge.on_kick(link, kick)
    assert sent == [pb.EdgeCommand(kicked=pb.Kicked(client_id="c1", connection_id="n1.1.77"))]


def test_a_takeover_kicks_with_0x8e_and_the_next_connection_resumes_the_session() -> None:
    edge = SessionEdge.make()
    first = connected(edge, clean_start=False)
    kicked = first.session.kick(RC.SESSION_TAKEN_OVER)
    (disconnect,) = first.packets(kicked)
    assert disconnect.reason_code == RC.SESSION_TAKEN_OVER
    assert commands(kicked) == []  # the session is the new connection's now
    assert kicked[-1] == act.Close(RC.SESSION_TAKEN_OVER, "", linger=True)
    assert first.session.kick(RC.SESSION_TAKEN_OVER) == []  # once

    second = Driver(edge)
    opened = second.send(Connect("c1", protocol_version=5, clean_start=False))
    (connack,) = second.packets(second.answer(opened, session_present=True))
    assert connack.session_present
    resent = second.session.deliver(
        pb.Delivery(
            messages=[
                pb.QueuedMessage(message_id=5, qos=1, dup=True, message=queued(5, 1).message),
                pb.QueuedMessage(message_id=6, qos=2, released=True),
            ]
        ),
        second.wall_ms,
        0,
    )
    publish, pubrel = second.packets(resent)
    assert (type(publish), publish.packet_id, publish.dup) == (Publish, 5, True)
    assert (type(pubrel), pubrel.packet_id) == (PubRel, 6)


def test_a_reattach_carries_what_is_in_flight_and_holds_acks_until_answered() -> None:
    edge = SessionEdge.make()
    client = connected(edge)
    client.session.deliver(pb.Delivery(messages=[queued(1, 1), queued(2, 2)]), client.wall_ms, 0)
    (unconfirmed,) = of_kind(client.send(PubAck(1)), act.Acknowledge)
    edge.routes[P] = Route("n2", 2, 1)
    moved, sent = client.session.reattach()
    assert moved
    (attach,) = of_kind(sent, act.Attach)
    state = attach.command.attach_session
    assert (list(state.inflight_ids), list(state.acked_ids)) == ([2], [1])
    assert client.session.reattach() == (False, [])  # one at a time
    # Acknowledged meanwhile: it waits for the re-attach's answer.
    assert commands(client.send(PubRec(2))) == []
    answered = client.answer(attach, route=Route("n2", 2, 1))
    ((_, ack),) = commands(answered)
    assert list(ack.delivery_ack.received_ids) == [2]
    assert client.session.attached == Route("n2", 2, 1)
    assert unconfirmed.token not in client.session.outbound.unconfirmed  # carried, confirmed


def test_a_reattach_answered_taken_over_closes_with_0x8e() -> None:
    edge = SessionEdge.make()
    client = connected(edge)
    edge.routes[P] = Route("n2", 2, 1)
    _, sent = client.session.reattach()
    closed = client.answer(sent, status=SC.STATUS_CODE_TAKEN_OVER)
    assert [p.reason_code for p in client.packets(closed)] == [RC.SESSION_TAKEN_OVER]
    assert isinstance(closed[-1], act.Close)


# ----- bad input and DISCONNECT ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("alias", "topic", "reason"),
    [(65, "t/x", RC.TOPIC_ALIAS_INVALID), (3, "", RC.PROTOCOL_ERROR)],
)
def test_bad_inbound_topic_aliases_end_the_connection(alias: int, topic: str, reason: int) -> None:
    client = connected(subscribed_edge())
    bad = Publish(topic, b"m", qos=0, properties=Properties(topic_alias=alias))
    ended = client.send(bad)
    assert [p.reason_code for p in client.packets(ended)] == [reason]
    assert isinstance(ended[-1], act.Close)


def test_a_disconnect_with_will_closes_the_session_gracefully_sending_the_will() -> None:
    client = connected(SessionEdge.make(), properties=Properties(session_expiry_interval=60))
    sent = client.send(
        Disconnect(RC.DISCONNECT_WITH_WILL_MESSAGE, Properties(session_expiry_interval=30))
    )
    ((_, close),) = commands(sent)
    assert (close.close_session.graceful, close.close_session.send_will) == (True, True)
    assert close.close_session.session_expiry_s == 30


def test_a_disconnect_setting_an_expiry_on_a_session_connected_with_0_is_a_protocol_error() -> None:
    client = connected(SessionEdge.make())
    ended = client.send(Disconnect(0, Properties(session_expiry_interval=30)))
    assert [p.reason_code for p in client.packets(ended)] == [RC.PROTOCOL_ERROR]
    ((_, close),) = commands(ended)
    assert not close.close_session.graceful


def test_a_subscribe_is_refused_for_filters_the_partition_never_sees() -> None:
    client = connected(SessionEdge.make(topic_limits=TopicLimits(max_levels=2)))
    sent = client.send(Subscribe(1, (Subscription("a/b/c", 1),)))
    assert client.packets(sent) == [SubAck(1, (RC.TOPIC_FILTER_INVALID,))]
    assert commands(sent) == []


def test_the_session_of_a_client_lives_in_its_partition() -> None:
    cid = client_id_in(2, "x")
    client = Driver(SessionEdge.make())
    (request,) = of_kind(client.send(Connect(cid, protocol_version=5)), act.Open)
    assert request.partition == 2


def test_a_connect_of_an_unknown_protocol_level_is_refused_in_a_form_the_client_reads() -> None:
    # CONNECT, protocol name "MQTT", level 3 (older than 3.1.1) / 6 (newer than 5.0): 3.1.1's
    # CONNACK return code 1 for the first, 5.0's 0x84 for the second.
    v311_refusal = ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
    for level, connack in (
        (3, bytes([0x20, 2, 0, v311_refusal])),
        (6, bytes([0x20, 3, 0, RC.UNSUPPORTED_PROTOCOL_VERSION, 0])),
    ):
        client = Driver(SessionEdge.make())
        refused = client.send_bytes(bytes([0x10, 10, 0, 4, *b"MQTT", level, 2, 0, 60]))
        assert refused[0] == act.Write(connack)
        assert isinstance(refused[1], act.Close)


def test_a_malformed_packet_after_connect_ends_only_that_connection_with_its_reason() -> None:
    client = connected(subscribed_edge())
    ended = client.send_bytes(bytes([0x30, 2, 0, 9]))  # a topic length past the packet's end
    (disconnect,) = client.packets(ended)
    assert disconnect.reason_code == RC.MALFORMED_PACKET
    assert [(k, c.close_session.graceful) for k, c in commands(ended)] == [("close_session", False)]
    assert client.edge.stats.rejected["disconnect", RC.MALFORMED_PACKET] == 1


def test_with_keep_alive_0_a_stale_tick_ends_nothing() -> None:
    client = connected(SessionEdge.make(), keepalive=0)
    assert client.tick(10_000.0) == []
