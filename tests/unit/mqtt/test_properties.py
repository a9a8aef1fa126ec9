"""MQTT 5.0 properties: the table matches the specification, and each rule holds on every packet.

``SPEC`` is section 2.2.2.2, Table 2-4, written out again here (not imported from the code) with
what each property's own section adds: the values it may take.
"""

from __future__ import annotations

import pytest

from hexmq.mqtt import MalformedPacket, MQTTError, PacketType, Properties, ProtocolError
from hexmq.mqtt.properties import (
    NO_PROPERTIES,
    PROPERTY_SPECS,
    WILL_PROPERTIES,
    decode_properties,
    encode_properties,
)

T = PacketType
W = WILL_PROPERTIES
ACKS = {T.PUBACK, T.PUBREC, T.PUBREL, T.PUBCOMP}
CONTEXTS = [*PacketType, W]

# (identifier, name, type, packets, lowest, highest)
SPEC: list[tuple[int, str, str, set[int], int, int]] = [
    (0x01, "payload_format_indicator", "byte", {T.PUBLISH, W}, 0, 1),  # 3.3.2.3.2
    (0x02, "message_expiry_interval", "u32", {T.PUBLISH, W}, 0, 2**32 - 1),
    (0x03, "content_type", "utf8", {T.PUBLISH, W}, 0, 0),
    (0x08, "response_topic", "utf8", {T.PUBLISH, W}, 0, 0),
    (0x09, "correlation_data", "binary", {T.PUBLISH, W}, 0, 0),
    (0x0B, "subscription_identifiers", "vbi", {T.PUBLISH, T.SUBSCRIBE}, 1, 268_435_455),
    (0x11, "session_expiry_interval", "u32", {T.CONNECT, T.CONNACK, T.DISCONNECT}, 0, 2**32 - 1),
    (0x12, "assigned_client_identifier", "utf8", {T.CONNACK}, 0, 0),
    (0x13, "server_keep_alive", "u16", {T.CONNACK}, 0, 65535),
    (0x15, "authentication_method", "utf8", {T.CONNECT, T.CONNACK, T.AUTH}, 0, 0),
    (0x16, "authentication_data", "binary", {T.CONNECT, T.CONNACK, T.AUTH}, 0, 0),
    (0x17, "request_problem_information", "byte", {T.CONNECT}, 0, 1),  # 3.1.2.11.7
    (0x18, "will_delay_interval", "u32", {W}, 0, 2**32 - 1),
    (0x19, "request_response_information", "byte", {T.CONNECT}, 0, 1),  # 3.1.2.11.6
    (0x1A, "response_information", "utf8", {T.CONNACK}, 0, 0),
    (0x1C, "server_reference", "utf8", {T.CONNACK, T.DISCONNECT}, 0, 0),
    (
        0x1F,
        "reason_string",
        "utf8",
        {T.CONNACK, *ACKS, T.SUBACK, T.UNSUBACK, T.DISCONNECT, T.AUTH},
        0,
        0,
    ),
    (0x21, "receive_maximum", "u16", {T.CONNECT, T.CONNACK}, 1, 65535),  # 3.1.2.11.3
    (0x22, "topic_alias_maximum", "u16", {T.CONNECT, T.CONNACK}, 0, 65535),
    (0x23, "topic_alias", "u16", {T.PUBLISH}, 1, 65535),  # [MQTT-3.3.2-8]
    (0x24, "maximum_qos", "byte", {T.CONNACK}, 0, 1),  # 3.2.2.3.4
    (0x25, "retain_available", "byte", {T.CONNACK}, 0, 1),  # 3.2.2.3.5
    (
        0x26,
        "user_properties",
        "pair",
        {T.CONNECT, T.CONNACK, T.PUBLISH, W, *ACKS, T.SUBSCRIBE, T.SUBACK, T.UNSUBSCRIBE}
        | {T.UNSUBACK, T.DISCONNECT, T.AUTH},
        0,
        0,
    ),
    (0x27, "maximum_packet_size", "u32", {T.CONNECT, T.CONNACK}, 1, 2**32 - 1),  # 3.1.2.11.4
    (0x28, "wildcard_subscription_available", "byte", {T.CONNACK}, 0, 1),
    (0x29, "subscription_identifier_available", "byte", {T.CONNACK}, 0, 1),
    (0x2A, "shared_subscription_available", "byte", {T.CONNACK}, 0, 1),
]
SPEC_IDS = {row[0] for row in SPEC}


