"""Packets to bytes, for MQTT 3.1.1 (protocol level 4) and 5.0 (level 5).

The encoder writes the shortest form the specification allows (5.0's PUBACK family without reason
code or Property Length, DISCONNECT and AUTH with Remaining Length 0), properties in identifier
order, and refuses with ``ValueError`` what the version cannot carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from hexmq.mqtt.packets import (
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
    UnsubAck,
    Unsubscribe,
    _PubResponse,
)
from hexmq.mqtt.properties import WILL_PROPERTIES, Properties, encode_properties
from hexmq.mqtt.reason_codes import CONNACK_REASON_CODES, SUBACK_RETURN_CODES_V311
from hexmq.mqtt.wire import PacketType, encode_binary, encode_utf8, encode_vbi

__all__ = ["encode"]

_T = PacketType


def _frame(first: int, *parts: bytes) -> bytes:
    length = sum(map(len, parts))
    try:
        header = encode_vbi(length)
    except ValueError:
        raise ValueError(
            f"packet body of {length} bytes exceeds the maximum Remaining Length"
        ) from None
    return b"".join((first.to_bytes(1, "big"), header, *parts))


def _has_properties(props: Properties) -> bool:
    # A Properties instance holds only what is set in its __dict__ (Properties.__post_init__).
    return bool(props.__dict__)


def _properties_for(props: Properties, context: int, version: int) -> bytes:
    if version == 5:
        return encode_properties(props, context)
    if _has_properties(props):
        raise ValueError(f"{_T(context).name} properties need MQTT 5.0")
    return b""


def _encode_connect(p: Connect, v: int) -> bytes:
    if p.protocol_version != v:
        raise ValueError(f"a level {p.protocol_version} CONNECT cannot be encoded as level {v}")
    flags = 0x02 if p.clean_start else 0
    payload = [encode_utf8(p.client_id)]
    will = p.will
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
        if v == 5:
            payload.append(encode_properties(will.properties, WILL_PROPERTIES))
        elif _has_properties(will.properties):
            raise ValueError("will properties need MQTT 5.0")
        payload.append(encode_utf8(will.topic))
        payload.append(encode_binary(will.payload))
    if p.username is not None:
        flags |= 0x80
        payload.append(encode_utf8(p.username))
    if p.password is not None:
        flags |= 0x40
        payload.append(encode_binary(p.password))
    header = b"\x00\x04MQTT" + bytes((v, flags)) + p.keepalive.to_bytes(2, "big")
    return _frame(0x10, header, _properties_for(p.properties, _T.CONNECT, v), *payload)


def _encode_connack(p: ConnAck, v: int) -> bytes:
    if v == 4:
        if p.reason_code > 5:
            raise ValueError(f"0x{p.reason_code:02X} is not a 3.1.1 CONNACK return code")
    elif p.reason_code not in CONNACK_REASON_CODES:
        raise ValueError(f"0x{p.reason_code:02X} is not a 5.0 CONNACK reason code")
    head = bytes((1 if p.session_present else 0, p.reason_code))
    return _frame(0x20, head, _properties_for(p.properties, _T.CONNACK, v))


def _encode_publish(p: Publish, v: int) -> bytes:
    first = 0x30 | (p.qos << 1) | (0x08 if p.dup else 0) | (0x01 if p.retain else 0)
    topic = encode_utf8(p.topic)
    packet_id = p.packet_id.to_bytes(2, "big") if p.packet_id is not None else b""
    props = _properties_for(p.properties, _T.PUBLISH, v)
    payload = p.payload
    length = len(topic) + len(packet_id) + len(props) + len(payload)
    if length < 128:  # the common case, without _frame's generality
        return b"".join((bytes((first, length)), topic, packet_id, props, payload))
    return _frame(first, topic, packet_id, props, payload)


def _encode_pub_response(p: _PubResponse, v: int) -> bytes:
    first = p.packet_type << 4 | (2 if p.packet_type == _T.PUBREL else 0)
    packet_id = p.packet_id.to_bytes(2, "big")
    if v == 4:
        if p.reason_code or _has_properties(p.properties):
            raise ValueError(f"a 3.1.1 {p.packet_type.name} carries no reason code or properties")
        return bytes((first, 2)) + packet_id
    if not _has_properties(p.properties):  # the 5.0 short forms (3.4.2.1, 3.4.2.2.1)
        if not p.reason_code:
            return bytes((first, 2)) + packet_id
        return bytes((first, 3)) + packet_id + bytes((p.reason_code,))
    props = encode_properties(p.properties, p.packet_type)
    return _frame(first, packet_id, bytes((p.reason_code,)), props)


def _encode_subscribe(p: Subscribe, v: int) -> bytes:
    parts = [p.packet_id.to_bytes(2, "big"), _properties_for(p.properties, _T.SUBSCRIBE, v)]
    for sub in p.subscriptions:
        options = sub.qos
        if sub.no_local or sub.retain_as_published or sub.retain_handling:
            if v == 4:
                raise ValueError("No Local, Retain As Published and Retain Handling need MQTT 5.0")
            options |= (
                (0x04 if sub.no_local else 0)
                | (0x08 if sub.retain_as_published else 0)
                | (sub.retain_handling << 4)
            )
        parts.append(encode_utf8(sub.topic_filter))
        parts.append(bytes((options,)))
    return _frame(0x82, *parts)


def _encode_suback(p: SubAck, v: int) -> bytes:
    if v == 4:
        bad = [c for c in p.reason_codes if c not in SUBACK_RETURN_CODES_V311]
        if bad:
            raise ValueError(f"3.1.1 SUBACK return codes are 0, 1, 2 and 0x80, not {bad}")
    props = _properties_for(p.properties, _T.SUBACK, v)
    return _frame(0x90, p.packet_id.to_bytes(2, "big"), props, bytes(p.reason_codes))


def _encode_unsubscribe(p: Unsubscribe, v: int) -> bytes:
    parts = [p.packet_id.to_bytes(2, "big"), _properties_for(p.properties, _T.UNSUBSCRIBE, v)]
    parts.extend(encode_utf8(f) for f in p.topic_filters)
    return _frame(0xA2, *parts)


def _encode_unsuback(p: UnsubAck, v: int) -> bytes:
    packet_id = p.packet_id.to_bytes(2, "big")
    if v == 4:
        if p.reason_codes or _has_properties(p.properties):
            raise ValueError("a 3.1.1 UNSUBACK carries no reason codes or properties")
        return b"\xb0\x02" + packet_id
    if not p.reason_codes:
        raise ValueError("a 5.0 UNSUBACK needs one reason code per topic filter [MQTT-3.11.3-2]")
    props = encode_properties(p.properties, _T.UNSUBACK)
    return _frame(0xB0, packet_id, props, bytes(p.reason_codes))


def _encode_pingreq(p: PingReq, v: int) -> bytes:
    return b"\xc0\x00"


def _encode_pingresp(p: PingResp, v: int) -> bytes:
    return b"\xd0\x00"


def _encode_disconnect(p: Disconnect, v: int) -> bytes:
    has_props = _has_properties(p.properties)
    if v == 4:
        if p.reason_code or has_props:
            raise ValueError("a 3.1.1 DISCONNECT carries no reason code or properties")
        return b"\xe0\x00"
    if not has_props:  # short forms (3.14.2.1, 3.14.2.2.1)
        return bytes((0xE0, 1, p.reason_code)) if p.reason_code else b"\xe0\x00"
    return _frame(0xE0, bytes((p.reason_code,)), encode_properties(p.properties, _T.DISCONNECT))


def _encode_auth(p: Auth, v: int) -> bytes:
    if v == 4:
        raise ValueError("AUTH is an MQTT 5.0 packet")
    if not p.reason_code and not _has_properties(p.properties):
        return b"\xf0\x00"
    return _frame(0xF0, bytes((p.reason_code,)), encode_properties(p.properties, _T.AUTH))


_ENCODERS: Final[dict[type, Callable[[Packet, int], bytes]]] = {
    Connect: _encode_connect,  # type: ignore[dict-item]
    ConnAck: _encode_connack,  # type: ignore[dict-item]
    Publish: _encode_publish,  # type: ignore[dict-item]
    PubAck: _encode_pub_response,  # type: ignore[dict-item]
    PubRec: _encode_pub_response,  # type: ignore[dict-item]
    PubRel: _encode_pub_response,  # type: ignore[dict-item]
    PubComp: _encode_pub_response,  # type: ignore[dict-item]
    Subscribe: _encode_subscribe,  # type: ignore[dict-item]
    SubAck: _encode_suback,  # type: ignore[dict-item]
    Unsubscribe: _encode_unsubscribe,  # type: ignore[dict-item]
    UnsubAck: _encode_unsuback,  # type: ignore[dict-item]
    PingReq: _encode_pingreq,  # type: ignore[dict-item]
    PingResp: _encode_pingresp,  # type: ignore[dict-item]
    Disconnect: _encode_disconnect,  # type: ignore[dict-item]
    Auth: _encode_auth,  # type: ignore[dict-item]
}


def encode(packet: Packet, protocol_version: int) -> bytes:
    """The bytes of ``packet`` for protocol level 4 (3.1.1) or 5 (5.0), shortest form first.

    Raises ``ValueError`` for a packet the version cannot carry (properties or a non-zero reason
    code in 3.1.1, AUTH in 3.1.1, strings over 65535 bytes ...): a caller bug, not peer input.
    """
    if protocol_version != 5 and protocol_version != 4:
        raise ValueError(f"protocol_version must be 4 or 5, got {protocol_version}")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise TypeError(f"not an MQTT packet: {packet!r}")
    return encoder(packet, protocol_version)
