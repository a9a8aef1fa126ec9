"""Bytes to packets, for MQTT 3.1.1 (protocol level 4) and 5.0 (level 5).

Stateless: :func:`decode` works on one packet; :mod:`hexmq.mqtt.connection` adds framing over a
stream and the rules about which packet may come when. Decoders read ``buf[pos:end]`` in place
(``end`` is the packet's end, not the buffer's), check every rule the specification gives for the
packet's own bytes, and raise only :class:`~hexmq.mqtt.errors.MQTTError` subclasses; the statement
ids in the messages say which rule.

Topic *filters* are checked only for UTF-8 and emptiness here. Their wildcard grammar is
:func:`hexmq.topics.validate_topic_filter`'s, so the edge can refuse one filter with a SUBACK or
UNSUBACK reason code (0x8F, or 0x80 in 3.1.1) rather than lose the whole connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from hexmq.mqtt.errors import (
    MalformedPacket,
    MQTTError,
    ProtocolError,
    TopicNameInvalid,
    UnsupportedProtocolVersion,
)
from hexmq.mqtt.packets import (
    SHARED_PREFIX,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
    _PubResponse,
)
from hexmq.mqtt.properties import (
    NO_PROPERTIES,
    WILL_PROPERTIES,
    Properties,
    decode_properties,
)
from hexmq.mqtt.reason_codes import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES,
    PUBREC_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    SUBACK_RETURN_CODES_V311,
    UNSUBACK_REASON_CODES,
)
from hexmq.mqtt.wire import (
    Buffer,
    PacketType,
    decode_utf8,
    read_binary,
    read_utf8,
    read_vbi,
)

__all__ = [
    "DECODERS",
    "FIXED_HEADER_FLAGS",
    "UNEXPECTED_DECODE_ERRORS",
    "Decoder",
    "decode",
    "decode_body",
    "decode_connect",
    "read_connect_protocol",
]

#: ``decoder(buf, flags, pos, end, protocol_version)`` for the body ``buf[pos:end]``.
Decoder = Callable[[Buffer, int, int, int, int], Packet]

#: The fixed-header flag nibble each type must carry [MQTT-2.1.3-1]; PUBLISH's (None) carry
#: DUP/QoS/RETAIN and are checked by its decoder.
FIXED_HEADER_FLAGS: Final[tuple[int | None, ...]] = (
    0, 0, 0, None, 0, 0, 0b0010, 0, 0b0010, 0, 0b0010, 0, 0, 0, 0, 0,
)  # fmt: skip

_T = PacketType


def _packet_id(buf: Buffer, pos: int, end: int, what: str) -> int:
    if pos + 2 > end:
        raise MalformedPacket(f"{what} is too short for its packet identifier")
    packet_id = (buf[pos] << 8) | buf[pos + 1]
    if not packet_id:
        # [MQTT-2.2.1-3] (5.0), [MQTT-2.3.1-1] (3.1.1): identifiers are non-zero; an ack can only
        # echo one, so 0 is never valid. Parseable but not allowed: a Protocol Error (1.2).
        raise ProtocolError(f"{what} with packet identifier 0 [MQTT-2.2.1-3]")
    return packet_id


def _no_trailing(pos: int, end: int, what: str) -> None:
    if pos != end:
        raise MalformedPacket(f"{end - pos} unexpected bytes at the end of {what}")


def _properties(buf: Buffer, pos: int, end: int, context: int) -> tuple[Properties, int]:
    # Most packets carry none: a Property Length of 0 skips the general reader.
    if pos < end and not buf[pos]:
        return NO_PROPERTIES, pos + 1
    return decode_properties(buf, pos, end, context)


# --- CONNECT / CONNACK ---------------------------------------------------------------------------


def read_connect_protocol(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Read CONNECT's Protocol Name and Level; returns ``(level, pos)`` for "MQTT" level 4 or 5.

    Separate from :func:`decode_connect` so the connection learns the version (and so the CONNACK
    format to refuse a bad CONNECT with) even when the rest of the packet is broken.
    """
    if pos + 2 > end:
        raise MalformedPacket("CONNECT too short for its protocol name")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop >= end:  # the name and the level byte after it
        raise MalformedPacket("CONNECT too short for its protocol name and level")
    raw = bytes(buf[pos + 2 : stop])
    level = buf[stop]
    if raw != b"MQTT":
        # 3.1's "MQIsdp" lands here too; the edge refuses it with CONNACK 0x01 (level 3 < 5).
        name = raw.decode("utf-8", "replace")
        raise UnsupportedProtocolVersion(
            f"unsupported protocol name {name!r} [MQTT-3.1.2-1]",
            protocol_name=name,
            protocol_level=level,
        )
    if level != 4 and level != 5:
        raise UnsupportedProtocolVersion(
            f"unsupported protocol level {level} [MQTT-3.1.2-2]",
            protocol_name="MQTT",
            protocol_level=level,
        )
    return level, stop + 1