def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def value_bytes(kind: str, value: int) -> bytes:
    if kind == "byte":
        return bytes((value,))
    if kind == "u16":
        return value.to_bytes(2, "big")
    if kind == "u32":
        return value.to_bytes(4, "big")
    if kind == "vbi":
        return vbi(value)
    if kind in ("utf8", "binary"):
        return b"\x00\x01a"
    return b"\x00\x01a\x00\x01b"  # pair


def block(ident: int, kind: str, value: int) -> bytes:
    return bytes((ident,)) + value_bytes(kind, value)


def props(*blocks: bytes) -> bytes:
    body = b"".join(blocks)
    return vbi(len(body)) + body


def good(low: int) -> int:
    return low if low else 1


def context_blocks(context: int, ident: int) -> list[bytes]:
    # Authentication Data needs an Authentication Method beside it in CONNECT (3.1.2.11.10).
    if context == T.CONNECT and ident == 0x16:
        return [block(0x15, "utf8", 0)]
    return []


def decode(context: int, data: bytes) -> Properties:
    decoded, end = decode_properties(data, 0, len(data), context)
    assert end == len(data)
    return decoded


def test_table_is_the_specification() -> None:
    assert len(SPEC) == 27
    ours = {(s.id, s.attr, frozenset(s.packets)) for s in PROPERTY_SPECS}
    theirs = {(i, name, frozenset(packets)) for i, name, _, packets, _, _ in SPEC}
    assert ours == theirs
    ranges = {s.id: (s.minimum, s.maximum) for s in PROPERTY_SPECS}
    for ident, _, kind, _, low, high in SPEC:
        if kind not in ("utf8", "binary", "pair"):
            assert ranges[ident] == (low, high), hex(ident)
    # Identifier order is the order the encoder writes in.
    assert [s.id for s in PROPERTY_SPECS] == sorted(SPEC_IDS)
    # One Properties attribute per property, all absent by default.
    assert set(Properties.__dataclass_fields__) == {row[1] for row in SPEC}


@pytest.mark.parametrize("context", CONTEXTS, ids=lambda c: getattr(c, "name", "WILL"))
@pytest.mark.parametrize("row", SPEC, ids=lambda r: r[1])
def test_property_on_every_packet_type(
    row: tuple[int, str, str, set[int], int, int], context: int
) -> None:
    ident, name, kind, packets, low, high = row
    extra = context_blocks(context, ident)
    one = props(*extra, block(ident, kind, good(low)))
    if context not in packets:
        with pytest.raises(MalformedPacket, match="not allowed"):  # 2.2.2.2
            decode(context, one)
        return
    decoded = decode(context, one)
    assert getattr(decoded, name) not in (None, ())
    # The decoded value encodes back to the same bytes.
    assert encode_properties(decoded, context) == one

    two = props(*extra, block(ident, kind, good(low)), block(ident, kind, good(low)))
    repeatable = ident == 0x26 or (ident == 0x0B and context == T.PUBLISH)
    if repeatable:
        assert len(getattr(decode(context, two), name)) == 2
    else:
        with pytest.raises(ProtocolError, match="more than once"):
            decode(context, two)

    if kind in ("byte", "u16", "u32", "vbi"):
        for value in (low, high):
            decode(context, props(*extra, block(ident, kind, value)))
        limit = {"byte": 0xFF, "u16": 0xFFFF, "u32": 2**32 - 1, "vbi": 268_435_455}[kind]
        outside = [v for v in (low - 1, high + 1, 0x30) if 0 <= v <= limit and not low <= v <= high]
        for value in outside:
            expected = 0x94 if ident == 0x23 else 0x82  # 3.3.4 names 0x94 for Topic Alias 0
            with pytest.raises(MQTTError) as info:
                decode(context, props(*extra, block(ident, kind, value)))
            assert info.value.reason_code == expected


