"""A sans-IO MQTT connection, after h11: bytes in, packets out; packets in, bytes out.

    conn = MQTTConnection(Role.SERVER)
    conn.receive_data(chunk)
    while (event := conn.next_event()) is not NEED_DATA:
        handle(event)
    transport.write(conn.send(reply))

The connection frames packets out of the byte stream and enforces which packet may arrive when:
CONNECT first and once [MQTT-3.1.0-1, MQTT-3.1.0-2], only the packets the peer's role may send,
nothing after a DISCONNECT [MQTT-3.14.4-1]. Any violation, and any malformed packet, raises an
:class:`~hexmq.mqtt.errors.MQTTError`; the connection then stays failed and raises the same error
from every later ``next_event``.
"""

from __future__ import annotations

from enum import Enum
from typing import Final, Literal, NoReturn

from hexmq.mqtt.decoder import (
    DECODERS,
    FIXED_HEADER_FLAGS,
    UNEXPECTED_DECODE_ERRORS,
    Decoder,
    decode_connect,
    read_connect_protocol,
)
from hexmq.mqtt.encoder import encode
from hexmq.mqtt.errors import MalformedPacket, MQTTError, PacketTooLarge, ProtocolError
from hexmq.mqtt.packets import Connect, Disconnect, Packet, Publish
from hexmq.mqtt.properties import NO_PROPERTIES
from hexmq.mqtt.wire import PacketType

__all__ = ["MAX_PACKET_SIZE", "NEED_DATA", "MQTTConnection", "NeedData", "Role"]

#: The largest packet the protocol can express: 1 type byte, 4 length bytes, 268,435,455 more.
MAX_PACKET_SIZE: Final = 268_435_460


class Role(Enum):
    SERVER = "server"
    CLIENT = "client"


class NeedData(Enum):
    """``next_event`` has no whole packet buffered; feed more with ``receive_data``."""

    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA

_T = PacketType
_FROM_CLIENT: Final = frozenset(
    {
        _T.CONNECT,
        _T.PUBLISH,
        _T.PUBACK,
        _T.PUBREC,
        _T.PUBREL,
        _T.PUBCOMP,
        _T.SUBSCRIBE,
        _T.UNSUBSCRIBE,
        _T.PINGREQ,
        _T.DISCONNECT,
        _T.AUTH,
    }
)
_FROM_SERVER: Final = frozenset(
    {
        _T.CONNACK,
        _T.PUBLISH,
        _T.PUBACK,
        _T.PUBREC,
        _T.PUBREL,
        _T.PUBCOMP,
        _T.SUBACK,
        _T.UNSUBACK,
        _T.PINGRESP,
        _T.DISCONNECT,  # 5.0 only: a 3.1.1 server just closes
        _T.AUTH,
    }
)

# Reclaim consumed bytes once this many have piled up at the front of the buffer; until then
# consumed packets are skipped by offset, so decoding many packets per read copies nothing.
_COMPACT_AT: Final = 64 * 1024

_State = Literal["handshake", "open", "closed"]

# The decoder tables, one per (role, state, version, AUTH allowed): shared by every connection,
# so that a connection costs no table of its own (a broker holds tens of thousands).
_DECODER_TABLES: dict[tuple[Role, _State, int | None, bool], tuple[Decoder | None, ...]] = {}


