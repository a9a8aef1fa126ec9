"""The one error family for bad MQTT input.

Every failure caused by the bytes a peer sent is an :class:`MQTTError` carrying the MQTT 5.0 reason
code that names it, so the edge has a single place that turns any of them into a DISCONNECT
(5.0), a CONNACK (during CONNECT) or a plain close (3.1.1). Any other exception out of the codec
is a bug in the codec, never the peer's fault.

Mistakes of the *caller* (building an invalid packet, encoding a 5.0-only packet for 3.1.1) raise
``ValueError``/``TypeError`` instead: those are programming errors on our side, and must not be
mistaken for a peer misbehaving.
"""

from __future__ import annotations

__all__ = [
    "MQTTError",
    "MalformedPacket",
    "PacketTooLarge",
    "ProtocolError",
    "TopicAliasInvalid",
    "TopicFilterInvalid",
    "TopicNameInvalid",
    "UnsupportedProtocolVersion",
]


class MQTTError(Exception):
    """A peer sent something MQTT does not allow; ``reason_code`` is the MQTT 5.0 code for it."""

    #: Overridden by each subclass; an instance may carry a different one (see ``__init__``).
    default_reason_code: int = 0x80  # Unspecified error

    def __init__(self, message: str, *, reason_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason_code: int = self.default_reason_code if reason_code is None else reason_code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, reason_code=0x{self.reason_code:02X})"


class MalformedPacket(MQTTError):
    """The bytes cannot be parsed as the packet they claim to be (0x81)."""

    default_reason_code = 0x81


class ProtocolError(MQTTError):
    """The packet parsed, but its content or its place in the exchange is not allowed (0x82)."""

    default_reason_code = 0x82


class UnsupportedProtocolVersion(MQTTError):
    """A CONNECT named a protocol or level we do not speak (0x84).

    The edge answers with a CONNACK in the client's own format before closing: 3.1.1 clients (and
    older, level < 5) get return code 0x01 [MQTT-3.1.2-2 in 3.1.1], 5.0-style clients 0x84
    [MQTT-3.1.2-2 in 5.0]. ``protocol_name`` and ``protocol_level`` are what the client sent
    (``None`` where the packet was too broken to read them), so the edge can pick the format.
    """

    default_reason_code = 0x84

    def __init__(
        self,
        message: str,
        *,
        protocol_name: str | None = None,
        protocol_level: int | None = None,
    ) -> None:
        super().__init__(message)
        self.protocol_name = protocol_name
        self.protocol_level = protocol_level


class PacketTooLarge(MQTTError):
    """The packet is larger than the receiver's Maximum Packet Size (0x95)."""

    default_reason_code = 0x95


class TopicNameInvalid(MQTTError):
    """A Topic Name is well-formed UTF-8 but not a valid topic name, e.g. has a wildcard (0x90)."""

    default_reason_code = 0x90


class TopicFilterInvalid(MQTTError):
    """A Topic Filter breaks the wildcard or shared-subscription rules (0x8F)."""

    default_reason_code = 0x8F


class TopicAliasInvalid(MQTTError):
    """A Topic Alias of 0, or above the receiver's Topic Alias Maximum (0x94, MQTT 5.0 3.3.4)."""

    default_reason_code = 0x94
