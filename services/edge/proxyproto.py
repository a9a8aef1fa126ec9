"""The PROXY protocol (HAProxy's, versions 1 and 2), sans-I/O: the header a load balancer sends
first on a connection it forwards, saying which client the connection is really from.

    reader = ProxyHeaderReader()
    header = reader.feed(data)      # None: send more; ProxyHeaderError: not a valid header
    header.source                   # ("203.0.113.7", 51234), or None: use the socket's peer
    reader.rest                     # bytes after the header: the client's first MQTT bytes

Version 1 is one text line (at most 107 bytes): `PROXY TCP4|TCP6 SRC DST SPORT DPORT\\r\\n`, or
`PROXY UNKNOWN ...\\r\\n`. Version 2 is binary: a 12-byte signature, version and command, family
and transport, a length, the addresses, then TLVs (skipped). A LOCAL command (the balancer's
own health check) and an UNKNOWN/unspecified family carry no client address: the connection's
own peer stands. Anything else fails early, at the first byte that cannot start a valid
header, so a client that skips the balancer is told at once.

Not the PyPI `proxy-protocol` package: its parser lets struct.error escape on a short v2
address block and accepts `+80` as a v1 port, and it has not been released since 2024; this
parser is small, strict, and raises nothing but ProxyHeaderError (fuzzed in
tests/unit/test_proxy_protocol.py). Reference: haproxy's doc/proxy-protocol.txt.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from typing import Final

V1_PREFIX: Final = b"PROXY "
V1_MAX: Final = 107  # the longest v1 line, CRLF included (proxy-protocol.txt 2.1)
V2_SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
V2_FIXED: Final = 16  # signature, version/command, family/transport, length

_LOCAL, _PROXY = 0x0, 0x1
_UNSPEC, _INET, _INET6, _UNIX = 0x0, 0x1, 0x2, 0x3
_STREAM, _DGRAM = 0x1, 0x2
_ADDRESS_BYTES: Final = {_INET: 12, _INET6: 36, _UNIX: 216}


class ProxyHeaderError(ValueError):
    """Not a valid PROXY protocol header; the message says what is wrong, for one log line."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    version: int
    # The client's (address, port) as the balancer saw it; None for LOCAL, UNKNOWN and
    # unspecified or AF_UNIX families (the connection's own peer stands).
    source: tuple[str, int] | None
    destination: tuple[str, int] | None


