"""The PROXY protocol header reader (services.edge.proxyproto): golden vectors for v1 and v2,
each fed whole, byte by byte and with the client's first bytes behind it; a table of malformed
headers; and fuzzing: any bytes either give a header, ask for more, or raise ProxyHeaderError."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.edge.proxyproto import (
    V1_MAX,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    ProxyHeaderReader,
)

# An MQTT 3.1.1 CONNECT that follows the header on the same connection.
CONNECT = bytes.fromhex("101000044d5154540402003c0004746573")


def v2(command: int, family: int, body: bytes) -> bytes:
    """A v2 header: signature, version 2 + command, family + transport, length, body."""
    return V2_SIGNATURE + bytes([0x20 | command, family]) + struct.pack("!H", len(body)) + body


IPV4_BLOCK = bytes([203, 0, 113, 7, 192, 0, 2, 1]) + struct.pack("!HH", 51234, 1883)
IPV6_BLOCK = (
    bytes.fromhex("20010db8000000000000000000000001")  # 2001:db8::1
    + bytes.fromhex("20010db8000000000000000000000002")  # 2001:db8::2
    + struct.pack("!HH", 443, 8883)
)
# TLVs: PP2_TYPE_ALPN (0x01) "mqtt", PP2_TYPE_AUTHORITY (0x02) "broker", a NOOP (0x04).
TLVS = b"\x01\x00\x04mqtt" + b"\x02\x00\x06broker" + b"\x04\x00\x00"

GOLDEN: list[tuple[str, bytes, ProxyHeader]] = [
    (
        "v1 TCP4",
        b"PROXY TCP4 203.0.113.7 192.0.2.1 51234 1883\r\n",
        ProxyHeader(1, ("203.0.113.7", 51234), ("192.0.2.1", 1883)),
    ),
    (
        "v1 TCP6",
        b"PROXY TCP6 2001:db8::1 2001:db8::2 443 8883\r\n",
        ProxyHeader(1, ("2001:db8::1", 443), ("2001:db8::2", 8883)),
    ),
    ("v1 UNKNOWN", b"PROXY UNKNOWN\r\n", ProxyHeader(1, None, None)),
    (
        "v1 UNKNOWN with addresses (ignored)",
        b"PROXY UNKNOWN ffff:f...f:ffff ffff:f...f:ffff 65535 65535\r\n",
        ProxyHeader(1, None, None),
    ),
    (
        "v1 TCP4 port 0 and 65535",
        b"PROXY TCP4 10.0.0.1 10.0.0.2 0 65535\r\n",
        ProxyHeader(1, ("10.0.0.1", 0), ("10.0.0.2", 65535)),
    ),
    (
        "v2 PROXY TCP over IPv4",
        v2(0x1, 0x11, IPV4_BLOCK),
        ProxyHeader(2, ("203.0.113.7", 51234), ("192.0.2.1", 1883)),
    ),
    (
        "v2 PROXY TCP over IPv6",
        v2(0x1, 0x21, IPV6_BLOCK),
        ProxyHeader(2, ("2001:db8::1", 443), ("2001:db8::2", 8883)),
    ),
    (
        "v2 PROXY IPv4 with TLVs (skipped)",
        v2(0x1, 0x11, IPV4_BLOCK + TLVS),
        ProxyHeader(2, ("203.0.113.7", 51234), ("192.0.2.1", 1883)),
    ),
    ("v2 LOCAL (the balancer's health check)", v2(0x0, 0x00, b""), ProxyHeader(2, None, None)),
    (
        "v2 LOCAL with an address block (ignored)",
        v2(0x0, 0x11, IPV4_BLOCK),
        ProxyHeader(2, None, None),
    ),
    ("v2 PROXY UNSPEC", v2(0x1, 0x00, b""), ProxyHeader(2, None, None)),
    ("v2 PROXY AF_UNIX (no IP)", v2(0x1, 0x31, bytes(216)), ProxyHeader(2, None, None)),
]


@pytest.mark.parametrize(("name", "data", "header"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_header_whole(name: str, data: bytes, header: ProxyHeader) -> None:
    reader = ProxyHeaderReader()
    assert reader.feed(data) == header
    assert reader.rest == b""


@pytest.mark.parametrize(("name", "data", "header"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_header_byte_by_byte(name: str, data: bytes, header: ProxyHeader) -> None:
    reader = ProxyHeaderReader()
    for i in range(len(data) - 1):
        assert reader.feed(data[i : i + 1]) is None, f"complete after {i + 1} bytes"
    assert reader.feed(data[-1:]) == header
    assert reader.rest == b""


@pytest.mark.parametrize(("name", "data", "header"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_header_with_the_clients_bytes_behind_it(
    name: str, data: bytes, header: ProxyHeader
) -> None:
    reader = ProxyHeaderReader()
    assert reader.feed(data + CONNECT) == header
    assert reader.rest == CONNECT


MALFORMED: list[tuple[str, bytes, str]] = [
    ("plain MQTT, no header", CONNECT, "no PROXY protocol header: the connection starts with 0x10"),
    ("HTTP", b"GET /mqtt HTTP/1.1\r\n", "no PROXY protocol header"),
    ("v1 lower case", b"proxy TCP4 1.2.3.4 5.6.7.8 1 2\r\n", "no PROXY protocol header"),
    ("v1 bad prefix", b"PROXZ TCP4", "not a PROXY v1 header"),
    ("v1 too long", b"PROXY UNKNOWN " + b"x" * V1_MAX, "without CRLF in its first 107 bytes"),
    ("v1 LF only", b"PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", "ends in LF without CR"),
    ("v1 unknown protocol", b"PROXY UDP4 1.2.3.4 5.6.7.8 1 2\r\n", "must be TCP4, TCP6 or UNKNOWN"),
    ("v1 missing port", b"PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", "needs source, destination"),
    ("v1 double space", b"PROXY TCP4 1.2.3.4  5.6.7.8 1 2\r\n", "needs source, destination"),
    ("v1 TCP4 with IPv6", b"PROXY TCP4 ::1 ::1 1 2\r\n", "TCP4 address is not valid"),
    ("v1 TCP6 with junk", b"PROXY TCP6 1.2.3 ::1 1 2\r\n", "TCP6 address is not valid"),
    ("v1 IPv4 leading zero", b"PROXY TCP4 01.2.3.4 5.6.7.8 1 2\r\n", "address is not valid"),
    ("v1 signed port", b"PROXY TCP4 1.2.3.4 5.6.7.8 +80 2\r\n", "not a port number: '+80'"),
    ("v1 port leading zero", b"PROXY TCP4 1.2.3.4 5.6.7.8 080 2\r\n", "not a port number"),
    ("v1 port too big", b"PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", "over 65535"),
    ("v1 non-ASCII", b"PROXY TCP4 1.2.3.4 5.6.7.8 \xd9\xa8 2\r\n", "non-ASCII"),
    ("v2 bad signature", b"\r\n\r\n\x00\r\nQUIX\n" + bytes(4), "wrong signature"),
    ("v2 version 1", V2_SIGNATURE + b"\x11\x11\x00\x00", "version 1"),
    ("v2 command 2", V2_SIGNATURE + b"\x22\x11\x00\x00", "neither LOCAL nor PROXY"),
    ("v2 family 4", V2_SIGNATURE + b"\x21\x41\x00\x00", "family/transport byte 0x41"),
    ("v2 transport 3", V2_SIGNATURE + b"\x21\x13\x00\x00", "family/transport byte 0x13"),
    ("v2 datagram", v2(0x1, 0x12, IPV4_BLOCK), "datagram connection"),
    ("v2 short IPv4 block", v2(0x1, 0x11, b"abcd"), "needs 12 bytes, the header has 4"),
    ("v2 short IPv6 block", v2(0x1, 0x21, IPV4_BLOCK), "needs 36 bytes, the header has 12"),
]


@pytest.mark.parametrize(("name", "data", "why"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_header_is_refused_with_a_reason(name: str, data: bytes, why: str) -> None:
    with pytest.raises(ProxyHeaderError) as caught:
        ProxyHeaderReader().feed(data)
    assert why in str(caught.value)


def test_a_client_without_a_header_is_refused_at_its_first_byte() -> None:
    with pytest.raises(ProxyHeaderError):
        ProxyHeaderReader().feed(CONNECT[:1])


def test_nothing_is_read_after_the_header() -> None:
    reader = ProxyHeaderReader()
    reader.feed(GOLDEN[0][1])
    with pytest.raises(RuntimeError):
        reader.feed(CONNECT)


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_header_more_wanted_or_proxy_header_error(data: bytes) -> None:
    try:
        ProxyHeaderReader().feed(data)
    except ProxyHeaderError:
        pass


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from([g[1] for g in GOLDEN]), st.data())
def test_mutated_golden_headers_parse_or_raise_only_proxy_header_error(
    data: bytes, draw: st.DataObject
) -> None:
    """Random bytes are mostly refused at byte one; mutating valid headers reaches deep."""
    mutated = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        i = draw.draw(st.integers(0, len(mutated) - 1))
        mutated[i] = draw.draw(st.integers(0, 255))
    cut = draw.draw(st.integers(0, len(mutated)))
    reader = ProxyHeaderReader()
    try:
        reader.feed(bytes(mutated[:cut]))
        if reader.header is None:
            reader.feed(bytes(mutated[cut:]))
    except ProxyHeaderError:
        pass