def decode_connect(buf: Buffer, flags: int, pos: int, end: int, version: int) -> Connect:
    """CONNECT (3.1); ``version`` is ignored: the packet states its own."""
    version, pos = read_connect_protocol(buf, pos, end)
    if pos + 3 > end:
        raise MalformedPacket("CONNECT too short for its flags and keep alive")
    cflags = buf[pos]
    keepalive = (buf[pos + 1] << 8) | buf[pos + 2]
    pos += 3
    if cflags & 0x01:
        raise MalformedPacket("CONNECT reserved flag is set [MQTT-3.1.2-3]")
    will_flag = cflags & 0x04
    will_qos = (cflags >> 3) & 0x03
    will_retain = cflags & 0x20
    if will_flag:
        if will_qos == 3:
            raise MalformedPacket("Will QoS 3 (3.1.2.6) [MQTT-3.1.2-14 in 3.1.1]")
    elif will_qos or will_retain:
        raise MalformedPacket(
            "Will QoS or Will Retain set without the Will Flag "
            "[MQTT-3.1.2-11, MQTT-3.1.2-13; 3.1.1: MQTT-3.1.2-13, MQTT-3.1.2-15]"
        )
    has_username = cflags & 0x80
    has_password = cflags & 0x40
    if version == 4 and has_password and not has_username:
        raise MalformedPacket("Password Flag set without the User Name Flag [MQTT-3.1.2-22]")
    props = NO_PROPERTIES
    if version == 5:
        props, pos = _properties(buf, pos, end, _T.CONNECT)
    client_id, pos = read_utf8(buf, pos, end)
    will = None
    if will_flag:
        will_props = NO_PROPERTIES
        if version == 5:
            will_props, pos = _properties(buf, pos, end, WILL_PROPERTIES)
        will_topic, pos = read_utf8(buf, pos, end)
        if not will_topic or "+" in will_topic or "#" in will_topic:
            # 5.0 CONNACK 0x90 is "The Will Topic Name is not malformed, but is not accepted".
            raise TopicNameInvalid(
                f"invalid will topic {will_topic!r} [MQTT-4.7.0-1, MQTT-4.7.3-1]"
            )
        will_payload, pos = read_binary(buf, pos, end)
        will = Will(will_topic, will_payload, will_qos, bool(will_retain), will_props)
    username = password = None
    if has_username:
        username, pos = read_utf8(buf, pos, end)
    if has_password:
        password, pos = read_binary(buf, pos, end)
    _no_trailing(pos, end, "CONNECT [MQTT-3.1.2-16, MQTT-3.1.2-18]")
    return Connect(
        client_id, version, bool(cflags & 0x02), keepalive, username, password, will, props
    )


def decode_connack(buf: Buffer, flags: int, pos: int, end: int, version: int) -> ConnAck:
    if end - pos < 2:
        raise MalformedPacket("CONNACK too short")
    ack_flags = buf[pos]
    code = buf[pos + 1]
    if ack_flags & 0xFE:
        raise MalformedPacket("CONNACK reserved acknowledge flags are set [MQTT-3.2.2-1]")
    props = NO_PROPERTIES
    if version == 4:
        _no_trailing(pos + 2, end, "a 3.1.1 CONNACK")
        if code > 5:
            raise ProtocolError(f"CONNACK return code {code} is reserved (3.2.2.3)")
    else:
        if code not in CONNACK_REASON_CODES:
            raise ProtocolError(f"0x{code:02X} is not a CONNACK reason code [MQTT-3.2.2-8]")
        props, p = _properties(buf, pos + 2, end, _T.CONNACK)
        _no_trailing(p, end, "CONNACK")
    if ack_flags and code:
        raise ProtocolError("Session Present with a refusal [MQTT-3.2.2-6; 3.1.1: MQTT-3.2.2-4]")
    return ConnAck(bool(ack_flags), code, props)