class ProxyHeaderReader:
    """Reads one PROXY header from the start of a byte stream, fed in pieces of any size."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self.header: ProxyHeader | None = None
        self.rest = b""

    def feed(self, data: bytes) -> ProxyHeader | None:
        if self.header is not None:
            raise RuntimeError("the PROXY header was already read; pass later bytes on")
        self._buf += data
        buf = bytes(self._buf)
        if buf[:1] == b"P":
            result = _read_v1(buf)
        elif buf[:1] == b"\r":
            result = _read_v2(buf)
        elif not buf:
            return None
        else:
            raise ProxyHeaderError(
                f"no PROXY protocol header: the connection starts with 0x{buf[0]:02x} (a client "
                "that did not come through the load balancer?)"
            )
        if result is None:
            return None
        self.header, used = result
        self.rest = buf[used:]
        self._buf.clear()
        return self.header


def _read_v1(buf: bytes) -> tuple[ProxyHeader, int] | None:
    head = buf[: len(V1_PREFIX)]
    if head != V1_PREFIX[: len(head)]:
        raise ProxyHeaderError(f"not a PROXY v1 header: starts with {head!r}")
    end = buf.find(b"\r\n", 0, V1_MAX)
    if end < 0:
        if len(buf) >= V1_MAX:
            raise ProxyHeaderError(f"PROXY v1 header without CRLF in its first {V1_MAX} bytes")
        if b"\n" in buf:
            raise ProxyHeaderError("PROXY v1 header ends in LF without CR")
        return None
    line = buf[len(V1_PREFIX) : end]
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ProxyHeaderError("PROXY v1 header holds non-ASCII bytes") from None
    fields = text.split(" ")
    if fields[0] == "UNKNOWN":  # the rest of the line is to be ignored (2.1)
        return ProxyHeader(1, None, None), end + 2
    if fields[0] not in ("TCP4", "TCP6"):
        raise ProxyHeaderError(f"PROXY v1 protocol must be TCP4, TCP6 or UNKNOWN: {fields[0]!r}")
    if len(fields) != 5:
        raise ProxyHeaderError(
            f"PROXY v1 {fields[0]} needs source, destination and two ports, single-spaced: {text!r}"
        )
    family, src, dst, sport, dport = fields
    source = (_v1_address(family, src), _v1_port(sport))
    destination = (_v1_address(family, dst), _v1_port(dport))
    return ProxyHeader(1, source, destination), end + 2


def _v1_address(family: str, text: str) -> str:
    try:
        if family == "TCP4":
            return str(ipaddress.IPv4Address(text))
        return str(ipaddress.IPv6Address(text))
    except ValueError:
        raise ProxyHeaderError(f"PROXY v1 {family} address is not valid: {text!r}") from None


def _v1_port(text: str) -> int:
    # Decimal digits only, no sign, no leading zero (proxy-protocol.txt 2.1).
    leading_zero = len(text) > 1 and text[0] == "0"
    if not text.isascii() or not text.isdigit() or len(text) > 5 or leading_zero:
        raise ProxyHeaderError(f"PROXY v1 port is not a port number: {text!r}")
    port = int(text)
    if port > 65535:
        raise ProxyHeaderError(f"PROXY v1 port is over 65535: {port}")
    return port


def _read_v2(buf: bytes) -> tuple[ProxyHeader, int] | None:
    head = buf[: len(V2_SIGNATURE)]
    if head != V2_SIGNATURE[: len(head)]:
        raise ProxyHeaderError("not a PROXY v2 header: wrong signature")
    if len(buf) < V2_FIXED:
        return None
    version, command = buf[12] >> 4, buf[12] & 0x0F
    family, transport = buf[13] >> 4, buf[13] & 0x0F
    (length,) = struct.unpack_from("!H", buf, 14)
    if version != 2:
        raise ProxyHeaderError(f"PROXY v2 header with version {version}")
    if command not in (_LOCAL, _PROXY):
        raise ProxyHeaderError(f"PROXY v2 command 0x{command:x} is neither LOCAL nor PROXY")
    if family > _UNIX or transport > _DGRAM:
        raise ProxyHeaderError(f"PROXY v2 family/transport byte 0x{buf[13]:02x} is not defined")
    if len(buf) < V2_FIXED + length:
        return None
    used = V2_FIXED + length
    if command == _LOCAL or family in (_UNSPEC, _UNIX):
        # LOCAL: the balancer's own connection (health checks); the others carry no IP
        # address. Either way the socket's peer stands; the block is skipped.
        return ProxyHeader(2, None, None), used
    if transport != _STREAM:
        raise ProxyHeaderError("PROXY v2 header for a datagram connection on a TCP listener")
    need = _ADDRESS_BYTES[family]
    if length < need:
        raise ProxyHeaderError(
            f"PROXY v2 {'IPv4' if family == _INET else 'IPv6'} address block needs {need} "
            f"bytes, the header has {length}"
        )
    block = buf[V2_FIXED : V2_FIXED + need]
    size = 4 if family == _INET else 16
    src = ipaddress.ip_address(block[:size])
    dst = ipaddress.ip_address(block[size : 2 * size])
    sport, dport = struct.unpack_from("!HH", block, 2 * size)
    # What follows the addresses, up to `length`, is TLVs (ALPN, authority, CRC32C, SSL
    # details ...): none of them changes the client's address, so they are skipped.
    return ProxyHeader(2, (str(src), sport), (str(dst), dport)), used
