"""One frozen dataclass per MQTT control packet, valid by construction.

``__post_init__`` checks what holds in every protocol version (QoS range, packet identifiers,
non-empty lists, wildcard-free topic names, reason codes that exist for the packet) and raises
``ValueError``: building an invalid packet is a programming error. What depends on the version
(properties and non-zero reason codes need 5.0, AUTH is 5.0 only) is checked by the encoder.
The decoder checks the wire before it builds a packet and raises the codec's own
:class:`~hexmq.mqtt.errors.MQTTError` family instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from hexmq.mqtt.properties import NO_PROPERTIES, Properties
from hexmq.mqtt.reason_codes import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    PUBACK_REASON_CODES,
    PUBCOMP_REASON_CODES,
    PUBREC_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    UNSUBACK_REASON_CODES,
)
from hexmq.mqtt.wire import PacketType

__all__ = [
    "SHARED_PREFIX",
    "Auth",
    "ConnAck",
    "Connect",
    "Disconnect",
    "Packet",
    "PingReq",
    "PingResp",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "Will",
]

#: Shared subscriptions are ``$share/{ShareName}/{filter}`` (4.8.2).
SHARED_PREFIX = "$share/"

_V311_CONNACK_CODES = frozenset(range(6))


def _check_packet_id(packet_id: int) -> None:
    # [MQTT-2.2.1-3]/[MQTT-2.3.1-1]: packet identifiers are non-zero 16-bit integers.
    if not 1 <= packet_id <= 0xFFFF:
        raise ValueError(f"packet_id must be in 1..65535, got {packet_id}")


def _check_qos(qos: int, what: str = "qos") -> None:
    if qos not in (0, 1, 2):
        raise ValueError(f"{what} must be 0, 1 or 2, got {qos}")


def _check_topic_name(topic: str, what: str) -> None:
    # [MQTT-4.7.0-1]/[MQTT-3.3.2-2]: wildcards are for filters only.
    if "+" in topic or "#" in topic:
        raise ValueError(f"{what} must not contain wildcards: {topic!r}")


def _check_reason_code(code: int, allowed: frozenset[int], packet: str) -> None:
    if code not in allowed:
        raise ValueError(f"0x{code:02X} is not a {packet} reason code")


@dataclass(frozen=True, slots=True)
class Will:
    """The Will Message of a CONNECT (3.1.2.5, 3.1.3.2-3.1.3.4)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_qos(self.qos, "will qos")
        if not self.topic:
            raise ValueError("the will topic must not be empty [MQTT-4.7.3-1]")
        _check_topic_name(self.topic, "the will topic")
        if self.properties.topic_alias is not None or self.properties.subscription_identifiers:
            raise ValueError("a will carries no topic alias or subscription identifier")


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (3.1). ``clean_start`` is 3.1.1's Clean Session bit."""

    packet_type: ClassVar[PacketType] = PacketType.CONNECT

    client_id: str
    protocol_version: int = 4
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        if self.protocol_version not in (4, 5):
            raise ValueError(f"protocol_version must be 4 or 5, got {self.protocol_version}")
        if not 0 <= self.keepalive <= 0xFFFF:
            raise ValueError(f"keepalive must be in 0..65535, got {self.keepalive}")
        if self.protocol_version == 4 and self.password is not None and self.username is None:
            raise ValueError("MQTT 3.1.1 allows a password only with a username [MQTT-3.1.2-22]")


@dataclass(frozen=True, slots=True)
class ConnAck:
    """CONNACK (3.2). In 3.1.1 ``reason_code`` is the return code 0-5 (``ConnectReturnCode``)."""

    packet_type: ClassVar[PacketType] = PacketType.CONNACK

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        code = self.reason_code
        if code not in CONNACK_REASON_CODES and code not in _V311_CONNACK_CODES:
            raise ValueError(f"0x{code:02X} is not a CONNACK reason or return code")
        if self.session_present and code:
            # [MQTT-3.2.2-6] (5.0), [MQTT-3.2.2-4] (3.1.1)
            raise ValueError("a refused connection cannot have session_present")


@dataclass(frozen=True, slots=True)
class Publish:
    """PUBLISH (3.3). ``topic`` may be ``""`` only with a 5.0 Topic Alias (3.3.2.1)."""

    packet_type: ClassVar[PacketType] = PacketType.PUBLISH

    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        qos = self.qos
        if qos:
            _check_qos(qos)
            if self.packet_id is None:
                raise ValueError("a QoS 1 or 2 PUBLISH needs a packet_id [MQTT-2.2.1-3]")
            _check_packet_id(self.packet_id)
        else:
            if self.packet_id is not None:
                raise ValueError("a QoS 0 PUBLISH has no packet_id [MQTT-2.2.1-2]")
            if self.dup:
                raise ValueError("DUP must be 0 on a QoS 0 PUBLISH [MQTT-3.3.1-2]")
        topic = self.topic
        if not topic:
            if self.properties.topic_alias is None:
                raise ValueError("an empty topic needs a Topic Alias (3.3.2.1)")
        elif "+" in topic or "#" in topic:
            raise ValueError(
                f"a PUBLISH topic must not contain wildcards [MQTT-3.3.2-2]: {topic!r}"
            )


@dataclass(frozen=True, slots=True)
class _PubResponse:
    """The shared shape of PUBACK, PUBREC, PUBREL and PUBCOMP (3.4-3.7)."""

    packet_type: ClassVar[PacketType]
    _reason_codes: ClassVar[frozenset[int]] = frozenset()

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        _check_reason_code(self.reason_code, self._reason_codes, type(self).__name__)


