"""The sans-IO MQTT 3.1.1/5.0 codec: packets as frozen dataclasses, bytes in and out, no I/O.

Start at :class:`MQTTConnection` for a stream, or :func:`encode`/:func:`decode` for one packet.
Bad input from a peer raises an :class:`MQTTError` subclass carrying its MQTT 5.0 reason code;
nothing else.
"""

from hexmq.mqtt.codec import decode, encode
from hexmq.mqtt.connection import MAX_PACKET_SIZE, NEED_DATA, MQTTConnection, NeedData, Role
from hexmq.mqtt.errors import (
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolError,
    TopicAliasInvalid,
    TopicFilterInvalid,
    TopicNameInvalid,
    UnsupportedProtocolVersion,
)
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
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from hexmq.mqtt.properties import NO_PROPERTIES, Properties, PropertyId
from hexmq.mqtt.reason_codes import ConnectReturnCode, ReasonCode, SubackReturnCode
from hexmq.mqtt.wire import PacketType

__all__ = [
    "MAX_PACKET_SIZE",
    "NEED_DATA",
    "NO_PROPERTIES",
    "Auth",
    "ConnAck",
    "Connect",
    "ConnectReturnCode",
    "Disconnect",
    "MQTTConnection",
    "MQTTError",
    "MalformedPacket",
    "NeedData",
    "Packet",
    "PacketTooLarge",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "PropertyId",
    "ProtocolError",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "ReasonCode",
    "Role",
    "SubAck",
    "SubackReturnCode",
    "Subscribe",
    "Subscription",
    "TopicAliasInvalid",
    "TopicFilterInvalid",
    "TopicNameInvalid",
    "UnsubAck",
    "Unsubscribe",
    "UnsupportedProtocolVersion",
    "Will",
    "decode",
    "encode",
]