# --- PUBLISH and its acknowledgements ------------------------------------------------------------

_Setter = Callable[[object, object], None]


def _slot_setter(cls: type, name: str) -> _Setter:
    setter: _Setter = cls.__dict__[name].__set__  # the slot's member descriptor
    return setter


_new = object.__new__
# Slot descriptors of Publish, set directly by the decoder (see _publish).
_set_topic = _slot_setter(Publish, "topic")
_set_payload = _slot_setter(Publish, "payload")
_set_qos = _slot_setter(Publish, "qos")
_set_retain = _slot_setter(Publish, "retain")
_set_dup = _slot_setter(Publish, "dup")
_set_packet_id = _slot_setter(Publish, "packet_id")
_set_properties = _slot_setter(Publish, "properties")


def _publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    props: Properties,
) -> Publish:
    """Build a Publish the decoder has already validated, without running ``__init__``.

    PUBLISH is the one packet decoded at message rate, and the frozen dataclass's ``__init__``
    plus ``__post_init__`` re-checking what :func:`decode_publish` just checked cost more than the
    rest of the decode. The tests rebuild every decoded Publish through ``__init__`` to prove the
    invariants hold anyway.
    """
    packet: Publish = _new(Publish)
    _set_topic(packet, topic)
    _set_payload(packet, payload)
    _set_qos(packet, qos)
    _set_retain(packet, retain)
    _set_dup(packet, dup)
    _set_packet_id(packet, packet_id)
    _set_properties(packet, props)
    return packet


