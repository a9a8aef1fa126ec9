"""Wire primitives shared by every packet: packet types, Variable Byte Integers, strings, binary.

Readers take ``(buf, pos, end)`` and return ``(value, new_pos)``. ``end`` is the end of the
packet (or of the property block) being read, not of ``buf``: the connection decodes straight out
of its receive buffer, where the bytes after ``end`` belong to the next packet, so running past
``end`` must be caught here rather than by an ``IndexError``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

from hexmq.mqtt.errors import MalformedPacket

__all__ = [
    "VBI_MAX",
    "Buffer",
    "PacketType",
    "decode_utf8",
    "encode_binary",
    "encode_utf8",
    "encode_vbi",
    "read_binary",
    "read_u16",
    "read_u32",
    "read_utf8",
    "read_vbi",
]

Buffer = bytes | bytearray

#: The largest value a Variable Byte Integer can carry: four bytes of seven bits (1.5.5).
VBI_MAX: Final = 268_435_455


class PacketType(IntEnum):
    """The control packet type, the high nibble of the first byte (2.1.2)."""

    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # 5.0 only; reserved (forbidden) in 3.1.1


# The one-byte encodings are by far the most common (every packet under 128 bytes), so they are
# precomputed rather than built per call.
_SMALL_VBI: Final = tuple(bytes((n,)) for n in range(128))


def encode_vbi(n: int) -> bytes:
    """Encode ``n`` in the minimum number of bytes [MQTT-1.5.5-1]."""
    if n < 128:
        if n < 0:
            raise ValueError(f"a Variable Byte Integer cannot be negative: {n}")
        return _SMALL_VBI[n]
    if n > VBI_MAX:
        raise ValueError(f"{n} does not fit in a Variable Byte Integer (max {VBI_MAX})")
    out = bytearray()
    while True:
        digit = n & 0x7F
        n >>= 7
        if n:
            out.append(digit | 0x80)
        else:
            out.append(digit)
            return bytes(out)


def read_vbi(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Read a Variable Byte Integer; more than four bytes or a non-minimal form is malformed."""
    value = 0
    shift = 0
    for i in range(4):
        if pos >= end:
            raise MalformedPacket("Variable Byte Integer runs past the end of the packet")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            # A last byte of 0 after a continuation byte means a shorter encoding existed.
            if byte == 0 and i:
                raise MalformedPacket(
                    "Variable Byte Integer is not minimally encoded [MQTT-1.5.5-1]"
                )
            return value, pos
        shift += 7
    raise MalformedPacket("Variable Byte Integer longer than four bytes")


def read_u16(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise MalformedPacket("Two Byte Integer runs past the end of the packet")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def read_u32(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise MalformedPacket("Four Byte Integer runs past the end of the packet")
    return int.from_bytes(buf[pos : pos + 4], "big"), pos + 4


def decode_utf8(raw: Buffer) -> str:
    """Decode an MQTT UTF-8 string body: well-formed, no surrogates, no U+0000 (1.5.4).

    Python's strict UTF-8 codec already rejects encoded surrogates (U+D800..U+DFFF), overlong
    forms and code points above U+10FFFF [MQTT-1.5.4-1]; U+0000 is checked here [MQTT-1.5.4-2].
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPacket(f"ill-formed UTF-8 string [MQTT-1.5.4-1]: {exc.reason}") from None
    if "\x00" in text:
        raise MalformedPacket("UTF-8 string contains U+0000 [MQTT-1.5.4-2]")
    return text


def read_utf8(buf: Buffer, pos: int, end: int) -> tuple[str, int]:
    if pos + 2 > end:
        raise MalformedPacket("string length runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("string runs past the end of the packet")
    return decode_utf8(buf[pos + 2 : stop]), stop


def read_binary(buf: Buffer, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 2 > end:
        raise MalformedPacket("binary data length runs past the end of the packet")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("binary data runs past the end of the packet")
    return bytes(buf[pos + 2 : stop]), stop


def encode_utf8(text: str) -> bytes:
    """A length-prefixed UTF-8 string; raises ``ValueError`` for text MQTT cannot carry."""
    if "\x00" in text:
        raise ValueError("MQTT strings cannot contain U+0000 [MQTT-1.5.4-2]")
    raw = text.encode("utf-8")  # a lone surrogate raises UnicodeEncodeError, a ValueError
    n = len(raw)
    if n > 0xFFFF:
        raise ValueError(f"MQTT strings are at most 65535 bytes, this one is {n}")
    return n.to_bytes(2, "big") + raw


def encode_binary(data: bytes) -> bytes:
    n = len(data)
    if n > 0xFFFF:
        raise ValueError(f"MQTT binary data is at most 65535 bytes, this is {n}")
    return n.to_bytes(2, "big") + data