class MQTTConnection:
    """One side of one MQTT network connection, without the network.

    ``protocol_version`` is 4 (3.1.1) or 5 (5.0). A server learns it from the CONNECT (it is set
    as soon as the protocol level has been read, so a broken CONNECT can still be refused with a
    CONNACK in the client's format); a client gives it here or sends a CONNECT first.
    """

    __slots__ = (
        "_auth_allowed",
        "_buf",
        "_decode_version",
        "_decoders",
        "_error",
        "_max_packet_size",
        "_pos",
        "_role",
        "_sent_disconnect",
        "_state",
        "_version",
    )

    def __init__(
        self,
        role: Role,
        *,
        protocol_version: int | None = None,
        max_packet_size: int = MAX_PACKET_SIZE,
    ) -> None:
        if protocol_version not in (None, 4, 5):
            raise ValueError(f"protocol_version must be 4, 5 or None, got {protocol_version}")
        self._role = role
        self._version = protocol_version
        self._max_packet_size = 0
        self.set_max_packet_size(max_packet_size)
        self._buf = bytearray()
        self._pos = 0
        self._error: MQTTError | None = None
        self._state: _State = "handshake"
        self._sent_disconnect = False
        # Whether the CONNECT named an Authentication Method: without one AUTH is refused
        # [MQTT-4.12.0-7]. A client always accepts AUTH before CONNACK in 5.0 (4.12).
        self._auth_allowed = role is Role.CLIENT
        self._decoders: tuple[Decoder | None, ...] = ()
        self._decode_version = 4  # self._version as an int, for the decoders
        self._build_decoders()

    # --- properties ----------------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._role

    @property
    def protocol_version(self) -> int | None:
        return self._version

    @property
    def max_packet_size(self) -> int:
        return self._max_packet_size

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as packets (for read backpressure)."""
        return len(self._buf) - self._pos

    def set_max_packet_size(self, n: int) -> None:
        """Refuse (PacketTooLarge, 0x95) any incoming packet of more than ``n`` bytes in total."""
        if not 2 <= n <= MAX_PACKET_SIZE:
            raise ValueError(f"max_packet_size must be in 2..{MAX_PACKET_SIZE}, got {n}")
        self._max_packet_size = n

    # --- receiving -----------------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes from the peer. Ignored once the connection has failed."""
        if self._error is not None:
            return
        if self._pos >= _COMPACT_AT:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def next_event(self) -> Packet | NeedData:
        """The next whole packet, or ``NEED_DATA``; raises :class:`MQTTError` on bad input."""
        if self._error is not None:
            raise self._error
        buf = self._buf
        pos = self._pos
        size = len(buf)
        if pos >= size:
            if pos:
                buf.clear()
                self._pos = 0
            return NEED_DATA
        first = buf[pos]
        ptype = first >> 4
        decoder = self._decoders[ptype]
        if decoder is None:
            self._fail(self._unexpected(ptype))
        flags = first & 0x0F
        required = FIXED_HEADER_FLAGS[ptype]
        if required is not None and flags != required:
            self._fail(
                MalformedPacket(f"{_T(ptype).name} fixed header flags 0b{flags:04b} [MQTT-2.1.3-1]")
            )
        # Remaining Length: one byte below 128, otherwise up to four (1.5.5, 2.1.4).
        if pos + 1 >= size:
            return NEED_DATA
        length = buf[pos + 1]
        start = pos + 2
        if length >= 0x80:
            length &= 0x7F
            shift = 7
            while True:
                if start >= size:
                    return NEED_DATA
                byte = buf[start]
                start += 1
                length |= (byte & 0x7F) << shift
                if byte < 0x80:
                    if not byte:
                        self._fail(
                            MalformedPacket("Remaining Length not minimally encoded [MQTT-1.5.5-1]")
                        )
                    break
                if start - pos == 5:
                    self._fail(MalformedPacket("Remaining Length longer than four bytes"))
                shift += 7
        end = start + length
        if end - pos > self._max_packet_size:
            # Refused from the header alone: a peer cannot make us buffer an oversized body.
            self._fail(
                PacketTooLarge(
                    f"{end - pos}-byte {_T(ptype).name} exceeds the maximum packet size "
                    f"of {self._max_packet_size}"
                )
            )
        if end > size:
            return NEED_DATA
        packet: Packet
        try:
            if ptype == 1:
                packet = self._decode_connect(buf, flags, start, end)
            else:
                packet = decoder(buf, flags, start, end, self._decode_version)
                if type(packet) is Publish:
                    # [MQTT-3.3.4-6]: subscription identifiers flow server to client only.
                    props = packet.properties
                    if (
                        props is not NO_PROPERTIES
                        and props.subscription_identifiers
                        and self._role is Role.SERVER
                    ):
                        raise ProtocolError("client PUBLISH with a Subscription Identifier")
                elif ptype == 2 or ptype == 14:
                    self._advance_state(packet)
        except MQTTError as exc:
            self._fail(exc)
        except UNEXPECTED_DECODE_ERRORS as exc:
            self._fail(MalformedPacket(f"undecodable {_T(ptype).name}: {exc!r}"), exc)
        self._pos = end
        return packet

    def _decode_connect(self, buf: bytearray, flags: int, start: int, end: int) -> Connect:
        # Learn the version before the rest can fail, so the refusal can be a proper CONNACK.
        self._version, _ = read_connect_protocol(buf, start, end)
        packet = decode_connect(buf, flags, start, end, self._version)
        self._state = "open"
        self._auth_allowed = (
            self._version == 5 and packet.properties.authentication_method is not None
        )
        self._build_decoders()
        return packet

    def _advance_state(self, packet: Packet) -> None:
        if isinstance(packet, Disconnect):
            self._state = "closed"
        else:  # CONNACK, in the client role
            self._state = "open"
        self._build_decoders()

    def _fail(self, error: MQTTError, cause: BaseException | None = None) -> NoReturn:
        # Raising through here keeps the error for every later call, as h11 does.
        self._error = error
        if cause is not None:
            raise error from cause
        raise error

    def _build_decoders(self) -> None:
        """The decoder per packet type for the current role, state and version; None refuses."""
        key = (self._role, self._state, self._version, self._auth_allowed)
        decoders = _DECODER_TABLES.get(key)
        if decoders is None:
            decoders = _DECODER_TABLES[key] = self._decoder_table()
        self._decoders = decoders
        self._decode_version = self._version or 4

    def _decoder_table(self) -> tuple[Decoder | None, ...]:
        allowed: frozenset[int] | set[int]
        if self._state == "closed":
            allowed = frozenset()
        elif self._role is Role.SERVER:
            allowed = {_T.CONNECT} if self._state == "handshake" else _FROM_CLIENT - {_T.CONNECT}
        elif self._version is None:
            allowed = frozenset()  # nothing can come before our CONNECT
        elif self._state == "handshake":
            allowed = {_T.CONNACK, _T.AUTH}
        else:
            allowed = _FROM_SERVER - {_T.CONNACK}
        if self._version == 4:
            allowed = set(allowed) - {_T.AUTH}
            if self._role is Role.CLIENT:
                allowed.discard(_T.DISCONNECT)
        elif not self._auth_allowed:
            allowed = set(allowed) - {_T.AUTH}
        return tuple(DECODERS[t] if t in allowed else None for t in range(len(DECODERS)))

    def _unexpected(self, ptype: int) -> MQTTError:
        """The error for a packet type the current state does not accept."""
        if ptype == 0 or (ptype == _T.AUTH and self._version == 4):
            return MalformedPacket(f"reserved packet type {ptype} (2.1.2)")
        name = _T(ptype).name
        if self._state == "closed":
            return ProtocolError(f"{name} after DISCONNECT [MQTT-3.14.4-1]")
        if self._role is Role.SERVER:
            if self._state == "handshake":
                return ProtocolError(f"{name} before CONNECT [MQTT-3.1.0-1]")
            if ptype == _T.CONNECT:
                return ProtocolError("second CONNECT [MQTT-3.1.0-2]")
            if ptype == _T.AUTH:
                return ProtocolError(
                    "AUTH without an Authentication Method in CONNECT [MQTT-4.12.0-7]"
                )
            return ProtocolError(f"{name} is not sent by a client")
        if self._version is None:
            return ProtocolError(f"{name} from the server before CONNECT was sent")
        if self._state == "handshake":
            return ProtocolError(f"{name} before CONNACK [MQTT-3.2.0-1]")
        if ptype == _T.CONNACK:
            return ProtocolError("second CONNACK [MQTT-3.2.0-2]")
        return ProtocolError(f"{name} is not sent by a server")

    # --- sending -------------------------------------------------------------------------------

    def send(self, packet: Packet) -> bytes:
        """The bytes for ``packet`` in this connection's protocol version.

        ``ValueError`` for a packet this role does not send, or that the version cannot carry.
        Before a server knows the version (a CONNECT it refused unread), use :func:`encode`.
        """
        ptype = packet.packet_type
        sendable = _FROM_SERVER if self._role is Role.SERVER else _FROM_CLIENT
        if ptype not in sendable:
            raise ValueError(f"a {self._role.value} does not send {ptype.name}")
        if self._sent_disconnect:
            raise ValueError("nothing may be sent after DISCONNECT [MQTT-3.14.4-1]")
        if isinstance(packet, Connect):
            if self._version is not None and self._version != packet.protocol_version:
                raise ValueError(f"this connection speaks level {self._version}")
            self._version = packet.protocol_version
            # The server may send AUTH only if this CONNECT named a method [MQTT-4.12.0-6].
            self._auth_allowed = (
                self._version == 5 and packet.properties.authentication_method is not None
            )
            self._build_decoders()
        version = self._version
        if version is None:
            raise ValueError("protocol version unknown until CONNECT; use hexmq.mqtt.encode()")
        data = encode(packet, version)
        if isinstance(packet, Disconnect):
            self._sent_disconnect = True
        return data
