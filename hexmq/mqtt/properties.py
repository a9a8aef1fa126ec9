"""MQTT 5.0 properties (section 2.2.2): the table, the value type and its wire form.

``PROPERTY_SPECS`` is Table 2-4 written out: identifier, field name, data type and the packets
that may carry each property. The decoder refuses a property on a packet the table does not list
as a Malformed Packet (2.2.2.2), a second copy of a property that may appear once as a Protocol
Error, and a value the property's own section forbids (e.g. Receive Maximum 0) as a Protocol Error,
except a Topic Alias of 0, for which 3.3.4 names 0x94 (Topic Alias invalid).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

from hexmq.mqtt.errors import MalformedPacket, ProtocolError, TopicAliasInvalid
from hexmq.mqtt.wire import (
    VBI_MAX,
    Buffer,
    PacketType,
    decode_utf8,
    encode_binary,
    encode_utf8,
    encode_vbi,
    read_vbi,
)

__all__ = [
    "NO_PROPERTIES",
    "PROPERTY_SPECS",
    "WILL_PROPERTIES",
    "Properties",
    "PropertyId",
    "PropertySpec",
    "PropertyType",
    "decode_properties",
    "encode_properties",
]

#: Pseudo packet type for the Will Properties inside CONNECT's payload (3.1.3.2).
WILL_PROPERTIES: Final = 16


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


class PropertyType(IntEnum):
    """The data types of 1.5; BOOL is a Byte that may only be 0 or 1."""

    BYTE = 1
    BOOL = 2
    U16 = 3
    U32 = 4
    VBI = 5
    UTF8 = 6
    BINARY = 7
    UTF8_PAIR = 8


@dataclass(frozen=True, slots=True)
class PropertySpec:
    id: PropertyId
    #: The attribute of :class:`Properties` holding it (plural for the two that repeat).
    attr: str
    type: PropertyType
    packets: frozenset[int]
    #: Inclusive range for integer properties; a value outside it is refused.
    minimum: int = 0
    maximum: int = 0


_T = PacketType
_W = WILL_PROPERTIES
_P = PropertyId
_Y = PropertyType


def _spec(
    pid: PropertyId, ptype: PropertyType, packets: set[int], lo: int = 0, hi: int = 0
) -> PropertySpec:
    if not hi:
        hi = _TYPE_MAXIMUM.get(ptype, 0)
    attr = _PLURAL.get(pid, pid.name.lower())
    return PropertySpec(pid, attr, ptype, frozenset(packets), lo, hi)


_TYPE_MAXIMUM: Final = {
    PropertyType.BYTE: 0xFF,
    PropertyType.BOOL: 1,
    PropertyType.U16: 0xFFFF,
    PropertyType.U32: 0xFFFF_FFFF,
    PropertyType.VBI: VBI_MAX,
}
_PLURAL: Final = {
    PropertyId.SUBSCRIPTION_IDENTIFIER: "subscription_identifiers",
    PropertyId.USER_PROPERTY: "user_properties",
}
_ACKS = {_T.PUBACK, _T.PUBREC, _T.PUBREL, _T.PUBCOMP}

#: Table 2-4, in identifier order (also the order the encoder writes them in).
PROPERTY_SPECS: Final[tuple[PropertySpec, ...]] = (
    # 3.3.2.3.2 lists only 0 and 1; anything else is data the protocol does not allow.
    _spec(_P.PAYLOAD_FORMAT_INDICATOR, _Y.BYTE, {_T.PUBLISH, _W}, 0, 1),
    _spec(_P.MESSAGE_EXPIRY_INTERVAL, _Y.U32, {_T.PUBLISH, _W}),
    _spec(_P.CONTENT_TYPE, _Y.UTF8, {_T.PUBLISH, _W}),
    _spec(_P.RESPONSE_TOPIC, _Y.UTF8, {_T.PUBLISH, _W}),
    _spec(_P.CORRELATION_DATA, _Y.BINARY, {_T.PUBLISH, _W}),
    # 3.3.2.3.8 / 3.8.2.1.2: 1 to 268,435,455; 0 is a Protocol Error.
    _spec(_P.SUBSCRIPTION_IDENTIFIER, _Y.VBI, {_T.PUBLISH, _T.SUBSCRIBE}, 1),
    _spec(_P.SESSION_EXPIRY_INTERVAL, _Y.U32, {_T.CONNECT, _T.CONNACK, _T.DISCONNECT}),
    _spec(_P.ASSIGNED_CLIENT_IDENTIFIER, _Y.UTF8, {_T.CONNACK}),
    _spec(_P.SERVER_KEEP_ALIVE, _Y.U16, {_T.CONNACK}),
    _spec(_P.AUTHENTICATION_METHOD, _Y.UTF8, {_T.CONNECT, _T.CONNACK, _T.AUTH}),
    _spec(_P.AUTHENTICATION_DATA, _Y.BINARY, {_T.CONNECT, _T.CONNACK, _T.AUTH}),
    _spec(_P.REQUEST_PROBLEM_INFORMATION, _Y.BOOL, {_T.CONNECT}),
    _spec(_P.WILL_DELAY_INTERVAL, _Y.U32, {_W}),
    _spec(_P.REQUEST_RESPONSE_INFORMATION, _Y.BOOL, {_T.CONNECT}),
    _spec(_P.RESPONSE_INFORMATION, _Y.UTF8, {_T.CONNACK}),
    _spec(_P.SERVER_REFERENCE, _Y.UTF8, {_T.CONNACK, _T.DISCONNECT}),
    _spec(
        _P.REASON_STRING,
        _Y.UTF8,
        {_T.CONNACK, *_ACKS, _T.SUBACK, _T.UNSUBACK, _T.DISCONNECT, _T.AUTH},
    ),
    # 3.1.2.11.3 / 3.2.2.3.3: "It is a Protocol Error ... for it to have the value 0".
    _spec(_P.RECEIVE_MAXIMUM, _Y.U16, {_T.CONNECT, _T.CONNACK}, 1),
    _spec(_P.TOPIC_ALIAS_MAXIMUM, _Y.U16, {_T.CONNECT, _T.CONNACK}),
    # [MQTT-3.3.2-8]: a Topic Alias of 0 is not permitted (0x94, see decode).
    _spec(_P.TOPIC_ALIAS, _Y.U16, {_T.PUBLISH}, 1),
    # 3.2.2.3.4: "a value other than 0 or 1" is a Protocol Error.
    _spec(_P.MAXIMUM_QOS, _Y.BYTE, {_T.CONNACK}, 0, 1),
    _spec(_P.RETAIN_AVAILABLE, _Y.BOOL, {_T.CONNACK}),
    _spec(
        _P.USER_PROPERTY,
        _Y.UTF8_PAIR,
        {
            _T.CONNECT,
            _T.CONNACK,
            _T.PUBLISH,
            _W,
            *_ACKS,
            _T.SUBSCRIBE,
            _T.SUBACK,
            _T.UNSUBSCRIBE,
            _T.UNSUBACK,
            _T.DISCONNECT,
            _T.AUTH,
        },
    ),
    # 3.1.2.11.4 / 3.2.2.3.9: zero is a Protocol Error.
    _spec(_P.MAXIMUM_PACKET_SIZE, _Y.U32, {_T.CONNECT, _T.CONNACK}, 1),
    _spec(_P.WILDCARD_SUBSCRIPTION_AVAILABLE, _Y.BOOL, {_T.CONNACK}),
    _spec(_P.SUBSCRIPTION_IDENTIFIER_AVAILABLE, _Y.BOOL, {_T.CONNACK}),
    _spec(_P.SHARED_SUBSCRIPTION_AVAILABLE, _Y.BOOL, {_T.CONNACK}),
)

del _T, _W, _P, _Y

# The decoder's view of the table, indexed by identifier byte: (attr, type, bit mask of the
# packet types allowed, minimum, maximum). Plain tuples and ints keep the per-property loop cheap.
_DecodeEntry = tuple[str, int, int, int, int]
_DECODE_TABLE: Final[tuple[_DecodeEntry | None, ...]] = tuple(
    next(
        (
            (s.attr, int(s.type), sum(1 << p for p in s.packets), s.minimum, s.maximum)
            for s in PROPERTY_SPECS
            if s.id == ident
        ),
        None,
    )
    for ident in range(256)
)
_INT_TYPES: Final = frozenset(
    {PropertyType.BYTE, PropertyType.BOOL, PropertyType.U16, PropertyType.U32}
)
# (attr, minimum, maximum) for every scalar integer property, checked when a Properties is built.
_INT_RANGES: Final = tuple(
    (s.attr, s.minimum, s.maximum) for s in PROPERTY_SPECS if s.type in _INT_TYPES
)
_ATTRS: Final = tuple(s.attr for s in PROPERTY_SPECS)


@dataclass(frozen=True, repr=False)
class Properties:
    """The MQTT 5.0 properties of one packet (or of a Will); ``None``/``()`` means absent.

    Attribute names are the spec's property names in snake_case, except the two that may repeat:
    ``subscription_identifiers`` (several only in a server-to-client PUBLISH, 3.3.4) and
    ``user_properties`` (ordered name/value pairs; names may repeat, order is kept [MQTT-3.3.2-18]).

    Unlike the packets this class has no ``__slots__``: its defaults then live on the class, so
    the decoder builds an instance holding only the properties present (see
    :func:`decode_properties`) instead of paying for 27 slot writes per packet.
    """

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: bool | None = None
    will_delay_interval: int | None = None
    request_response_information: bool | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: bool | None = None
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: bool | None = None
    subscription_identifier_available: bool | None = None
    shared_subscription_available: bool | None = None

    def __repr__(self) -> str:
        # Only the properties that are present: 27 fields of None hide the one that matters.
        shown = (
            f"{name}={value!r}"
            for name in _ATTRS
            if (value := getattr(self, name)) is not None and value != ()
        )
        return f"Properties({', '.join(shown)})"

    def __post_init__(self) -> None:
        for name, lo, hi in _INT_RANGES:
            value = getattr(self, name)
            if value is not None and not lo <= value <= hi:
                raise ValueError(f"{name} must be in {lo}..{hi}, got {value}")
        for sid in self.subscription_identifiers:
            if not 1 <= sid <= VBI_MAX:
                raise ValueError(f"subscription identifiers must be in 1..{VBI_MAX}, got {sid}")
        for pair in self.user_properties:
            if len(pair) != 2:
                raise ValueError(f"a user property is a (name, value) pair, got {pair!r}")
        response_topic = self.response_topic
        if response_topic is not None and ("+" in response_topic or "#" in response_topic):
            raise ValueError("the Response Topic must not contain wildcards [MQTT-3.3.2-14]")
        # Keep only the properties present in the instance dict; the class holds the defaults.
        # Built and decoded instances then look alike, stay small, and encode by walking what
        # is present rather than all 27 attributes.
        present = self.__dict__
        for name in [n for n, v in present.items() if v is None or v == () or v == []]:
            del present[name]
        # Lists are accepted for the repeatable ones, stored as tuples to stay hashable.
        if "user_properties" in present:
            present["user_properties"] = tuple(tuple(pair) for pair in present["user_properties"])
        if "subscription_identifiers" in present:
            present["subscription_identifiers"] = tuple(present["subscription_identifiers"])


NO_PROPERTIES: Final = Properties()

_new = object.__new__
_UTF8: Final = int(PropertyType.UTF8)
_BINARY: Final = int(PropertyType.BINARY)
_UTF8_PAIR: Final = int(PropertyType.UTF8_PAIR)
_VBI: Final = int(PropertyType.VBI)
_BOOL: Final = int(PropertyType.BOOL)
_INT_SIZE: Final = {
    int(PropertyType.BYTE): 1,
    int(PropertyType.BOOL): 1,
    int(PropertyType.U16): 2,
    int(PropertyType.U32): 4,
}


def _context_name(context: int) -> str:
    return "Will Properties" if context == WILL_PROPERTIES else PacketType(context).name


def decode_properties(buf: Buffer, pos: int, end: int, context: int) -> tuple[Properties, int]:
    """Read a Property Length and the properties after it; ``context`` is the packet type.

    The result holds only the properties present (see ``Properties.__post_init__``).
    """
    length, pos = read_vbi(buf, pos, end)
    if not length:
        return NO_PROPERTIES, pos
    stop = pos + length
    if stop > end:
        raise MalformedPacket("Property Length runs past the end of the packet")
    bit = 1 << context
    found: dict[str, Any] = {}
    while pos < stop:
        # Identifiers are Variable Byte Integers, but every defined one fits in a byte; a byte
        # >= 0x80 could only start an undefined one.
        entry = _DECODE_TABLE[buf[pos]]
        if entry is None:
            raise MalformedPacket(f"unknown property identifier 0x{buf[pos]:02X} (2.2.2.2)")
        attr, ptype, allowed, lo, hi = entry
        if not allowed & bit:
            raise MalformedPacket(
                f"{attr} (0x{buf[pos]:02X}) is not allowed in {_context_name(context)} (2.2.2.2)"
            )
        pos += 1
        value: Any
        if ptype >= _UTF8:  # UTF8, BINARY, UTF8_PAIR: length-prefixed
            if pos + 2 > stop:
                raise MalformedPacket(f"{attr} runs past the Property Length")
            n = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
            if n > stop:
                raise MalformedPacket(f"{attr} runs past the Property Length")
            if ptype == _BINARY:
                value = bytes(buf[pos + 2 : n])
                pos = n
            else:
                value = decode_utf8(buf[pos + 2 : n])
                pos = n
                if ptype == _UTF8_PAIR:
                    if pos + 2 > stop:
                        raise MalformedPacket("user property runs past the Property Length")
                    n = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
                    if n > stop:
                        raise MalformedPacket("user property runs past the Property Length")
                    value = (value, decode_utf8(buf[pos + 2 : n]))
                    pos = n
                    users = found.get(attr)
                    if users is None:
                        found[attr] = [value]
                    else:
                        users.append(value)
                    continue
        else:
            if ptype == _VBI:
                value, pos = read_vbi(buf, pos, stop)
            else:
                size = _INT_SIZE[ptype]
                if pos + size > stop:
                    raise MalformedPacket(f"{attr} runs past the Property Length")
                value = buf[pos] if size == 1 else int.from_bytes(buf[pos : pos + size], "big")
                pos += size
            if not lo <= value <= hi:
                if attr == "topic_alias":
                    raise TopicAliasInvalid("Topic Alias 0 is not permitted [MQTT-3.3.2-8]")
                raise ProtocolError(f"{attr} has a value the protocol forbids: {value}")
            if ptype == _BOOL:
                value = value == 1
            elif ptype == _VBI:
                ids = found.get(attr)
                if ids is None:
                    found[attr] = [value]
                elif context == PacketType.PUBLISH:
                    # A server sends one per matching subscription in a single PUBLISH (3.3.4).
                    ids.append(value)
                else:
                    raise ProtocolError("subscription_identifier appears more than once")
                continue
        if attr in found:
            raise ProtocolError(f"{attr} appears more than once")
        found[attr] = value
    # Every read above is bounded by `stop`, so here pos == stop.
    users = found.get("user_properties")
    if users is not None:
        found["user_properties"] = tuple(users)
    ids = found.get("subscription_identifiers")
    if ids is not None:
        found["subscription_identifiers"] = tuple(ids)
    if (
        context == PacketType.CONNECT
        and "authentication_data" in found
        and "authentication_method" not in found
    ):
        raise ProtocolError("Authentication Data without an Authentication Method (3.1.2.11.10)")
    response_topic = found.get("response_topic")
    if response_topic is not None and ("+" in response_topic or "#" in response_topic):
        raise ProtocolError("Response Topic contains a wildcard [MQTT-3.3.2-14]")
    # Everything __post_init__ checks has been checked; absent properties fall back to the
    # class-level defaults.
    props: Properties = _new(Properties)
    props.__dict__.update(found)
    return props, pos


def encode_properties(props: Properties, context: int) -> bytes:
    """The Property Length and properties; ``ValueError`` if a property is not allowed here."""
    present = props.__dict__  # only the properties that are set (see Properties.__post_init__)
    if not present:
        return b"\x00"
    out = bytearray()
    for attr in sorted(present, key=_ENCODE_ORDER.__getitem__):
        spec = _SPEC_BY_ATTR[attr]
        value = present[attr]
        if context not in spec.packets:
            raise ValueError(f"{spec.attr} is not allowed in {_context_name(context)}")
        ident = _IDENT_BYTES[spec.id]
        ptype = spec.type
        if ptype is PropertyType.UTF8:
            out += ident + encode_utf8(value)
        elif ptype is PropertyType.BINARY:
            out += ident + encode_binary(value)
        elif ptype is PropertyType.UTF8_PAIR:
            for name, val in value:
                out += ident + encode_utf8(name) + encode_utf8(val)
        elif ptype is PropertyType.VBI:
            if context != PacketType.PUBLISH and len(value) > 1:
                raise ValueError(
                    f"only one subscription identifier is allowed in {_context_name(context)}"
                )
            for sid in value:
                out += ident + encode_vbi(sid)
        elif ptype is PropertyType.BOOL:
            out += ident + (b"\x01" if value else b"\x00")
        else:
            out += ident + int(value).to_bytes(_INT_SIZE[ptype], "big")
    return encode_vbi(len(out)) + out


_SPEC_BY_ATTR: Final = {s.attr: s for s in PROPERTY_SPECS}
_ENCODE_ORDER: Final = {s.attr: i for i, s in enumerate(PROPERTY_SPECS)}  # identifier order
_IDENT_BYTES: Final = {s.id: bytes((s.id,)) for s in PROPERTY_SPECS}
