"""The edge's session core at the edges of the specification (issue 29): acknowledgements of
the wrong kind, packets over the client's Maximum Packet Size, UNSUBSCRIBE of an invalid
filter, and the one way every server DISCONNECT ends a connection (Close.linger)."""

from __future__ import annotations

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    PubRec,
    UnsubAck,
    Unsubscribe,
)
from hexmq.mqtt.reason_codes import ReasonCode
from services.edge.session import actions as act
from tests.support.edge_harness import Driver, SessionEdge, commands, of_kind, queued

RC = ReasonCode


def connected(version: int = 5, **fields: object) -> Driver:
    client = Driver(SessionEdge.make())
    assert client.connect("c1", version, **fields).reason_code == 0
    return client


def delivered(client: Driver) -> None:
    """Deliveries in flight: QoS 1 as id 1, QoS 2 awaiting PUBREC as 2, PUBREL sent as 3."""
    sent = client.session.deliver(
        pb.Delivery(
            messages=[
                queued(1, 1),
                queued(2, 2),
                pb.QueuedMessage(message_id=3, qos=2, released=True),
            ]
        ),
        client.wall_ms,
        0,
    )
    assert len(client.packets(sent)) == 3


# ----- acknowledgements of the wrong kind ----------------------------------------------------


@pytest.mark.parametrize(
    "ack",
    [PubRec(1), PubComp(1), PubAck(2), PubComp(2), PubAck(3)],
    ids=["pubrec-qos1", "pubcomp-qos1", "puback-qos2", "pubcomp-before-pubrel", "puback-pubrel"],
)
@pytest.mark.parametrize("version", [5, 4])
def test_an_acknowledgement_of_the_wrong_kind_is_a_protocol_error(
    ack: Packet, version: int
) -> None:
    client = connected(version)
    delivered(client)
    ended = client.send(ack, PingReq())
    # 5.0: DISCONNECT 0x82 and nothing after it (the PINGREQ is not answered); 3.1.1: a close.
    packets = client.packets(ended)
    if version == 5:
        assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, RC.PROTOCOL_ERROR)]
    else:
        assert packets == []
    assert [(k, c.close_session.graceful) for k, c in commands(ended)] == [("close_session", False)]
    (close,) = of_kind(ended, act.Close)
    assert (close.reason_code, close.linger) == (RC.PROTOCOL_ERROR, version == 5)


@pytest.mark.parametrize("ack", [PubAck(9), PubRec(9), PubComp(9), PubRec(3)])
def test_an_acknowledgement_for_nothing_in_flight_or_a_repeated_pubrec_is_ignored(
    ack: Packet,
) -> None:
    # A late duplicate (after a reconnect or a resend), an exchange already finished, or a
    # PUBREC again after our PUBREL: not a violation.
    client = connected()
    delivered(client)
    assert client.packets(client.send(ack, PingReq())) == [PingResp()]
    assert client.session.outbound is not None
    assert client.session.outbound.window.count == 3


# ----- the client's Maximum Packet Size --------------------------------------------------------


def test_a_connack_over_the_clients_maximum_is_not_sent_and_the_connection_closes() -> None:
    client = Driver(SessionEdge.make())
    opened = client.send(
        Connect("c1", protocol_version=5, properties=Properties(maximum_packet_size=2))
    )
    answered = client.answer(opened)
    assert client.packets(answered) == []  # MQTT-3.1.2-24: neither CONNACK nor DISCONNECT
    assert [(k, c.close_session.graceful) for k, c in commands(answered)] == [
        ("close_session", False)
    ]
    (close,) = of_kind(answered, act.Close)
    assert not close.linger


def test_a_disconnect_over_the_clients_maximum_is_not_sent() -> None:
    # CONNACK 5 bytes... 18 with hexmq's properties: a maximum of 18 takes it, and a
    # DISCONNECT 0x82 (3 bytes) too; the Reason String is left out (MQTT-3.14.2-3).
    client = connected(properties=Properties(maximum_packet_size=18))
    ended = client.send(PubComp(77), Connect("again", protocol_version=5))
    (disconnect,) = client.packets(ended)
    assert (disconnect.reason_code, disconnect.properties.reason_string) == (0x82, None)
    # Over 2 bytes there is not even room for a DISCONNECT with a reason: a close, no linger.
    session = connected(properties=Properties(maximum_packet_size=18)).session
    session.client_max_packet = 2
    ended = session.kick(RC.SESSION_TAKEN_OVER)
    assert of_kind(ended, act.Write) == []
    (close,) = of_kind(ended, act.Close)
    assert not close.linger


def test_an_unsuback_over_the_clients_maximum_ends_the_connection_with_0x95() -> None:
    client = connected(properties=Properties(maximum_packet_size=18))
    # UNSUBACK of 16 filters: 2 + 2 + 1 + 16 bytes, over 18; every one invalid, answered here.
    ended = client.send(Unsubscribe(1, tuple(f"#/{i}" for i in range(16))))
    (disconnect,) = client.packets(ended)
    assert disconnect.reason_code == RC.PACKET_TOO_LARGE
    (close,) = of_kind(ended, act.Close)
    assert close.linger


# ----- UNSUBSCRIBE of an invalid filter ------------------------------------------------------


def test_an_invalid_filter_gets_unsuback_0x8f_and_the_valid_ones_go_to_the_partition() -> None:
    client = connected()
    sent = client.send(Unsubscribe(4, ("a/b", "#/test/topic", "$share//x")))
    ((kind, command),) = commands(sent)
    assert kind == "unsubscribe"
    assert list(command.unsubscribe.filters) == ["a/b"]
    answered = client.answer(sent, filter_outcomes=[pb.FILTER_OUTCOME_NOT_SUBSCRIBED])
    assert client.packets(answered) == [
        UnsubAck(4, (RC.NO_SUBSCRIPTION_EXISTED, RC.TOPIC_FILTER_INVALID, RC.TOPIC_FILTER_INVALID))
    ]
    # Only invalid ones: answered at once, nothing for the partition.
    only = client.send(Unsubscribe(5, ("#/test/topic",)))
    assert commands(only) == []
    assert client.packets(only) == [UnsubAck(5, (RC.TOPIC_FILTER_INVALID,))]


def test_a_3_1_1_unsubscribe_of_an_invalid_filter_is_answered_as_before() -> None:
    client = connected(4)
    sent = client.send(Unsubscribe(4, ("#/test/topic",)))
    ((_, command),) = commands(sent)
    assert list(command.unsubscribe.filters) == ["#/test/topic"]
    assert client.packets(client.answer(sent)) == [UnsubAck(4)]


# ----- every server DISCONNECT lingers -------------------------------------------------------


@pytest.mark.parametrize(
    "end",
    ["protocol error", "takeover", "shutdown", "unreachable master"],
)
def test_every_disconnect_with_a_reason_lingers_and_a_3_1_1_close_does_not(end: str) -> None:
    for version in (5, 4):
        session = connected(version).session
        if end == "protocol error":
            actions = session.receive(bytes([0x30, 2, 0, 9]), 100.0, 0)  # malformed PUBLISH
        elif end == "takeover":
            actions = session.kick(RC.SESSION_TAKEN_OVER)
        elif end == "shutdown":
            actions = session.shutdown()
        else:
            actions = session.master_unreachable("no master for 30 s")
        (close,) = of_kind(actions, act.Close)
        assert actions[-1] is close
        assert close.linger is (version == 5), (end, version)
