"""Variable Byte Integers and strings (MQTT 5.0 section 1.5)."""

from __future__ import annotations

import pytest

from hexmq.mqtt import MalformedPacket
from hexmq.mqtt.wire import (
    decode_utf8,
    encode_binary,
    encode_utf8,
    encode_vbi,
    read_binary,
    read_u16,
    read_u32,
    read_utf8,
    read_vbi,
)

# The boundaries of each encoded size (1.5.5, Table 1-1).
VBI = [
    (0, b"\x00"),
    (127, b"\x7f"),
    (128, b"\x80\x01"),
    (16_383, b"\xff\x7f"),
    (16_384, b"\x80\x80\x01"),
    (2_097_151, b"\xff\xff\x7f"),
    (2_097_152, b"\x80\x80\x80\x01"),
    (268_435_455, b"\xff\xff\xff\x7f"),
]


@pytest.mark.parametrize(("value", "data"), VBI)
def test_variable_byte_integer(value: int, data: bytes) -> None:
    assert encode_vbi(value) == data
    assert read_vbi(data + b"\xff", 0, len(data)) == (value, len(data))


@pytest.mark.parametrize("value", [-1, 268_435_456])
def test_variable_byte_integer_out_of_range(value: int) -> None:
    with pytest.raises(ValueError):
        encode_vbi(value)


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff\xff\x01", b"\x80\x00", b"\xff\x80\x00", b"\x80", b""],
    ids=["five-bytes", "non-minimal-2", "non-minimal-3", "truncated", "empty"],
)
def test_variable_byte_integer_malformed(data: bytes) -> None:
    with pytest.raises(MalformedPacket):
        read_vbi(data, 0, len(data))


def test_reads_stop_at_end_not_at_the_buffer() -> None:
    # The bytes after `end` belong to the next packet and must not be read.
    buf = b"\x00\x05abcdefgh"
    for reader in (read_utf8, read_binary):
        with pytest.raises(MalformedPacket):
            reader(buf, 0, 4)
    with pytest.raises(MalformedPacket):
        read_u16(buf, 0, 1)
    with pytest.raises(MalformedPacket):
        read_u32(buf, 0, 3)
    assert read_u16(buf, 0, 2) == (5, 2)
    assert read_u32(b"\x01\x02\x03\x04", 0, 4) == (0x01020304, 4)
    assert read_utf8(buf, 0, 7) == ("abcde", 7)
    assert read_binary(bytearray(buf), 0, 7) == (b"abcde", 7)


@pytest.mark.parametrize(
    "raw",
    [b"\xc3\x28", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"a\x00"],
    ids=["ill-formed", "surrogate-d800", "surrogate-dfff", "overlong", "above-10ffff", "nul"],
)
def test_utf8_rules(raw: bytes) -> None:  # [MQTT-1.5.4-1], [MQTT-1.5.4-2]
    with pytest.raises(MalformedPacket):
        decode_utf8(raw)


def test_utf8_accepts_what_mqtt_allows() -> None:
    # Control characters and non-characters are "SHOULD NOT", not errors (1.5.4).
    text = "\x01\x7f\u0085\ufeff\uffff\U0010ffff"
    assert decode_utf8(text.encode()) == text
    assert encode_utf8(text) == len(text.encode()).to_bytes(2, "big") + text.encode()


def test_string_and_binary_encoding_limits() -> None:
    assert encode_utf8("") == b"\x00\x00"
    assert len(encode_utf8("a" * 65535)) == 65537
    assert encode_binary(b"\x00") == b"\x00\x01\x00"
    with pytest.raises(ValueError):
        encode_utf8("\u20ac" * 21846)  # 65538 bytes
    with pytest.raises(ValueError):
        encode_binary(bytes(65536))
