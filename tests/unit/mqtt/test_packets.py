"""Packet dataclasses are valid by construction, and the encoder refuses what a version lacks."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from hexmq.mqtt import (
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    ConnectReturnCode,
    Disconnect,
    Packet,
    PingReq,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    ReasonCode,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
    decode,
    encode,
)

INVALID: list[tuple[str, Callable[[], object]]] = [
    ("publish-qos-3 [MQTT-3.3.1-4]", lambda: Publish("a", qos=3, packet_id=1)),
    ("publish-qos1-without-id [MQTT-2.2.1-3]", lambda: Publish("a", qos=1)),
    ("publish-qos0-with-id [MQTT-2.2.1-2]", lambda: Publish("a", packet_id=1)),
    ("publish-dup-qos0 [MQTT-3.3.1-2]", lambda: Publish("a", dup=True)),
    ("publish-id-0", lambda: Publish("a", qos=1, packet_id=0)),
    ("publish-id-65536", lambda: Publish("a", qos=1, packet_id=65536)),
    ("publish-wildcard-plus [MQTT-3.3.2-2]", lambda: Publish("a/+")),
    ("publish-wildcard-hash [MQTT-3.3.2-2]", lambda: Publish("#")),
    ("publish-empty-topic-without-alias", lambda: Publish("")),
    ("puback-id-0", lambda: PubAck(0)),
    ("puback-reason-not-for-puback [MQTT-3.4.2-1]", lambda: PubAck(1, 0x92)),
    ("pubrel-reason-not-for-pubrel [MQTT-3.6.2-1]", lambda: PubRel(1, 0x10)),
    ("pubcomp-unknown-reason", lambda: PubComp(1, 0x05)),
    ("pubrec-unknown-reason", lambda: PubRec(1, 0x92)),
    ("subscribe-empty [MQTT-3.8.3-2]", lambda: Subscribe(1, ())),
    (
        "subscribe-two-identifiers",
        lambda: Subscribe(1, (Subscription("a"),), Properties(subscription_identifiers=(1, 2))),
    ),
    ("subscription-empty-filter [MQTT-4.7.3-1]", lambda: Subscription("")),
    ("subscription-qos-3", lambda: Subscription("a", 3)),
    ("subscription-retain-handling-3", lambda: Subscription("a", retain_handling=3)),
    (
        "subscription-no-local-shared [MQTT-3.8.3-4]",
        lambda: Subscription("$share/g/a", no_local=True),
    ),
    ("suback-empty", lambda: SubAck(1, ())),
    ("suback-unknown-code", lambda: SubAck(1, (0x03,))),
    ("unsubscribe-empty [MQTT-3.10.3-2]", lambda: Unsubscribe(1, ())),
    ("unsubscribe-empty-filter", lambda: Unsubscribe(1, ("",))),
    ("unsuback-unknown-code", lambda: UnsubAck(1, (0x10,))),
    ("connack-session-present-refused [MQTT-3.2.2-6]", lambda: ConnAck(True, 0x87)),
    ("connack-unknown-code", lambda: ConnAck(reason_code=0x06)),
    ("connect-level-3", lambda: Connect("c", protocol_version=3)),
    ("connect-keepalive-65536", lambda: Connect("c", keepalive=65536)),
    ("connect-v311-password-only [MQTT-3.1.2-22]", lambda: Connect("c", password=b"p")),
    ("will-qos-3", lambda: Will("t", b"", qos=3)),
    ("will-empty-topic", lambda: Will("", b"")),
    ("will-wildcard-topic", lambda: Will("t/#", b"")),
    ("will-topic-alias", lambda: Will("t", b"", properties=Properties(topic_alias=1))),
    ("disconnect-unknown-code", lambda: Disconnect(0x05)),
    ("auth-unknown-code", lambda: Auth(0x01)),
    ("auth-continue-without-method (3.15.2.2.2)", lambda: Auth(0x18)),
    ("auth-properties-without-method", lambda: Auth(0, Properties(reason_string="r"))),
    ("properties-receive-maximum-0", lambda: Properties(receive_maximum=0)),
    ("properties-topic-alias-0 [MQTT-3.3.2-8]", lambda: Properties(topic_alias=0)),
    ("properties-maximum-qos-2", lambda: Properties(maximum_qos=2)),
    ("properties-maximum-packet-size-0", lambda: Properties(maximum_packet_size=0)),
    ("properties-payload-format-2", lambda: Properties(payload_format_indicator=2)),
    ("properties-expiry-negative", lambda: Properties(message_expiry_interval=-1)),
    ("properties-expiry-2**32", lambda: Properties(session_expiry_interval=2**32)),
    ("properties-subscription-id-0", lambda: Properties(subscription_identifiers=(0,))),
    ("properties-subscription-id-2**28", lambda: Properties(subscription_identifiers=(2**28,))),
    ("properties-response-topic-wildcard", lambda: Properties(response_topic="r/#")),
    ("properties-user-property-not-a-pair", lambda: Properties(user_properties=(("a",),))),
]


@pytest.mark.parametrize("build", [b for _, b in INVALID], ids=[n for n, _ in INVALID])
def test_invalid_packets_cannot_be_built(build: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        build()


def test_valid_edge_cases_can_be_built() -> None:
    Publish("", properties=Properties(topic_alias=1))
    Publish("a", qos=2, packet_id=65535, dup=True)
    Connect("", protocol_version=5, password=b"p")  # 5.0: password without user name
    ConnAck(reason_code=ConnectReturnCode.NOT_AUTHORIZED)
    Auth()
    UnsubAck(1)
    Subscription("$share/g/a", 2, retain_handling=2)


def test_packets_are_frozen_and_hashable() -> None:
    packet = Publish("a", b"x", qos=1, packet_id=1, properties=Properties(topic_alias=3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        packet.topic = "b"
    with pytest.raises(dataclasses.FrozenInstanceError):
        packet.properties.topic_alias = 4
    assert len({packet, dataclasses.replace(packet)}) == 1
    assert not hasattr(packet, "__dict__")  # slots


def test_sequences_are_stored_as_tuples() -> None:
    subscribe = Subscribe(1, [Subscription("a")])
    assert subscribe.subscriptions == (Subscription("a"),)
    assert SubAck(1, [0, 1]).reason_codes == (0, 1)
    assert Unsubscribe(1, ["a"]).topic_filters == ("a",)
    assert UnsubAck(1, [0x11]).reason_codes == (0x11,)


def test_ack_types_are_distinct() -> None:
    assert PubAck(1) != PubRec(1)
    assert {type(p) for p in (PubAck(1), PubRec(1), PubRel(1), PubComp(1))} == {
        PubAck,
        PubRec,
        PubRel,
        PubComp,
    }


def test_properties_repr_shows_only_what_is_set() -> None:
    assert repr(Properties(topic_alias=3)) == "Properties(topic_alias=3)"
    assert repr(NO_PROPERTIES) == "Properties()"


def test_reason_code_aliases() -> None:
    assert ReasonCode.SUCCESS == ReasonCode.NORMAL_DISCONNECTION == ReasonCode.GRANTED_QOS_0 == 0
    assert ReasonCode(0x95) is ReasonCode.PACKET_TOO_LARGE
    assert [int(c) for c in ConnectReturnCode] == [0, 1, 2, 3, 4, 5]


UNENCODABLE: list[tuple[str, Packet, int]] = [
    ("v311-properties", Publish("a", properties=Properties(message_expiry_interval=1)), 4),
    ("v311-auth", Auth(), 4),
    ("v311-puback-reason", PubAck(1, 0x10), 4),
    ("v311-puback-properties", PubAck(1, 0, Properties(reason_string="r")), 4),
    ("v311-suback-5.0-code", SubAck(1, (0x8F,)), 4),
    ("v311-unsuback-codes", UnsubAck(1, (0,)), 4),
    ("v311-disconnect-reason", Disconnect(0x04), 4),
    ("v311-connack-5.0-code", ConnAck(reason_code=0x87), 4),
    ("v311-subscribe-no-local", Subscribe(1, (Subscription("a", no_local=True),)), 4),
    ("v311-subscribe-retain-handling", Subscribe(1, (Subscription("a", retain_handling=1),)), 4),
    (
        "v311-will-properties",
        Connect("c", will=Will("t", b"", properties=Properties(will_delay_interval=1))),
        4,
    ),
    ("v5-connack-3.1.1-code", ConnAck(reason_code=0x05), 5),
    ("v5-unsuback-without-codes [MQTT-3.11.3-2]", UnsubAck(1), 5),
    ("v5-topic-alias-on-puback", PubAck(1, 0, Properties(topic_alias=1)), 5),
    (
        "v5-session-expiry-on-publish",
        Publish("a", properties=Properties(session_expiry_interval=1)),
        5,
    ),
    ("v5-will-delay-on-connect", Connect("c", 5, properties=Properties(will_delay_interval=1)), 5),
    ("unknown-protocol-version", Subscribe(1, (Subscription("a"),)), 6),
    ("connect-version-mismatch", Connect("c", protocol_version=4), 5),
    ("nul-in-string [MQTT-1.5.4-2]", Publish("a\x00b"), 4),
    ("lone-surrogate [MQTT-1.5.4-1]", Publish("a\ud800"), 4),
    ("string-over-65535-bytes", Publish("a" * 65536), 4),
    ("binary-over-65535-bytes", Connect("c", username="u", password=b"p" * 65536), 4),
]


@pytest.mark.parametrize(
    ("packet", "version"),
    [(p, v) for _, p, v in UNENCODABLE],
    ids=[n for n, _, _ in UNENCODABLE],
)
def test_unencodable_packets_raise_value_error(packet: Packet, version: int) -> None:
    with pytest.raises(ValueError):
        encode(packet, version)


def test_encode_refuses_non_packets() -> None:
    with pytest.raises(TypeError):
        encode("PINGREQ", 4)


def test_encode_refuses_a_body_over_the_maximum_remaining_length() -> None:
    # 268,435,456 bytes of body: one more than a Remaining Length can say (1.5.5).
    payload = bytes(268_435_456 - 3)
    with pytest.raises(ValueError, match="Remaining Length"):
        encode(Publish("a", payload), 4)


def test_largest_remaining_length_round_trips() -> None:
    payload = bytes(268_435_455 - 3)
    data = encode(Publish("a", payload), 4)
    assert data[:5] == b"\x30\xff\xff\xff\x7f"
    assert decode(data, 4) == Publish("a", payload)


@pytest.mark.parametrize(
    ("packet", "data"),
    [
        (PubAck(1), b"\x40\x02\x00\x01"),
        (PubAck(1, 0x10), b"\x40\x03\x00\x01\x10"),
        (PubRel(1), b"\x62\x02\x00\x01"),
        (Disconnect(), b"\xe0\x00"),
        (Disconnect(0x8E), b"\xe0\x01\x8e"),
        (Auth(), b"\xf0\x00"),
        (PingReq(), b"\xc0\x00"),
    ],
)
def test_encoder_uses_the_short_forms(packet: Packet, data: bytes) -> None:
    assert encode(packet, 5) == data


def test_properties_equal_to_none_are_not_written() -> None:
    # A Properties() built separately from NO_PROPERTIES is still "no properties".
    assert encode(PubAck(1, 0, Properties()), 5) == b"\x40\x02\x00\x01"
    assert encode(PubAck(1, 0, Properties()), 4) == b"\x40\x02\x00\x01"