@dataclass(frozen=True, slots=True)
class PubAck(_PubResponse):
    packet_type: ClassVar[PacketType] = PacketType.PUBACK
    _reason_codes: ClassVar[frozenset[int]] = PUBACK_REASON_CODES


@dataclass(frozen=True, slots=True)
class PubRec(_PubResponse):
    packet_type: ClassVar[PacketType] = PacketType.PUBREC
    _reason_codes: ClassVar[frozenset[int]] = PUBREC_REASON_CODES


@dataclass(frozen=True, slots=True)
class PubRel(_PubResponse):
    packet_type: ClassVar[PacketType] = PacketType.PUBREL
    _reason_codes: ClassVar[frozenset[int]] = PUBREL_REASON_CODES


@dataclass(frozen=True, slots=True)
class PubComp(_PubResponse):
    packet_type: ClassVar[PacketType] = PacketType.PUBCOMP
    _reason_codes: ClassVar[frozenset[int]] = PUBCOMP_REASON_CODES


@dataclass(frozen=True, slots=True)
class Subscription:
    """One Topic Filter and its Subscription Options (3.8.3.1).

    Only what every filter must satisfy is checked here (non-empty [MQTT-4.7.3-1], no No Local on
    a shared subscription [MQTT-3.8.3-4]); the wildcard grammar is
    :func:`hexmq.topics.validate_topic_filter`'s job, so that the edge can refuse one filter with a
    SUBACK reason code instead of dropping the connection.
    """

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0

    def __post_init__(self) -> None:
        if not self.topic_filter:
            raise ValueError("a topic filter must not be empty [MQTT-4.7.3-1]")
        _check_qos(self.qos)
        if self.retain_handling not in (0, 1, 2):
            raise ValueError(f"retain_handling must be 0, 1 or 2, got {self.retain_handling}")
        if self.no_local and self.topic_filter.startswith(SHARED_PREFIX):
            raise ValueError("No Local cannot be set on a shared subscription [MQTT-3.8.3-4]")


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE (3.8); at least one subscription [MQTT-3.8.3-2]."""

    packet_type: ClassVar[PacketType] = PacketType.SUBSCRIBE

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        if not isinstance(self.subscriptions, tuple):
            object.__setattr__(self, "subscriptions", tuple(self.subscriptions))
        if not self.subscriptions:
            raise ValueError("a SUBSCRIBE needs at least one subscription [MQTT-3.8.3-2]")
        if len(self.properties.subscription_identifiers) > 1:
            raise ValueError("a SUBSCRIBE carries at most one subscription identifier")


@dataclass(frozen=True, slots=True)
class SubAck:
    """SUBACK (3.9): one reason code per subscription, in order [MQTT-3.9.3-1]."""

    packet_type: ClassVar[PacketType] = PacketType.SUBACK

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        if not isinstance(self.reason_codes, tuple):
            object.__setattr__(self, "reason_codes", tuple(self.reason_codes))
        if not self.reason_codes:
            raise ValueError("a SUBACK needs at least one reason code")
        for code in self.reason_codes:
            _check_reason_code(code, SUBACK_REASON_CODES, "SUBACK")


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (3.10); at least one filter [MQTT-3.10.3-2]."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBSCRIBE

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        if not isinstance(self.topic_filters, tuple):
            object.__setattr__(self, "topic_filters", tuple(self.topic_filters))
        if not self.topic_filters:
            raise ValueError("an UNSUBSCRIBE needs at least one topic filter [MQTT-3.10.3-2]")
        if not all(self.topic_filters):
            raise ValueError("a topic filter must not be empty [MQTT-4.7.3-1]")


@dataclass(frozen=True, slots=True)
class UnsubAck:
    """UNSUBACK (3.11). 3.1.1 has no reason codes; 5.0 has one per filter [MQTT-3.11.3-1]."""

    packet_type: ClassVar[PacketType] = PacketType.UNSUBACK

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_packet_id(self.packet_id)
        if not isinstance(self.reason_codes, tuple):
            object.__setattr__(self, "reason_codes", tuple(self.reason_codes))
        for code in self.reason_codes:
            _check_reason_code(code, UNSUBACK_REASON_CODES, "UNSUBACK")


@dataclass(frozen=True, slots=True)
class PingReq:
    """PINGREQ (3.12)."""

    packet_type: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class PingResp:
    """PINGRESP (3.13)."""

    packet_type: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT (3.14). 3.1.1's DISCONNECT is client-to-server only and carries nothing."""

    packet_type: ClassVar[PacketType] = PacketType.DISCONNECT

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_reason_code(self.reason_code, DISCONNECT_REASON_CODES, "DISCONNECT")


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (3.15, 5.0 only).

    Anything but the bare success form (reason 0, no properties, Remaining Length 0) must name
    its Authentication Method (3.15.2.2.2: "It is a Protocol Error to omit the Authentication
    Method").
    """

    packet_type: ClassVar[PacketType] = PacketType.AUTH

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES

    def __post_init__(self) -> None:
        _check_reason_code(self.reason_code, AUTH_REASON_CODES, "AUTH")
        if self.properties.authentication_method is None and (
            self.reason_code or self.properties != NO_PROPERTIES
        ):
            raise ValueError(
                "an AUTH with a reason code or properties needs an authentication_method"
            )


Packet: TypeAlias = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