def decode_publish(buf: Buffer, flags: int, pos: int, end: int, version: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3 [MQTT-3.3.1-4]")
    dup = flags & 0x08
    if dup and not qos:
        raise ProtocolError("DUP set on a QoS 0 PUBLISH [MQTT-3.3.1-2]")
    if pos + 2 > end:
        raise MalformedPacket("PUBLISH too short for its topic")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("PUBLISH topic runs past the end of the packet")
    topic = decode_utf8(buf[pos + 2 : stop])
    pos = stop
    packet_id = None
    if qos:
        packet_id = _packet_id(buf, pos, end, "PUBLISH")
        pos += 2
    props = NO_PROPERTIES
    if version == 5:
        props, pos = _properties(buf, pos, end, _T.PUBLISH)
    if not topic:
        if props.topic_alias is None:
            raise ProtocolError("empty topic and no Topic Alias (3.3.2.1) [MQTT-4.7.3-1]")
    elif "+" in topic or "#" in topic:
        raise TopicNameInvalid(f"wildcard in PUBLISH topic {topic!r} [MQTT-3.3.2-2]")
    return _publish(
        topic, bytes(buf[pos:end]), qos, bool(flags & 0x01), bool(dup), packet_id, props
    )


def _pub_response_decoder(
    cls: type[_PubResponse], codes: frozenset[int], ptype: PacketType
) -> Decoder:
    name = ptype.name

    def decode_pub_response(buf: Buffer, flags: int, pos: int, end: int, version: int) -> Packet:
        packet_id = _packet_id(buf, pos, end, name)
        if end - pos == 2:  # 3.1.1, and 5.0's short form: Success, no properties
            return cls(packet_id)  # type: ignore[return-value]
        if version == 4:
            raise MalformedPacket(f"a 3.1.1 {name} has a Remaining Length of 2")
        code = buf[pos + 2]
        if code not in codes:
            raise ProtocolError(f"0x{code:02X} is not a {name} reason code")
        props = NO_PROPERTIES
        pos += 3
        if pos < end:  # "If the Remaining Length is less than 4 there is no Property Length"
            props, pos = _properties(buf, pos, end, ptype)
            _no_trailing(pos, end, name)
        return cls(packet_id, code, props)  # type: ignore[return-value]

    decode_pub_response.__name__ = f"decode_{name.lower()}"
    return decode_pub_response


# --- SUBSCRIBE / UNSUBSCRIBE and their acknowledgements ------------------------------------------


def decode_subscribe(buf: Buffer, flags: int, pos: int, end: int, version: int) -> Subscribe:
    packet_id = _packet_id(buf, pos, end, "SUBSCRIBE")
    pos += 2
    props = NO_PROPERTIES
    if version == 5:
        props, pos = _properties(buf, pos, end, _T.SUBSCRIBE)
    subscriptions = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        if pos >= end:
            raise MalformedPacket("SUBSCRIBE topic filter without subscription options")
        options = buf[pos]
        pos += 1
        qos = options & 0x03
        no_local = retain_as_published = False
        retain_handling = 0
        if version == 4:
            if options & 0xFC or qos == 3:
                raise MalformedPacket(f"bad requested QoS byte 0x{options:02X} [MQTT-3-8.3-4]")
        else:
            if options & 0xC0:
                raise MalformedPacket("subscription options reserved bits set [MQTT-3.8.3-5]")
            if qos == 3:
                raise ProtocolError("subscription Maximum QoS 3 (3.8.3.1)")
            retain_handling = (options >> 4) & 0x03
            if retain_handling == 3:
                raise ProtocolError("Retain Handling 3 (3.8.3.1)")
            no_local = bool(options & 0x04)
            retain_as_published = bool(options & 0x08)
        if not topic_filter:
            raise ProtocolError("empty topic filter [MQTT-4.7.3-1]")
        if no_local and topic_filter.startswith(SHARED_PREFIX):
            raise ProtocolError("No Local on a shared subscription [MQTT-3.8.3-4]")
        subscriptions.append(
            Subscription(topic_filter, qos, no_local, retain_as_published, retain_handling)
        )
    if not subscriptions:
        raise ProtocolError("SUBSCRIBE without a topic filter [MQTT-3.8.3-2; 3.1.1: MQTT-3.8.3-3]")
    return Subscribe(packet_id, tuple(subscriptions), props)


def decode_unsubscribe(buf: Buffer, flags: int, pos: int, end: int, version: int) -> Unsubscribe:
    packet_id = _packet_id(buf, pos, end, "UNSUBSCRIBE")
    pos += 2
    props = NO_PROPERTIES
    if version == 5:
        props, pos = _properties(buf, pos, end, _T.UNSUBSCRIBE)
    topic_filters = []
    while pos < end:
        topic_filter, pos = read_utf8(buf, pos, end)
        if not topic_filter:
            raise ProtocolError("empty topic filter [MQTT-4.7.3-1]")
        topic_filters.append(topic_filter)
    if not topic_filters:
        raise ProtocolError("UNSUBSCRIBE without a topic filter [MQTT-3.10.3-2]")
    return Unsubscribe(packet_id, tuple(topic_filters), props)


def decode_suback(buf: Buffer, flags: int, pos: int, end: int, version: int) -> SubAck:
    packet_id = _packet_id(buf, pos, end, "SUBACK")
    pos += 2
    props = NO_PROPERTIES
    allowed = SUBACK_RETURN_CODES_V311
    if version == 5:
        props, pos = _properties(buf, pos, end, _T.SUBACK)
        allowed = SUBACK_REASON_CODES
    codes = tuple(buf[pos:end])
    if not codes:
        raise ProtocolError("SUBACK without a reason code [MQTT-3.9.3-2]")
    for code in codes:
        if code not in allowed:
            raise ProtocolError(f"0x{code:02X} is not a SUBACK reason code [MQTT-3.9.3-2]")
    return SubAck(packet_id, codes, props)


def decode_unsuback(buf: Buffer, flags: int, pos: int, end: int, version: int) -> UnsubAck:
    packet_id = _packet_id(buf, pos, end, "UNSUBACK")
    pos += 2
    if version == 4:
        _no_trailing(pos, end, "a 3.1.1 UNSUBACK")
        return UnsubAck(packet_id)
    props, pos = _properties(buf, pos, end, _T.UNSUBACK)
    codes = tuple(buf[pos:end])
    if not codes:
        raise ProtocolError("UNSUBACK without a reason code [MQTT-3.11.3-2]")
    for code in codes:
        if code not in UNSUBACK_REASON_CODES:
            raise ProtocolError(f"0x{code:02X} is not an UNSUBACK reason code [MQTT-3.11.3-2]")
    return UnsubAck(packet_id, codes, props)


# --- PINGREQ, PINGRESP, DISCONNECT, AUTH ---------------------------------------------------------

_PINGREQ: Final = PingReq()
_PINGRESP: Final = PingResp()
_DISCONNECT: Final = Disconnect()
_AUTH: Final = Auth()


def decode_pingreq(buf: Buffer, flags: int, pos: int, end: int, version: int) -> PingReq:
    _no_trailing(pos, end, "PINGREQ")
    return _PINGREQ


def decode_pingresp(buf: Buffer, flags: int, pos: int, end: int, version: int) -> PingResp:
    _no_trailing(pos, end, "PINGRESP")
    return _PINGRESP


def decode_disconnect(buf: Buffer, flags: int, pos: int, end: int, version: int) -> Disconnect:
    if pos == end:  # 3.1.1's only form; 5.0's short form for Normal disconnection
        return _DISCONNECT
    if version == 4:
        raise MalformedPacket("a 3.1.1 DISCONNECT has a Remaining Length of 0")
    code = buf[pos]
    if code not in DISCONNECT_REASON_CODES:
        raise ProtocolError(f"0x{code:02X} is not a DISCONNECT reason code [MQTT-3.14.2-1]")
    props = NO_PROPERTIES
    pos += 1
    if pos < end:  # "If the Remaining Length is less than 2, a value of 0 is used"
        props, pos = _properties(buf, pos, end, _T.DISCONNECT)
        _no_trailing(pos, end, "DISCONNECT")
    return Disconnect(code, props)


def decode_auth(buf: Buffer, flags: int, pos: int, end: int, version: int) -> Auth:
    if pos == end:  # Success without properties (3.15.2.1)
        return _AUTH
    code = buf[pos]
    if code not in AUTH_REASON_CODES:
        raise ProtocolError(f"0x{code:02X} is not an AUTH reason code [MQTT-3.15.2-1]")
    props = NO_PROPERTIES
    pos += 1
    if pos < end:
        props, pos = _properties(buf, pos, end, _T.AUTH)
        _no_trailing(pos, end, "AUTH")
    if props.authentication_method is None:
        raise ProtocolError("AUTH without an Authentication Method (3.15.2.2.2)")
    return Auth(code, props)


#: Indexed by packet type; 0 is reserved (forbidden) in both versions.
DECODERS: Final[tuple[Decoder | None, ...]] = (
    None,
    decode_connect,
    decode_connack,
    decode_publish,
    _pub_response_decoder(PubAck, PUBACK_REASON_CODES, _T.PUBACK),
    _pub_response_decoder(PubRec, PUBREC_REASON_CODES, _T.PUBREC),
    _pub_response_decoder(PubRel, PUBREL_REASON_CODES, _T.PUBREL),
    _pub_response_decoder(PubComp, PUBCOMP_REASON_CODES, _T.PUBCOMP),
    decode_subscribe,
    decode_suback,
    decode_unsubscribe,
    decode_unsuback,
    decode_pingreq,
    decode_pingresp,
    decode_disconnect,
    decode_auth,
)

#: Exceptions a decoder could only raise through a bug (it checks bounds and text itself); the
#: connection still converts them so that the peer-facing contract holds.
UNEXPECTED_DECODE_ERRORS: Final = (IndexError, KeyError, ValueError, OverflowError)


def decode_body(ptype: int, flags: int, buf: Buffer, pos: int, end: int, version: int) -> Packet:
    """Decode the body ``buf[pos:end]`` of a packet whose fixed header was already read."""
    decoder = DECODERS[ptype]
    if decoder is None or (ptype == _T.AUTH and version == 4):
        raise MalformedPacket(f"reserved packet type {ptype}")
    required = FIXED_HEADER_FLAGS[ptype]
    if required is not None and flags != required:
        raise MalformedPacket(
            f"{PacketType(ptype).name} fixed header flags 0b{flags:04b} [MQTT-2.1.3-1]"
        )
    try:
        return decoder(buf, flags, pos, end, version)
    except MQTTError:
        raise
    except UNEXPECTED_DECODE_ERRORS as exc:
        raise MalformedPacket(f"undecodable {PacketType(ptype).name}: {exc!r}") from exc


def decode(data: Buffer, protocol_version: int) -> Packet:
    """Decode exactly one whole packet, fixed header included, in either direction.

    For CONNECT the packet's own protocol level wins over ``protocol_version``.
    """
    end = len(data)
    if end < 2:
        raise MalformedPacket("a packet is at least two bytes")
    length, pos = read_vbi(data, 1, end)
    if pos + length != end:
        raise MalformedPacket(f"Remaining Length {length} but {end - pos} bytes follow")
    return decode_body(data[0] >> 4, data[0] & 0x0F, data, pos, end, protocol_version)
