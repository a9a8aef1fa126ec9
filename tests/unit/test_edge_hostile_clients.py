"""What the edge's session core refuses or bounds for hostile and careless clients (issue 25),
driven directly (tests/support/edge_harness.py): a will its client may not publish, client ids
bound to user names, the session expiry cap, the cap on deliveries in flight, the partition's
refusals (subscriptions, retained messages) as each protocol version hears them; and a will
checked again, against the ACL as it is then, when an edge publishes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)
from services.edge.access import AccessControl, ClientIdRules
from services.edge.acl import Acl
from services.edge.handoff import will_refusal
from services.edge.session import actions as act
from tests.support.edge_harness import Driver, SessionEdge, commands, of_kind

GRANTED_1 = pb.FILTER_OUTCOME_GRANTED_QOS_1
LIMIT = pb.FILTER_OUTCOME_SUBSCRIPTION_LIMIT

ACL = """\
user eve
topic write eve/#
topic read eve/#
user alice
topic readwrite #
"""


def acl_edge(tmp_path: Path, **overrides: object) -> SessionEdge:
    path = tmp_path / "acl"
    path.write_text(ACL)
    edge = SessionEdge.make(subscriptions={0: ["#"]}, **overrides)
    edge.access = AccessControl(acl=Acl.load(path), acl_path=path)
    return edge


def connect_packets(driver: Driver, packet: Connect) -> tuple[list[act.Action], list[object]]:
    sent = driver.send(packet)
    return sent, list(driver.packets(sent))


@pytest.mark.parametrize("version", [4, 5])
@pytest.mark.parametrize(
    ("user", "topic"),
    [("eve", "alice/cmd"), ("alice", "$SYS/broker/x"), ("eve", "$SYS/broker/x")],
)
def test_a_will_its_client_may_not_publish_refuses_the_connect(
    tmp_path: Path, version: int, user: str, topic: str
) -> None:
    edge = acl_edge(tmp_path)
    client = Driver(edge)
    will = Will(topic, b"x", qos=1, retain=True)
    sent, packets = connect_packets(
        client, Connect("c1", protocol_version=version, username=user, will=will)
    )
    (connack,) = packets
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == (0x87 if version == 5 else 5)
    assert commands(sent) == []  # no session opened
    assert edge.stats.limited["will_acl"] == 1


def test_an_allowed_will_carries_its_owner_to_the_partition(tmp_path: Path) -> None:
    edge = acl_edge(tmp_path)
    sent = Driver(edge).send(
        Connect("c1", protocol_version=5, username="eve", will=Will("eve/status", b"gone"))
    )
    ((_, cmd),) = commands(sent)
    will = cmd.open_session.will
    assert (will.owner_recorded, will.username, will.message.topic) == (
        True,
        "eve",
        "eve/status",
    )


def test_a_will_is_checked_again_against_the_acl_as_it_is_when_published(
    tmp_path: Path,
) -> None:
    edge = acl_edge(tmp_path)
    access = edge.access
    will = pb.PublishWill(
        client_id="c1",
        will_id=1,
        message=cpb.Message(topic="eve/status", payload=b"gone"),
        owner_recorded=True,
        username="eve",
    )
    assert will_refusal(will, access) is None
    # The operator takes eve's write rule away and reloads the ACL (SIGHUP).
    (tmp_path / "acl").write_text("user eve\ntopic read eve/#\n")
    access.reload_acl()
    assert will_refusal(will, access) == "the ACL denies publishing to this topic"
    # An anonymous owner gets the anonymous rules; a will of an earlier release's edge
    # (no owner recorded) only the $SYS/ rule.
    will.ClearField("username")
    assert will_refusal(will, access) is not None
    will.owner_recorded = False
    assert will_refusal(will, access) is None
    will.message.topic = "$SYS/broker/x"
    assert will_refusal(will, access) == "only the broker publishes under $SYS/"


def test_a_reloaded_acl_applies_to_connected_clients_at_their_next_publish(
    tmp_path: Path,
) -> None:
    edge = acl_edge(tmp_path)
    client = Driver(edge)
    client.connect("c1", username="eve")
    sent = client.send(Publish("eve/x", b"1", qos=1, packet_id=1))
    assert of_kind(sent, act.PublishCommand)
    (tmp_path / "acl").write_text("user eve\ntopic read eve/#\n")
    edge.access.reload_acl()
    (puback,) = client.packets(client.send(Publish("eve/x", b"2", qos=1, packet_id=2)))
    assert isinstance(puback, PubAck)
    assert puback.reason_code == 0x87


@pytest.mark.parametrize(
    ("rules", "client_id", "user", "code", "used"),
    [
        # --use-username-as-clientid: eve cannot be alice, whatever she sends.
        (ClientIdRules(use_username=True), "alice", "eve", 0, "eve"),
        (ClientIdRules(use_username=True), "x", None, 0x87, None),
        # --clientid-prefixes %u-: a user's ids start with its name and a dash.
        (ClientIdRules(prefixes=("%u-",)), "eve-1", "eve", 0, "eve-1"),
        (ClientIdRules(prefixes=("%u-",)), "alice-1", "eve", 0x85, None),
        (ClientIdRules(prefixes=("%u-",)), "eve-1", None, 0x85, None),
        # A user name holding the separator could reach into another's ids: not allowed.
        (ClientIdRules(prefixes=("%u-",)), "a-b-1", "a-b", 0x85, None),
        (ClientIdRules(prefixes=("dev-", "%u/")), "dev-9", None, 0, "dev-9"),
    ],
)
def test_client_ids_bound_to_user_names(
    rules: ClientIdRules, client_id: str, user: str | None, code: int, used: str | None
) -> None:
    edge = SessionEdge.make()
    edge.access = AccessControl(client_ids=rules)
    client = Driver(edge)
    sent, packets = connect_packets(client, Connect(client_id, protocol_version=5, username=user))
    if code:
        (connack,) = packets
        assert isinstance(connack, ConnAck)
        assert connack.reason_code == code
        assert edge.stats.limited["client_id"] == 1
        return
    ((_, cmd),) = commands(sent)
    assert cmd.open_session.client_id == used


def test_a_bad_clientid_prefix_is_refused_at_start() -> None:
    for bad in ("%u", "", "%u-%u-"):
        with pytest.raises(ValueError, match="--clientid-prefixes"):
            ClientIdRules(prefixes=(bad,))


def test_an_empty_client_id_with_use_username_is_assigned_the_user_name() -> None:
    edge = SessionEdge.make()
    edge.access = AccessControl(client_ids=ClientIdRules(use_username=True))
    connack = Driver(edge).connect("", username="eve")
    assert connack.properties.assigned_client_identifier == "eve"


def test_the_session_expiry_is_capped_and_5_0_clients_are_told() -> None:
    edge = SessionEdge.make(max_session_expiry=3600)
    client = Driver(edge)
    sent = client.send(
        Connect("c1", protocol_version=5, properties=Properties(session_expiry_interval=90000))
    )
    ((_, cmd),) = commands(sent)
    assert cmd.open_session.session_expiry_s == 3600
    (connack,) = client.packets(client.answer(sent))
    assert isinstance(connack, ConnAck)
    assert connack.properties.session_expiry_interval == 3600  # MQTT 5.0 3.2.2.3.2
    # A DISCONNECT asking for more is capped too.
    sent = client.send(Disconnect(properties=Properties(session_expiry_interval=99999)))
    ((_, close),) = commands(sent)
    assert close.close_session.session_expiry_s == 3600
    assert edge.stats.limited["session_expiry"] == 2


def test_a_3_1_1_persistent_session_expires_after_the_cap() -> None:
    edge = SessionEdge.make()
    sent = Driver(edge).send(Connect("c1", protocol_version=4, clean_start=False))
    ((_, cmd),) = commands(sent)
    assert cmd.open_session.session_expiry_s == edge.config.max_session_expiry == 86400
    within = SessionEdge.make()
    sent = Driver(within).send(
        Connect("c1", protocol_version=5, properties=Properties(session_expiry_interval=60))
    )
    ((_, cmd),) = commands(sent)
    assert cmd.open_session.session_expiry_s == 60
    assert within.stats.limited["session_expiry"] == 0


def test_deliveries_in_flight_are_capped_whatever_the_receive_maximum() -> None:
    edge = SessionEdge.make(max_inflight=100)
    sent = Driver(edge).send(
        Connect("c1", protocol_version=5, properties=Properties(receive_maximum=65535))
    )
    ((_, cmd),) = commands(sent)
    assert cmd.open_session.receive_maximum == 100
    assert edge.stats.limited["inflight"] == 1
    smaller = SessionEdge.make(max_inflight=100)
    sent = Driver(smaller).send(
        Connect("c1", protocol_version=5, properties=Properties(receive_maximum=10))
    )
    ((_, cmd),) = commands(sent)
    assert cmd.open_session.receive_maximum == 10


@pytest.mark.parametrize(("version", "code"), [(5, 0x97), (4, 0x80)])
def test_a_subscription_over_the_partitions_cap_is_refused_alone(version: int, code: int) -> None:
    edge = SessionEdge.make()
    client = Driver(edge)
    client.connect("c1", version=version)
    sent = client.send(Subscribe(1, (Subscription("a", 1), Subscription("b", 1))))
    (suback,) = client.packets(
        client.answer(sent, filter_outcomes=[GRANTED_1, LIMIT], existed=[False, False])
    )
    assert isinstance(suback, SubAck)
    assert list(suback.reason_codes) == [1, code]
    assert edge.stats.rejected["subscribe", 0x97] == 1


@pytest.mark.parametrize(("version", "code"), [(5, 0x97), (4, 0)])
def test_a_retained_publish_over_the_clusters_cap_gets_0x97(version: int, code: int) -> None:
    edge = SessionEdge.make(subscriptions={0: ["r/#"]})
    client = Driver(edge)
    client.connect("c1", version=version)
    sent = client.send(Publish("r/1", b"v", qos=1, packet_id=1, retain=True))
    (publish,) = of_kind(sent, act.PublishCommand)
    why = "not retained: the cluster holds its maximum of 5 retained messages"
    answered = client.session.answered(
        publish.token, pb.Result(retained_refused=True, message=why), None
    )
    (puback,) = client.packets(answered)
    assert isinstance(puback, PubAck)
    assert puback.reason_code == code
    if version == 5:
        assert puback.properties.reason_string == why