@pytest.mark.parametrize("context", CONTEXTS, ids=lambda c: getattr(c, "name", "WILL"))
def test_unknown_identifiers_are_malformed(context: int) -> None:
    for ident in range(256):
        if ident in SPEC_IDS:
            continue
        with pytest.raises(MalformedPacket, match="unknown property"):
            decode(context, props(bytes((ident, 0, 0, 0, 0, 0))))


def test_property_overrunning_its_block() -> None:
    # Property Length 3 holding a Four Byte Integer's identifier and two of its bytes.
    data = bytes((3, 0x02, 0, 0, 0, 0))
    with pytest.raises(MalformedPacket):
        decode_properties(data, 0, len(data), T.PUBLISH)
    # A Property Length longer than the packet.
    data = bytes((9, 0x01, 0))
    with pytest.raises(MalformedPacket):
        decode_properties(data, 0, len(data), T.PUBLISH)


@pytest.mark.parametrize(
    "value",
    [b"\x00\x02\xc3\x28", b"\x00\x01\x00", b"\x00\x03\xed\xa0\x80"],
    ids=["ill-formed", "nul", "surrogate"],
)
def test_strings_in_properties_are_checked(value: bytes) -> None:
    for data in (props(b"\x03" + value), props(b"\x26" + value + b"\x00\x01v")):
        with pytest.raises(MalformedPacket):
            decode(T.PUBLISH, data)


def test_authentication_data_needs_a_method_in_connect() -> None:
    data_only = props(block(0x16, "binary", 0))
    with pytest.raises(ProtocolError, match="Authentication Method"):
        decode(T.CONNECT, data_only)
    decode(T.CONNACK, data_only)  # CONNACK may carry either alone


def test_empty_block_is_no_properties() -> None:
    assert decode(T.PUBLISH, b"\x00") is NO_PROPERTIES
    assert encode_properties(NO_PROPERTIES, T.PUBLISH) == b"\x00"


def test_user_properties_keep_order_and_repeated_names() -> None:
    pairs = (("k", "2"), ("a", "1"), ("k", "1"))
    data = encode_properties(Properties(user_properties=pairs), T.PUBLISH)
    assert decode(T.PUBLISH, data).user_properties == pairs  # [MQTT-3.3.2-18]


def test_decoded_properties_equal_built_ones() -> None:
    built = Properties(topic_alias=3, user_properties=(("a", "b"),))
    decoded = decode(T.PUBLISH, encode_properties(built, T.PUBLISH))
    assert decoded == built
    assert hash(decoded) == hash(built)
    assert repr(decoded) == repr(built)
    assert decoded.content_type is None
    assert decoded.subscription_identifiers == ()


def test_encoder_refuses_misplaced_properties() -> None:
    with pytest.raises(ValueError, match="not allowed"):
        encode_properties(Properties(topic_alias=1), T.CONNECT)
    with pytest.raises(ValueError, match="one subscription identifier"):
        encode_properties(Properties(subscription_identifiers=(1, 2)), T.SUBSCRIBE)


def test_instances_hold_only_what_is_set() -> None:
    assert vars(Properties(content_type=None, user_properties=())) == {}
    assert vars(Properties(topic_alias=1)) == {"topic_alias": 1}
    built = Properties(user_properties=[["a", "b"]], subscription_identifiers=[1])
    assert built.user_properties == (("a", "b"),)
    assert built.subscription_identifiers == (1,)
    hash(built)
