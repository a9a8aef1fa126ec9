"""Golden MQTT byte vectors, written by hand from the specifications (never by our encoder).

Shared by the codec tests and the edge's integration tests:

- ``VECTORS``: valid packets per type and protocol version (3.1.1 = level 4, 5.0 = level 5), each
  annotated byte by byte, with the packet object they decode to and encode from. ``prelude(v)``
  gives the bytes the receiving side must have seen first (a CONNECT, or a CONNACK).
- ``MALFORMED``: ``(name, protocol_version, bytes_after_a_valid_connect, expected_reason_code)``
  for a server: send ``CONNECT_BYTES[protocol_version]`` first, then the bytes; reading packets
  until one fails must fail with that MQTT 5.0 reason code. ``publish-too-large`` presumes the
  server's maximum packet size is below 256 MiB (the codec tests use ``TEST_MAX_PACKET_SIZE``).
- ``MALFORMED_CONNECT``: the same shape, but the bytes are the whole stream from the client's
  first byte (bad CONNECTs, or packets before CONNECT).
- ``MALFORMED_FROM_SERVER``: the same shape for a client that has sent its CONNECT: the bytes are
  the whole stream from the server.

Reason codes: 0x81 Malformed Packet, 0x82 Protocol Error, 0x84 Unsupported Protocol Version,
0x90 Topic Name invalid, 0x94 Topic Alias invalid, 0x95 Packet too large (``ERROR_CLASSES``
maps each to the codec's exception class).

The tables are excluded from the formatter so each line stays one wire field and its comment.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, NamedTuple

from hexmq.mqtt import (
    MAX_PACKET_SIZE,
    NEED_DATA,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    MQTTConnection,
    MQTTError,
    Packet,
    PacketTooLarge,
    PingReq,
    PingResp,
    Properties,
    ProtocolError,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Role,
    SubAck,
    Subscribe,
    Subscription,
    TopicAliasInvalid,
    TopicFilterInvalid,
    TopicNameInvalid,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocolVersion,
    Will,
)

Direction = Literal["c2s", "s2c"]
C2S: Direction = "c2s"
S2C: Direction = "s2c"

#: The maximum packet size the codec tests give a server reading ``MALFORMED``.
TEST_MAX_PACKET_SIZE = 1024 * 1024


def b(*parts: int | bytes) -> bytes:
    """Concatenate single bytes (ints) and byte strings, so vectors read field by field."""
    out = bytearray()
    for part in parts:
        if isinstance(part, int):
            out.append(part)
        else:
            out += part
    return bytes(out)


@dataclass(frozen=True)
class Vector:
    name: str
    protocol_version: int
    direction: Direction
    data: bytes
    packet: Packet


class BadInput(NamedTuple):
    name: str
    protocol_version: int
    data: bytes
    reason_code: int


# --- Preludes ------------------------------------------------------------------------------------

# fmt: off
CONNECT_V311 = b(
    0x10,                  # CONNECT, flags 0000
    0x0E,                  # Remaining Length 14
    0x00, 0x04, b"MQTT",   # Protocol Name
    0x04,                  # Protocol Level 4 (3.1.1)
    0x02,                  # Connect Flags: Clean Session
    0x00, 0x3C,            # Keep Alive 60 s
    0x00, 0x02, b"c1",     # Client Identifier "c1"
)

CONNECT_V5 = b(
    0x10,                  # CONNECT
    0x0F,                  # Remaining Length 15
    0x00, 0x04, b"MQTT",   # Protocol Name
    0x05,                  # Protocol Level 5
    0x02,                  # Connect Flags: Clean Start
    0x00, 0x3C,            # Keep Alive 60 s
    0x00,                  # Property Length 0
    0x00, 0x02, b"c1",     # Client Identifier "c1"
)

#: A 5.0 CONNECT naming an Authentication Method, after which AUTH is allowed [MQTT-4.12.0-7].
CONNECT_V5_AUTH = b(
    0x10,                  # CONNECT
    0x13,                  # Remaining Length 19
    0x00, 0x04, b"MQTT",   # Protocol Name
    0x05,                  # Protocol Level 5
    0x02,                  # Connect Flags: Clean Start
    0x00, 0x3C,            # Keep Alive 60 s
    0x04,                  # Property Length 4
    0x15, 0x00, 0x01, b"M",  # Authentication Method "M"
    0x00, 0x02, b"c1",     # Client Identifier "c1"
)

CONNACK_BYTES = {
    4: b(0x20, 0x02, 0x00, 0x00),        # CONNACK, length 2, no session, Accepted
    5: b(0x20, 0x03, 0x00, 0x00, 0x00),  # CONNACK, length 3, no session, Success, no properties
}
# fmt: on

CONNECT_BYTES = {4: CONNECT_V311, 5: CONNECT_V5}


def prelude(vector: Vector) -> bytes:
    """What the receiver of ``vector`` must have read before it (nothing for CONNECT/CONNACK)."""
    if isinstance(vector.packet, Connect | ConnAck):
        return b""
    if vector.direction == S2C:
        return CONNACK_BYTES[vector.protocol_version]
    if isinstance(vector.packet, Auth):
        return CONNECT_V5_AUTH
    return CONNECT_BYTES[vector.protocol_version]


# --- MQTT 3.1.1 ----------------------------------------------------------------------------------

# fmt: off
V311: list[Vector] = [
    Vector("connect-minimal", 4, C2S, CONNECT_V311, Connect("c1")),
    Vector("connect-empty-client-id-keepalive-0", 4, C2S, b(
        0x10,                  # CONNECT
        0x0C,                  # Remaining Length 12
        0x00, 0x04, b"MQTT",   # Protocol Name
        0x04,                  # Protocol Level 4
        0x02,                  # Clean Session
        0x00, 0x00,            # Keep Alive 0 (off)
        0x00, 0x00,            # Client Identifier "" (the server may assign one, 3.1.3.1)
    ), Connect("", keepalive=0)),
    Vector("connect-will-username-password", 4, C2S, b(
        0x10,                  # CONNECT
        0x30,                  # Remaining Length 48
        0x00, 0x04, b"MQTT",   # Protocol Name
        0x04,                  # Protocol Level 4
        0xEC,                  # User Name 0x80 | Password 0x40 | Will Retain 0x20
                               # | Will QoS 1 (0x08) | Will Flag 0x04; Clean Session 0
        0x01, 0x2C,            # Keep Alive 300 s
        0x00, 0x08, b"client-1",    # Client Identifier
        0x00, 0x0A, b"will/topic",  # Will Topic
        0x00, 0x03, b"bye",    # Will Message
        0x00, 0x04, b"user",   # User Name
        0x00, 0x03, b"\x00pw",  # Password (binary data: a NUL byte is fine)
    ), Connect(
        "client-1", clean_start=False, keepalive=300, username="user", password=b"\x00pw",
        will=Will("will/topic", b"bye", qos=1, retain=True),
    )),
    Vector("connack-accepted", 4, S2C, b(
        0x20, 0x02,            # CONNACK, Remaining Length 2
        0x00,                  # no Session Present
        0x00,                  # Connection Accepted
    ), ConnAck()),
    Vector("connack-session-present", 4, S2C, b(
        0x20, 0x02,            # CONNACK, Remaining Length 2
        0x01,                  # Session Present
        0x00,                  # Connection Accepted
    ), ConnAck(session_present=True)),
    Vector("connack-not-authorized", 4, S2C, b(
        0x20, 0x02,            # CONNACK, Remaining Length 2
        0x00,                  # no Session Present [MQTT-3.2.2-4]
        0x05,                  # Connection Refused, not authorized
    ), ConnAck(reason_code=5)),
    Vector("publish-qos0", 4, C2S, b(
        0x30,                  # PUBLISH, DUP 0, QoS 0, RETAIN 0
        0x0A,                  # Remaining Length 10
        0x00, 0x03, b"a/b",    # Topic Name
        b"hello",              # Payload: the rest of the packet
    ), Publish("a/b", b"hello")),
    Vector("publish-qos1-dup-retain", 4, C2S, b(
        0x3B,                  # PUBLISH, DUP 1 (0x08), QoS 1 (0x02), RETAIN 1 (0x01)
        0x10,                  # Remaining Length 16
        0x00, 0x09, b"sensors/1",  # Topic Name
        0x12, 0x34,            # Packet Identifier 0x1234
        0x00, 0x01, 0x02,      # Payload
    ), Publish("sensors/1", b"\x00\x01\x02", qos=1, retain=True, dup=True, packet_id=0x1234)),
    Vector("publish-qos2-empty-payload", 4, S2C, b(
        0x34,                  # PUBLISH, QoS 2
        0x05,                  # Remaining Length 5
        0x00, 0x01, b"x",      # Topic Name
        0xFF, 0xFF,            # Packet Identifier 65535
    ), Publish("x", b"", qos=2, packet_id=65535)),
    Vector("publish-two-byte-remaining-length", 4, C2S, b(
        0x30,                  # PUBLISH, QoS 0
        0xCD, 0x01,            # Remaining Length 205 = 0x4D + 1 * 128 (1.5.5)
        0x00, 0x01, b"t",      # Topic Name
        b"\xab" * 202,         # Payload
    ), Publish("t", b"\xab" * 202)),
    Vector("publish-utf8-topic", 4, C2S, b(
        0x30,                  # PUBLISH, QoS 0
        0x09,                  # Remaining Length 9
        0x00, 0x06,            # Topic length: 6 bytes, 3 characters:
        0xC3, 0xA9,            #   U+00E9
        0x2F,                  #   "/"
        0xE2, 0x82, 0xAC,      #   U+20AC
        b"x",                  # Payload
    ), Publish("\u00e9/\u20ac", b"x")),
    Vector("publish-topic-with-bom", 4, C2S, b(
        0x30,                  # PUBLISH
        0x06,                  # Remaining Length 6
        0x00, 0x04,            # Topic length 4
        0xEF, 0xBB, 0xBF,      # U+FEFF, kept as is: MUST NOT be skipped [MQTT-1.5.4-3]
        b"a",
    ), Publish("\ufeffa")),
    Vector("puback", 4, C2S, b(
        0x40, 0x02,            # PUBACK, Remaining Length 2
        0x00, 0x07,            # Packet Identifier 7
    ), PubAck(7)),
    Vector("pubrec", 4, S2C, b(
        0x50, 0x02,            # PUBREC, Remaining Length 2
        0x00, 0x07,            # Packet Identifier 7
    ), PubRec(7)),
    Vector("pubrel", 4, C2S, b(
        0x62, 0x02,            # PUBREL, flags 0010 [MQTT-3.6.1-1], Remaining Length 2
        0x00, 0x07,            # Packet Identifier 7
    ), PubRel(7)),
    Vector("pubcomp", 4, S2C, b(
        0x70, 0x02,            # PUBCOMP, Remaining Length 2
        0x00, 0x07,            # Packet Identifier 7
    ), PubComp(7)),
    Vector("subscribe", 4, C2S, b(
        0x82,                  # SUBSCRIBE, flags 0010 [MQTT-3.8.1-1]
        0x0E,                  # Remaining Length 14
        0x00, 0x0A,            # Packet Identifier 10
        0x00, 0x03, b"a/+",    # Topic Filter
        0x00,                  # Requested QoS 0
        0x00, 0x03, b"b/#",    # Topic Filter
        0x02,                  # Requested QoS 2
    ), Subscribe(10, (Subscription("a/+", 0), Subscription("b/#", 2)))),
    Vector("suback", 4, S2C, b(
        0x90,                  # SUBACK
        0x05,                  # Remaining Length 5
        0x00, 0x0A,            # Packet Identifier 10
        0x00, 0x02, 0x80,      # Granted QoS 0, Granted QoS 2, Failure
    ), SubAck(10, (0x00, 0x02, 0x80))),
    Vector("unsubscribe", 4, C2S, b(
        0xA2,                  # UNSUBSCRIBE, flags 0010 [MQTT-3.10.1-1]
        0x0C,                  # Remaining Length 12
        0x00, 0x0B,            # Packet Identifier 11
        0x00, 0x03, b"a/+",    # Topic Filter
        0x00, 0x03, b"b/#",    # Topic Filter
    ), Unsubscribe(11, ("a/+", "b/#"))),
    Vector("unsuback", 4, S2C, b(
        0xB0, 0x02,            # UNSUBACK, Remaining Length 2 (no payload in 3.1.1)
        0x00, 0x0B,            # Packet Identifier 11
    ), UnsubAck(11)),
    Vector("pingreq", 4, C2S, b(0xC0, 0x00), PingReq()),        # PINGREQ, Remaining Length 0
    Vector("pingresp", 4, S2C, b(0xD0, 0x00), PingResp()),      # PINGRESP, Remaining Length 0
    Vector("disconnect", 4, C2S, b(0xE0, 0x00), Disconnect()),  # DISCONNECT, Remaining Length 0
]
# fmt: on


# --- MQTT 5.0 ------------------------------------------------------------------------------------

# fmt: off
V5: list[Vector] = [
    Vector("connect-minimal", 5, C2S, CONNECT_V5, Connect("c1", protocol_version=5)),
    Vector("connect-all-will-properties", 5, C2S, b(
        0x10,                  # CONNECT
        0x57,                  # Remaining Length 87
        0x00, 0x04, b"MQTT",   # Protocol Name
        0x05,                  # Protocol Level 5
        0xD6,                  # User Name 0x80 | Password 0x40 | Will QoS 2 (0x10)
                               # | Will Flag 0x04 | Clean Start 0x02
        0x00, 0x1E,            # Keep Alive 30 s
        0x12,                  # Property Length 18
        0x11, 0x00, 0x00, 0x0E, 0x10,  # Session Expiry Interval 3600
        0x21, 0x00, 0x14,      # Receive Maximum 20
        0x22, 0x00, 0x0A,      # Topic Alias Maximum 10
        0x26, 0x00, 0x01, b"k", 0x00, 0x01, b"v",  # User Property ("k", "v")
        0x00, 0x02, b"c5",     # Client Identifier
        0x24,                  # Will Property Length 36
        0x01, 0x01,            # Payload Format Indicator 1 (UTF-8)
        0x02, 0x00, 0x00, 0x00, 0x3C,  # Message Expiry Interval 60
        0x03, 0x00, 0x03, b"txt",      # Content Type
        0x08, 0x00, 0x03, b"r/t",      # Response Topic
        0x09, 0x00, 0x02, 0x01, 0x02,  # Correlation Data
        0x18, 0x00, 0x00, 0x00, 0x05,  # Will Delay Interval 5
        0x26, 0x00, 0x01, b"a", 0x00, 0x01, b"b",  # User Property ("a", "b")
        0x00, 0x03, b"w/t",    # Will Topic
        0x00, 0x04, b"gone",   # Will Payload
        0x00, 0x01, b"u",      # User Name
        0x00, 0x01, b"p",      # Password
    ), Connect(
        "c5", protocol_version=5, keepalive=30, username="u", password=b"p",
        will=Will("w/t", b"gone", qos=2, properties=Properties(
            payload_format_indicator=1, message_expiry_interval=60, content_type="txt",
            response_topic="r/t", correlation_data=b"\x01\x02", will_delay_interval=5,
            user_properties=(("a", "b"),),
        )),
        properties=Properties(
            session_expiry_interval=3600, receive_maximum=20, topic_alias_maximum=10,
            user_properties=(("k", "v"),),
        ),
    )),
    Vector("connect-enhanced-auth-password-only", 5, C2S, b(
        0x10,                  # CONNECT
        0x34,                  # Remaining Length 52
        0x00, 0x04, b"MQTT",   # Protocol Name
        0x05,                  # Protocol Level 5
        0x40,                  # Password only: 5.0 allows it without a User Name (3.1.2.9)
        0x00, 0x00,            # Keep Alive 0
        0x1D,                  # Property Length 29
        0x15, 0x00, 0x0B, b"SCRAM-SHA-1",    # Authentication Method
        0x16, 0x00, 0x03, 0x01, 0x02, 0x03,  # Authentication Data
        0x17, 0x00,            # Request Problem Information 0
        0x19, 0x01,            # Request Response Information 1
        0x27, 0x00, 0x10, 0x00, 0x00,  # Maximum Packet Size 1048576
        0x00, 0x02, b"c6",     # Client Identifier
        0x00, 0x06, b"secret",  # Password
    ), Connect(
        "c6", protocol_version=5, clean_start=False, keepalive=0, password=b"secret",
        properties=Properties(
            authentication_method="SCRAM-SHA-1", authentication_data=b"\x01\x02\x03",
            request_problem_information=False, request_response_information=True,
            maximum_packet_size=1048576,
        ),
    )),
    Vector("connack-minimal", 5, S2C, b(
        0x20, 0x03,            # CONNACK, Remaining Length 3
        0x00,                  # Acknowledge Flags: no Session Present
        0x00,                  # Success
        0x00,                  # Property Length 0
    ), ConnAck()),
    Vector("connack-not-authorized", 5, S2C, b(
        0x20, 0x03,            # CONNACK, Remaining Length 3
        0x00,                  # no Session Present [MQTT-3.2.2-6]
        0x87,                  # Not authorized
        0x00,                  # Property Length 0
    ), ConnAck(reason_code=0x87)),
    Vector("connack-every-property", 5, S2C, b(
        0x20,                  # CONNACK
        0x45,                  # Remaining Length 69
        0x01,                  # Acknowledge Flags: Session Present
        0x00,                  # Success
        0x42,                  # Property Length 66
        0x11, 0x00, 0x00, 0x00, 0x78,  # Session Expiry Interval 120
        0x12, 0x00, 0x03, b"id1",      # Assigned Client Identifier
        0x13, 0x00, 0x1E,      # Server Keep Alive 30
        0x15, 0x00, 0x01, b"M",        # Authentication Method
        0x16, 0x00, 0x01, 0xFF,        # Authentication Data
        0x1A, 0x00, 0x02, b"ri",       # Response Information
        0x1C, 0x00, 0x03, b"srv",      # Server Reference
        0x1F, 0x00, 0x02, b"ok",       # Reason String
        0x21, 0x00, 0x64,      # Receive Maximum 100
        0x22, 0x00, 0x05,      # Topic Alias Maximum 5
        0x24, 0x01,            # Maximum QoS 1
        0x25, 0x00,            # Retain Available 0
        0x26, 0x00, 0x01, b"x", 0x00, 0x01, b"y",  # User Property ("x", "y")
        0x27, 0x00, 0x10, 0x00, 0x00,  # Maximum Packet Size 1048576
        0x28, 0x01,            # Wildcard Subscription Available 1
        0x29, 0x00,            # Subscription Identifiers Available 0
        0x2A, 0x01,            # Shared Subscription Available 1
    ), ConnAck(session_present=True, properties=Properties(
        session_expiry_interval=120, assigned_client_identifier="id1", server_keep_alive=30,
        authentication_method="M", authentication_data=b"\xff", response_information="ri",
        server_reference="srv", reason_string="ok", receive_maximum=100, topic_alias_maximum=5,
        maximum_qos=1, retain_available=False, user_properties=(("x", "y"),),
        maximum_packet_size=1048576, wildcard_subscription_available=True,
        subscription_identifier_available=False, shared_subscription_available=True,
    ))),
    Vector("publish-qos0", 5, C2S, b(
        0x30,                  # PUBLISH, QoS 0
        0x0B,                  # Remaining Length 11
        0x00, 0x03, b"a/b",    # Topic Name
        0x00,                  # Property Length 0 [MQTT-2.2.2-1]
        b"hello",              # Payload
    ), Publish("a/b", b"hello")),
    Vector("publish-qos1-properties", 5, C2S, b(
        0x32,                  # PUBLISH, QoS 1
        0x34,                  # Remaining Length 52
        0x00, 0x03, b"s/t",    # Topic Name
        0x00, 0x01,            # Packet Identifier 1
        0x2A,                  # Property Length 42
        0x01, 0x01,            # Payload Format Indicator 1
        0x02, 0x00, 0x00, 0x00, 0x1E,  # Message Expiry Interval 30
        0x03, 0x00, 0x04, b"json",     # Content Type
        0x08, 0x00, 0x01, b"r",        # Response Topic
        0x09, 0x00, 0x02, b"id",       # Correlation Data
        0x23, 0x00, 0x04,      # Topic Alias 4
        0x26, 0x00, 0x01, b"k", 0x00, 0x02, b"v1",  # User Property ("k", "v1")
        0x26, 0x00, 0x01, b"k", 0x00, 0x02, b"v2",  # User Property ("k", "v2"): names repeat
        b"{}",                 # Payload
    ), Publish("s/t", b"{}", qos=1, packet_id=1, properties=Properties(
        payload_format_indicator=1, message_expiry_interval=30, content_type="json",
        response_topic="r", correlation_data=b"id", topic_alias=4,
        user_properties=(("k", "v1"), ("k", "v2")),
    ))),
    Vector("publish-topic-alias-only", 5, C2S, b(
        0x30,                  # PUBLISH, QoS 0
        0x07,                  # Remaining Length 7
        0x00, 0x00,            # Topic Name "": allowed with a Topic Alias (3.3.2.1)
        0x03,                  # Property Length 3
        0x23, 0x00, 0x04,      # Topic Alias 4
        b"z",                  # Payload
    ), Publish("", b"z", properties=Properties(topic_alias=4))),
    Vector("publish-subscription-identifiers", 5, S2C, b(
        0x35,                  # PUBLISH, QoS 2, RETAIN 1
        0x0D,                  # Remaining Length 13
        0x00, 0x03, b"a/b",    # Topic Name
        0x00, 0x02,            # Packet Identifier 2
        0x05,                  # Property Length 5
        0x0B, 0x01,            # Subscription Identifier 1
        0x0B, 0xC8, 0x01,      # Subscription Identifier 200 (two-byte VBI); may repeat (3.3.4)
    ), Publish("a/b", qos=2, retain=True, packet_id=2,
               properties=Properties(subscription_identifiers=(1, 200)))),
    Vector("publish-four-byte-utf8", 5, C2S, b(
        0x30,                  # PUBLISH
        0x07,                  # Remaining Length 7
        0x00, 0x04,            # Topic length 4
        0xF0, 0x9F, 0x99, 0x82,  # U+1F642, outside the Basic Multilingual Plane
        0x00,                  # Property Length 0
    ), Publish("\U0001f642")),
    Vector("puback-short", 5, C2S, b(
        0x40, 0x02,            # PUBACK, Remaining Length 2: Success, no properties (3.4.2.1)
        0x00, 0x01,            # Packet Identifier 1
    ), PubAck(1)),
    Vector("puback-reason-only", 5, S2C, b(
        0x40, 0x03,            # PUBACK, Remaining Length 3: no Property Length (3.4.2.2.1)
        0x00, 0x01,            # Packet Identifier 1
        0x10,                  # No matching subscribers
    ), PubAck(1, 0x10)),
    Vector("puback-properties", 5, S2C, b(
        0x40,                  # PUBACK
        0x10,                  # Remaining Length 16
        0x00, 0x01,            # Packet Identifier 1
        0x87,                  # Not authorized
        0x0C,                  # Property Length 12
        0x1F, 0x00, 0x02, b"no",                   # Reason String
        0x26, 0x00, 0x01, b"a", 0x00, 0x01, b"b",  # User Property
    ), PubAck(1, 0x87, Properties(reason_string="no", user_properties=(("a", "b"),)))),
    Vector("puback-success-with-properties", 5, C2S, b(
        0x40,                  # PUBACK
        0x09,                  # Remaining Length 9
        0x00, 0x02,            # Packet Identifier 2
        0x00,                  # Success: written, since properties follow
        0x05,                  # Property Length 5
        0x1F, 0x00, 0x02, b"ok",  # Reason String
    ), PubAck(2, 0, Properties(reason_string="ok"))),
    Vector("pubrec-reason-only", 5, C2S, b(
        0x50, 0x03,            # PUBREC, Remaining Length 3
        0x00, 0x03,            # Packet Identifier 3
        0x10,                  # No matching subscribers
    ), PubRec(3, 0x10)),
    Vector("pubrel-short", 5, S2C, b(
        0x62, 0x02,            # PUBREL, flags 0010, Remaining Length 2
        0x00, 0x04,            # Packet Identifier 4
    ), PubRel(4)),
    Vector("pubrel-reason-only", 5, C2S, b(
        0x62, 0x03,            # PUBREL, Remaining Length 3
        0x00, 0x04,            # Packet Identifier 4
        0x92,                  # Packet Identifier not found
    ), PubRel(4, 0x92)),
    Vector("pubcomp-properties", 5, S2C, b(
        0x70,                  # PUBCOMP
        0x0B,                  # Remaining Length 11
        0x00, 0x05,            # Packet Identifier 5
        0x92,                  # Packet Identifier not found
        0x07,                  # Property Length 7
        0x1F, 0x00, 0x04, b"gone",  # Reason String
    ), PubComp(5, 0x92, Properties(reason_string="gone"))),
    Vector("subscribe-options-and-identifier", 5, C2S, b(
        0x82,                  # SUBSCRIBE, flags 0010
        0x22,                  # Remaining Length 34
        0x00, 0x07,            # Packet Identifier 7
        0x0A,                  # Property Length 10
        0x0B, 0xAC, 0x02,      # Subscription Identifier 300 (0x2C + 2 * 128)
        0x26, 0x00, 0x01, b"k", 0x00, 0x01, b"v",  # User Property
        0x00, 0x03, b"a/+",    # Topic Filter
        0x2D,                  # Retain Handling 2 (0x20) | RAP 0x08 | No Local 0x04 | QoS 1
        0x00, 0x0C, b"$share/g/b/#",  # Topic Filter: a shared subscription
        0x12,                  # Retain Handling 1 (0x10) | QoS 2
    ), Subscribe(7, (
        Subscription("a/+", 1, no_local=True, retain_as_published=True, retain_handling=2),
        Subscription("$share/g/b/#", 2, retain_handling=1),
    ), Properties(subscription_identifiers=(300,), user_properties=(("k", "v"),)))),
    Vector("suback-properties", 5, S2C, b(
        0x90,                  # SUBACK
        0x0B,                  # Remaining Length 11
        0x00, 0x07,            # Packet Identifier 7
        0x04,                  # Property Length 4
        0x1F, 0x00, 0x01, b"r",  # Reason String
        0x01, 0x02,            # Granted QoS 1, Granted QoS 2
        0x8F, 0xA1,            # Topic Filter invalid, Subscription Identifiers not supported
    ), SubAck(7, (0x01, 0x02, 0x8F, 0xA1), Properties(reason_string="r"))),
    Vector("suback-minimal", 5, S2C, b(
        0x90, 0x04,            # SUBACK, Remaining Length 4
        0x00, 0x08,            # Packet Identifier 8
        0x00,                  # Property Length 0
        0x00,                  # Granted QoS 0
    ), SubAck(8, (0,))),
    Vector("unsubscribe-properties", 5, C2S, b(
        0xA2,                  # UNSUBSCRIBE, flags 0010
        0x1D,                  # Remaining Length 29
        0x00, 0x09,            # Packet Identifier 9
        0x07,                  # Property Length 7
        0x26, 0x00, 0x01, b"k", 0x00, 0x01, b"v",  # User Property
        0x00, 0x03, b"a/+",    # Topic Filter
        0x00, 0x0C, b"$share/g/b/#",  # Topic Filter
    ), Unsubscribe(9, ("a/+", "$share/g/b/#"), Properties(user_properties=(("k", "v"),)))),
    Vector("unsuback", 5, S2C, b(
        0xB0, 0x05,            # UNSUBACK, Remaining Length 5
        0x00, 0x09,            # Packet Identifier 9
        0x00,                  # Property Length 0
        0x00, 0x11,            # Success, No subscription existed
    ), UnsubAck(9, (0x00, 0x11))),
    Vector("unsuback-properties", 5, S2C, b(
        0xB0,                  # UNSUBACK
        0x09,                  # Remaining Length 9
        0x00, 0x0A,            # Packet Identifier 10
        0x05,                  # Property Length 5
        0x1F, 0x00, 0x02, b"no",  # Reason String
        0x87,                  # Not authorized
    ), UnsubAck(10, (0x87,), Properties(reason_string="no"))),
    Vector("pingreq", 5, C2S, b(0xC0, 0x00), PingReq()),    # PINGREQ, Remaining Length 0
    Vector("pingresp", 5, S2C, b(0xD0, 0x00), PingResp()),  # PINGRESP, Remaining Length 0
    Vector("disconnect-short", 5, C2S, b(
        0xE0, 0x00,            # DISCONNECT, Remaining Length 0: Normal disconnection (3.14.2.1)
    ), Disconnect()),
    Vector("disconnect-reason-only", 5, C2S, b(
        0xE0, 0x01,            # DISCONNECT, Remaining Length 1: no Property Length (3.14.2.2.1)
        0x04,                  # Disconnect with Will Message
    ), Disconnect(0x04)),
    Vector("disconnect-session-expiry", 5, C2S, b(
        0xE0,                  # DISCONNECT
        0x07,                  # Remaining Length 7
        0x00,                  # Normal disconnection: written, since properties follow
        0x05,                  # Property Length 5
        0x11, 0x00, 0x00, 0x00, 0x00,  # Session Expiry Interval 0
    ), Disconnect(0, Properties(session_expiry_interval=0))),
    Vector("disconnect-server-moved", 5, S2C, b(
        0xE0,                  # DISCONNECT
        0x12,                  # Remaining Length 18
        0x9C,                  # Use another server
        0x10,                  # Property Length 16
        0x1C, 0x00, 0x06, b"b:1883",  # Server Reference
        0x1F, 0x00, 0x04, b"move",    # Reason String
    ), Disconnect(0x9C, Properties(server_reference="b:1883", reason_string="move"))),
    Vector("disconnect-server-shutting-down", 5, S2C, b(
        0xE0, 0x01,            # DISCONNECT, Remaining Length 1
        0x8B,                  # Server shutting down
    ), Disconnect(0x8B)),
    Vector("auth-short", 5, S2C, b(
        0xF0, 0x00,            # AUTH, Remaining Length 0: Success, no properties (3.15.2.1)
    ), Auth()),
    Vector("auth-continue", 5, C2S, b(
        0xF0,                  # AUTH
        0x16,                  # Remaining Length 22
        0x18,                  # Continue authentication
        0x14,                  # Property Length 20
        0x15, 0x00, 0x0B, b"SCRAM-SHA-1",  # Authentication Method
        0x16, 0x00, 0x03, b"abc",          # Authentication Data
    ), Auth(0x18, Properties(authentication_method="SCRAM-SHA-1", authentication_data=b"abc"))),
    Vector("auth-continue-reason-string", 5, S2C, b(
        0xF0,                  # AUTH
        0x0D,                  # Remaining Length 13
        0x18,                  # Continue authentication
        0x0B,                  # Property Length 11
        0x15, 0x00, 0x01, b"M",     # Authentication Method
        0x1F, 0x00, 0x04, b"more",  # Reason String
    ), Auth(0x18, Properties(authentication_method="M", reason_string="more"))),
    Vector("auth-reauthenticate", 5, C2S, b(
        0xF0,                  # AUTH
        0x1F,                  # Remaining Length 31
        0x19,                  # Re-authenticate (4.12.1)
        0x1D,                  # Property Length 29
        0x15, 0x00, 0x0D, b"SCRAM-SHA-512",  # Authentication Method
        0x16, 0x00, 0x0A, b"n,,n=u,r=x",     # Authentication Data (a client-first-message)
    ), Auth(0x19, Properties(
        authentication_method="SCRAM-SHA-512", authentication_data=b"n,,n=u,r=x",
    ))),
    Vector("auth-success-with-data", 5, S2C, b(
        0xF0,                  # AUTH
        0x0C,                  # Remaining Length 12
        0x00,                  # Success (the end of a re-authentication)
        0x0A,                  # Property Length 10
        0x15, 0x00, 0x01, b"M",    # Authentication Method
        0x16, 0x00, 0x03, b"v=1",  # Authentication Data (a server-final-message)
    ), Auth(0x00, Properties(authentication_method="M", authentication_data=b"v=1"))),
]
# fmt: on

VECTORS: list[Vector] = V311 + V5


# --- Bad input, for a server after a valid CONNECT -----------------------------------------------


def _both(name: str, v4: bytes, v5: bytes, code: int) -> list[BadInput]:
    return [BadInput(name, 4, v4, code), BadInput(name, 5, v5, code)]


def _same(name: str, data: bytes, code: int) -> list[BadInput]:
    return _both(name, data, data, code)


# Where 3.1.1 and 5.0 differ, the 5.0 bytes carry a Property Length (0x00) after the variable
# header fields and a Remaining Length one larger.
# fmt: off
MALFORMED: list[BadInput] = [
    # Fixed header
    *_same("remaining-length-over-four-bytes", b(0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01), 0x81),
    *_same("remaining-length-not-minimal", b(0xC0, 0x80, 0x00), 0x81),  # [MQTT-1.5.5-1]
    *_same("reserved-packet-type-0", b(0x00, 0x00), 0x81),
    *_both("subscribe-fixed-header-flags-0000",  # [MQTT-3.8.1-1]
           b(0x80, 0x06, 0x00, 0x01, 0x00, 0x01, b"a", 0x00),
           b(0x80, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b"a", 0x00), 0x81),
    *_both("unsubscribe-fixed-header-flags-0000",  # [MQTT-3.10.1-1]
           b(0xA0, 0x05, 0x00, 0x01, 0x00, 0x01, b"a"),
           b(0xA0, 0x06, 0x00, 0x01, 0x00, 0x00, 0x01, b"a"), 0x81),
    *_same("pubrel-fixed-header-flags-0000", b(0x60, 0x02, 0x00, 0x01), 0x81),  # [MQTT-3.6.1-1]
    *_same("puback-fixed-header-flags-0001", b(0x41, 0x02, 0x00, 0x01), 0x81),  # [MQTT-2.1.3-1]
    *_same("pingreq-fixed-header-flags-0001", b(0xC1, 0x00), 0x81),
    *_same("disconnect-fixed-header-flags-1000", b(0xE8, 0x00), 0x81),
    # PUBLISH
    *_both("publish-qos-3",  # [MQTT-3.3.1-4]
           b(0x36, 0x06, 0x00, 0x01, b"a", 0x00, 0x07, b"x"),
           b(0x36, 0x07, 0x00, 0x01, b"a", 0x00, 0x07, 0x00, b"x"), 0x81),
    *_both("publish-dup-on-qos-0",  # [MQTT-3.3.1-2]
           b(0x38, 0x04, 0x00, 0x01, b"a", b"x"),
           b(0x38, 0x05, 0x00, 0x01, b"a", 0x00, b"x"), 0x82),
    *_both("publish-topic-invalid-utf8",  # [MQTT-1.5.4-1]
           b(0x30, 0x04, 0x00, 0x02, 0xFF, 0xFE),
           b(0x30, 0x05, 0x00, 0x02, 0xFF, 0xFE, 0x00), 0x81),
    *_both("publish-topic-utf16-surrogate",  # U+D800 encoded as UTF-8 [MQTT-1.5.4-1]
           b(0x30, 0x05, 0x00, 0x03, 0xED, 0xA0, 0x80),
           b(0x30, 0x06, 0x00, 0x03, 0xED, 0xA0, 0x80, 0x00), 0x81),
    *_both("publish-topic-overlong-utf8",  # "/" as C0 AF is not well-formed UTF-8
           b(0x30, 0x04, 0x00, 0x02, 0xC0, 0xAF),
           b(0x30, 0x05, 0x00, 0x02, 0xC0, 0xAF, 0x00), 0x81),
    *_both("publish-topic-nul",  # [MQTT-1.5.4-2]
           b(0x30, 0x04, 0x00, 0x02, b"a", 0x00),
           b(0x30, 0x05, 0x00, 0x02, b"a", 0x00, 0x00), 0x81),
    *_both("publish-topic-wildcard-plus",  # [MQTT-3.3.2-2]
           b(0x30, 0x05, 0x00, 0x03, b"a/+"),
           b(0x30, 0x06, 0x00, 0x03, b"a/+", 0x00), 0x90),
    *_both("publish-topic-wildcard-hash",  # [MQTT-3.3.2-2]
           b(0x30, 0x03, 0x00, 0x01, b"#"),
           b(0x30, 0x04, 0x00, 0x01, b"#", 0x00), 0x90),
    *_both("publish-topic-empty-no-alias",  # 3.3.2.1, [MQTT-4.7.3-1]
           b(0x30, 0x03, 0x00, 0x00, b"x"),
           b(0x30, 0x04, 0x00, 0x00, 0x00, b"x"), 0x82),
    *_same("publish-topic-overruns-packet", b(0x30, 0x03, 0x00, 0x05, b"a"), 0x81),
    *_both("publish-packet-id-0",  # [MQTT-2.2.1-3]
           b(0x32, 0x05, 0x00, 0x01, b"a", 0x00, 0x00),
           b(0x32, 0x06, 0x00, 0x01, b"a", 0x00, 0x00, 0x00), 0x82),
    *_same("publish-truncated-packet-id", b(0x32, 0x04, 0x00, 0x01, b"a", 0x00), 0x81),
    # Acknowledgements
    *_same("puback-packet-id-0", b(0x40, 0x02, 0x00, 0x00), 0x82),
    *_same("puback-truncated", b(0x40, 0x01, 0x00), 0x81),
    # SUBSCRIBE / UNSUBSCRIBE
    *_both("subscribe-no-topic-filter",  # [MQTT-3.8.3-2] (3.1.1: MQTT-3.8.3-3)
           b(0x82, 0x02, 0x00, 0x01),
           b(0x82, 0x03, 0x00, 0x01, 0x00), 0x82),
    *_both("subscribe-missing-options",
           b(0x82, 0x05, 0x00, 0x01, 0x00, 0x01, b"a"),
           b(0x82, 0x06, 0x00, 0x01, 0x00, 0x00, 0x01, b"a"), 0x81),
    *_both("subscribe-packet-id-0",
           b(0x82, 0x06, 0x00, 0x00, 0x00, 0x01, b"a", 0x00),
           b(0x82, 0x07, 0x00, 0x00, 0x00, 0x00, 0x01, b"a", 0x00), 0x82),
    *_both("subscribe-empty-topic-filter",  # [MQTT-4.7.3-1]
           b(0x82, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00),
           b(0x82, 0x06, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00), 0x82),
    *_both("subscribe-filter-invalid-utf8",  # [MQTT-3.8.3-1]
           b(0x82, 0x07, 0x00, 0x01, 0x00, 0x02, 0xC3, 0x28, 0x00),
           b(0x82, 0x08, 0x00, 0x01, 0x00, 0x00, 0x02, 0xC3, 0x28, 0x00), 0x81),
    *_both("unsubscribe-no-topic-filter",  # [MQTT-3.10.3-2]
           b(0xA2, 0x02, 0x00, 0x01),
           b(0xA2, 0x03, 0x00, 0x01, 0x00), 0x82),
    *_both("unsubscribe-empty-topic-filter",  # [MQTT-4.7.3-1]
           b(0xA2, 0x04, 0x00, 0x01, 0x00, 0x00),
           b(0xA2, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00), 0x82),
    *_both("unsubscribe-filter-invalid-utf8",  # [MQTT-3.10.3-1]
           b(0xA2, 0x06, 0x00, 0x01, 0x00, 0x02, 0xC3, 0x28),
           b(0xA2, 0x07, 0x00, 0x01, 0x00, 0x00, 0x02, 0xC3, 0x28), 0x81),
    # Other packets, and packets out of place
    *_same("pingreq-with-body", b(0xC0, 0x01, 0x00), 0x81),
    *_both("second-connect", CONNECT_V311, CONNECT_V5, 0x82),  # [MQTT-3.1.0-2]
    *_both("connack-from-client",
           b(0x20, 0x02, 0x00, 0x00),
           b(0x20, 0x03, 0x00, 0x00, 0x00), 0x82),
    *_both("suback-from-client",
           b(0x90, 0x03, 0x00, 0x01, 0x00),
           b(0x90, 0x04, 0x00, 0x01, 0x00, 0x00), 0x82),
    *_same("pingresp-from-client", b(0xD0, 0x00), 0x82),
    *_same("packet-after-disconnect", b(0xE0, 0x00, 0xC0, 0x00), 0x82),  # [MQTT-3.14.4-1]
    # Remaining Length 268,435,455: refused from the header alone, before any body arrives.
    *_same("publish-too-large", b(0x30, 0xFF, 0xFF, 0xFF, 0x7F), 0x95),
    # MQTT 3.1.1 only
    BadInput("v311-puback-with-reason-code", 4, b(0x40, 0x03, 0x00, 0x01, 0x00), 0x81),
    BadInput("v311-disconnect-with-body", 4, b(0xE0, 0x01, 0x00), 0x81),
    BadInput("v311-auth-packet-type-reserved", 4, b(0xF0, 0x00), 0x81),
    BadInput("v311-subscribe-reserved-qos-bits", 4,  # [MQTT-3-8.3-4]
             b(0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b"a", 0x04), 0x81),
    BadInput("v311-subscribe-qos-3", 4,  # [MQTT-3-8.3-4]
             b(0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b"a", 0x03), 0x81),
    # MQTT 5.0 only
    BadInput("v5-puback-unknown-reason-code", 5, b(0x40, 0x03, 0x00, 0x01, 0x05), 0x82),
    BadInput("v5-pubrel-reason-code-of-puback", 5, b(0x62, 0x03, 0x00, 0x01, 0x10), 0x82),
    BadInput("v5-disconnect-unknown-reason-code", 5, b(0xE0, 0x01, 0x03), 0x82),
    BadInput("v5-auth-without-method-in-connect", 5, b(0xF0, 0x00), 0x82),  # [MQTT-4.12.0-7]
    BadInput("v5-puback-trailing-byte", 5, b(0x40, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00), 0x81),
    BadInput("v5-disconnect-trailing-byte", 5, b(0xE0, 0x03, 0x00, 0x00, 0x00), 0x81),
    BadInput("v5-subscribe-reserved-option-bits", 5,  # [MQTT-3.8.3-5]
             b(0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b"a", 0x40), 0x81),
    BadInput("v5-subscribe-qos-3", 5,  # 3.8.3.1
             b(0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b"a", 0x03), 0x82),
    BadInput("v5-subscribe-retain-handling-3", 5,  # 3.8.3.1
             b(0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b"a", 0x30), 0x82),
    BadInput("v5-subscribe-no-local-on-shared", 5,  # [MQTT-3.8.3-4]
             b(0x82, 0x10, 0x00, 0x01, 0x00, 0x00, 0x0A, b"$share/g/a", 0x04), 0x82),
    BadInput("v5-property-unknown-identifier", 5,  # 2.2.2.2
             b(0x30, 0x07, 0x00, 0x01, b"a", 0x02, 0x7F, 0x00, b"x"), 0x81),
    BadInput("v5-property-not-allowed-in-publish", 5,  # 2.2.2.2: Server Keep Alive is CONNACK's
             b(0x30, 0x08, 0x00, 0x01, b"a", 0x03, 0x13, 0x00, 0x05, b"x"), 0x81),
    BadInput("v5-property-duplicated", 5,  # Payload Format Indicator twice
             b(0x30, 0x08, 0x00, 0x01, b"a", 0x04, 0x01, 0x00, 0x01, 0x01), 0x82),
    BadInput("v5-property-overruns-property-length", 5,  # a Four Byte Integer, 1-byte block
             b(0x30, 0x09, 0x00, 0x01, b"a", 0x01, 0x02, 0x00, 0x00, 0x00, 0x05), 0x81),
    BadInput("v5-property-string-overruns-property-length", 5,  # Content Type of 5 bytes
             b(0x30, 0x07, 0x00, 0x01, b"a", 0x03, 0x03, 0x00, 0x05), 0x81),
    BadInput("v5-user-property-value-overruns-property-length", 5,
             b(0x30, 0x0A, 0x00, 0x01, b"a", 0x06, 0x26, 0x00, 0x01, b"k", 0x00, 0x05), 0x81),
    BadInput("v5-property-length-overruns-packet", 5,
             b(0x30, 0x06, 0x00, 0x01, b"a", 0x09, 0x01, 0x00), 0x81),
    BadInput("v5-topic-alias-0", 5,  # [MQTT-3.3.2-8], 3.3.4
             b(0x30, 0x08, 0x00, 0x01, b"a", 0x03, 0x23, 0x00, 0x00, b"x"), 0x94),
    BadInput("v5-subscription-identifier-from-client", 5,  # [MQTT-3.3.4-6]
             b(0x30, 0x07, 0x00, 0x01, b"a", 0x02, 0x0B, 0x01, b"x"), 0x82),
    BadInput("v5-payload-format-indicator-2", 5,  # 3.3.2.3.2
             b(0x30, 0x07, 0x00, 0x01, b"a", 0x02, 0x01, 0x02, b"x"), 0x82),
    BadInput("v5-response-topic-wildcard", 5,  # [MQTT-3.3.2-14]
             b(0x30, 0x0B, 0x00, 0x01, b"a", 0x06, 0x08, 0x00, 0x03, b"r/+", b"x"), 0x82),
    BadInput("v5-user-property-invalid-utf8", 5,  # [MQTT-1.5.4-1] inside a UTF-8 String Pair
             b(0x30, 0x0C, 0x00, 0x01, b"a", 0x07,
               0x26, 0x00, 0x01, b"k", 0x00, 0x01, 0xFF, b"x"), 0x81),
    BadInput("v5-subscribe-subscription-identifier-0", 5,  # 3.8.2.1.2
             b(0x82, 0x09, 0x00, 0x01, 0x02, 0x0B, 0x00, 0x00, 0x01, b"a", 0x00), 0x82),
    BadInput("v5-subscribe-subscription-identifier-twice", 5,  # 3.8.2.1.2
             b(0x82, 0x0B, 0x00, 0x01, 0x04, 0x0B, 0x01, 0x0B, 0x02, 0x00, 0x01, b"a", 0x00),
             0x82),
    BadInput("v5-disconnect-session-expiry-twice", 5,  # 3.14.2.2.2
             b(0xE0, 0x0C, 0x00, 0x0A, 0x11, 0, 0, 0, 1, 0x11, 0, 0, 0, 2), 0x82),
    BadInput("v5-puback-property-not-allowed", 5,  # 2.2.2.2: Server Keep Alive on a PUBACK
             b(0x40, 0x07, 0x00, 0x01, 0x80, 0x03, 0x13, 0x00, 0x05), 0x81),
]
# fmt: on


# --- Bad input from the first byte of a connection, for a server ---------------------------------


def _connect(version: int, flags: int, props: bytes, rest: bytes) -> bytes:
    """A CONNECT with Keep Alive 60: the Remaining Length is counted here, the rest is literal."""
    body = b(0x00, 0x04, b"MQTT", version, flags, 0x00, 0x3C)
    if version == 5:
        body += bytes((len(props),)) + props
    body += rest
    assert len(body) < 128
    return b(0x10, len(body), body)


_CID = b(0x00, 0x02, b"c1")  # Client Identifier "c1"


def _connects(name: str, flags: int, rest: bytes, code: int) -> list[BadInput]:
    return _both(name, _connect(4, flags, b"", rest), _connect(5, flags, b"", rest), code)


def _will(version: int, topic: bytes, payload: bytes) -> bytes:
    """Client Identifier, then the Will fields (with an empty Will Property Length in 5.0)."""
    props = b"\x00" if version == 5 else b""
    return _CID + props + b(0x00, len(topic), topic, 0x00, len(payload), payload)


# fmt: off
MALFORMED_CONNECT: list[BadInput] = [
    *_connects("connect-reserved-flag", 0x03, _CID, 0x81),  # [MQTT-3.1.2-3]
    *_both("connect-will-qos-3",  # Will Flag 0x04 | Will QoS 3 (0x18) | Clean Start 0x02
           _connect(4, 0x1E, b"", _will(4, b"w", b"x")),
           _connect(5, 0x1E, b"", _will(5, b"w", b"x")), 0x81),
    *_connects("connect-will-qos-without-will-flag", 0x0A, _CID, 0x81),  # [MQTT-3.1.2-11]
    *_connects("connect-will-retain-without-will-flag", 0x22, _CID, 0x81),  # [MQTT-3.1.2-13]
    *_connects("connect-will-flag-without-will-fields", 0x06, _CID, 0x81),  # [MQTT-3.1.2-9]
    *_connects("connect-username-flag-without-username", 0x82, _CID, 0x81),  # [MQTT-3.1.2-17]
    *_connects("connect-password-flag-without-password", 0xC2, _CID + b"\x00\x01u", 0x81),
    *_connects("connect-trailing-bytes", 0x02, _CID + b"\x00", 0x81),
    *_connects("connect-client-id-invalid-utf8", 0x02, b(0x00, 0x02, 0xC3, 0x28), 0x81),
    *_connects("connect-client-id-surrogate", 0x02, b(0x00, 0x03, 0xED, 0xA0, 0x80), 0x81),
    *_connects("connect-client-id-nul", 0x02, b(0x00, 0x02, b"a", 0x00), 0x81),
    *_both("connect-will-topic-wildcard",  # 5.0 has CONNACK 0x90 for it (3.2.2.2)
           _connect(4, 0x06, b"", _will(4, b"w/#", b"x")),
           _connect(5, 0x06, b"", _will(5, b"w/#", b"x")), 0x90),
    *_both("connect-protocol-name-not-mqtt",  # [MQTT-3.1.2-1]
           b(0x10, 0x0E, 0x00, 0x04, b"MQTX", 0x04, 0x02, 0x00, 0x3C, _CID),
           b(0x10, 0x0F, 0x00, 0x04, b"MQTX", 0x05, 0x02, 0x00, 0x3C, 0x00, _CID), 0x84),
    BadInput("connect-mqisdp-level-3", 4,  # MQTT 3.1: the edge refuses it with CONNACK 0x01
             b(0x10, 0x10, 0x00, 0x06, b"MQIsdp", 0x03, 0x02, 0x00, 0x3C, _CID), 0x84),
    BadInput("connect-protocol-level-6", 5,  # [MQTT-3.1.2-2]
             b(0x10, 0x0F, 0x00, 0x04, b"MQTT", 0x06, 0x02, 0x00, 0x3C, 0x00, _CID), 0x84),
    *_same("connect-truncated-protocol-name", b(0x10, 0x03, 0x00, 0x04, b"M"), 0x81),
    *_both("connect-truncated-after-protocol-level",
           b(0x10, 0x07, 0x00, 0x04, b"MQTT", 0x04),
           b(0x10, 0x07, 0x00, 0x04, b"MQTT", 0x05), 0x81),
    *_same("publish-before-connect", b(0x30, 0x03, 0x00, 0x01, b"a"), 0x82),  # [MQTT-3.1.0-1]
    *_same("pingreq-before-connect", b(0xC0, 0x00), 0x82),
    # MQTT 3.1.1 only
    BadInput("v311-connect-password-without-username", 4,  # [MQTT-3.1.2-22]
             _connect(4, 0x42, b"", _CID + b"\x00\x01p"), 0x81),
    # MQTT 5.0 only
    BadInput("v5-connect-receive-maximum-0", 5,  # 3.1.2.11.3
             _connect(5, 0x02, b(0x21, 0x00, 0x00), _CID), 0x82),
    BadInput("v5-connect-maximum-packet-size-0", 5,  # 3.1.2.11.4
             _connect(5, 0x02, b(0x27, 0x00, 0x00, 0x00, 0x00), _CID), 0x82),
    BadInput("v5-connect-request-problem-information-2", 5,  # 3.1.2.11.7
             _connect(5, 0x02, b(0x17, 0x02), _CID), 0x82),
    BadInput("v5-connect-authentication-data-without-method", 5,  # 3.1.2.11.10
             _connect(5, 0x02, b(0x16, 0x00, 0x01, b"d"), _CID), 0x82),
    BadInput("v5-connect-topic-alias", 5,  # 2.2.2.2: Topic Alias is a PUBLISH property
             _connect(5, 0x02, b(0x23, 0x00, 0x01), _CID), 0x81),
    BadInput("v5-connect-will-property-not-allowed", 5,  # 2.2.2.2: not a Will Property
             _connect(5, 0x06, b"", _CID + b(
                 0x05, 0x11, 0, 0, 0, 1,  # Will Properties: Session Expiry Interval 1
                 0x00, 0x01, b"w",        # Will Topic
                 0x00, 0x01, b"x",        # Will Payload
             )), 0x81),
    BadInput("v5-connect-will-delay-twice", 5,  # 3.1.3.2.2
             _connect(5, 0x06, b"", _CID + b(
                 0x0A, 0x18, 0, 0, 0, 1, 0x18, 0, 0, 0, 2,  # Will Delay Interval twice
                 0x00, 0x01, b"w",        # Will Topic
                 0x00, 0x01, b"x",        # Will Payload
             )), 0x82),
]
# fmt: on


# --- Bad input for a client that has sent its CONNECT --------------------------------------------


def _after_connack(version: int, data: bytes) -> bytes:
    return CONNACK_BYTES[version] + data


# fmt: off
MALFORMED_FROM_SERVER: list[BadInput] = [
    *_both("connack-reserved-acknowledge-flags",  # [MQTT-3.2.2-1]
           b(0x20, 0x02, 0x02, 0x00),
           b(0x20, 0x03, 0x02, 0x00, 0x00), 0x81),
    *_both("connack-session-present-with-refusal",  # [MQTT-3.2.2-6] (3.1.1: MQTT-3.2.2-4)
           b(0x20, 0x02, 0x01, 0x05),
           b(0x20, 0x03, 0x01, 0x87, 0x00), 0x82),
    *_same("publish-before-connack", b(0x30, 0x03, 0x00, 0x01, b"a"), 0x82),  # [MQTT-3.2.0-1]
    *_both("second-connack", CONNACK_BYTES[4] * 2, CONNACK_BYTES[5] * 2, 0x82),  # [MQTT-3.2.0-2]
    *_both("subscribe-from-server",
           _after_connack(4, b(0x82, 0x06, 0x00, 0x01, 0x00, 0x01, b"a", 0x00)),
           _after_connack(5, b(0x82, 0x07, 0x00, 0x01, 0x00, 0x00, 0x01, b"a", 0x00)), 0x82),
    *_both("suback-without-reason-codes",  # [MQTT-3.9.3-2]
           _after_connack(4, b(0x90, 0x02, 0x00, 0x01)),
           _after_connack(5, b(0x90, 0x03, 0x00, 0x01, 0x00)), 0x82),
    *_both("suback-unknown-reason-code",
           _after_connack(4, b(0x90, 0x03, 0x00, 0x01, 0x03)),
           _after_connack(5, b(0x90, 0x04, 0x00, 0x01, 0x00, 0x03)), 0x82),
    BadInput("v311-connack-return-code-6", 4, b(0x20, 0x02, 0x00, 0x06), 0x82),
    BadInput("v311-connack-too-long", 4, b(0x20, 0x03, 0x00, 0x00, 0x00), 0x81),
    BadInput("v311-suback-topic-filter-invalid", 4,  # 0x8F exists in 5.0 only
             _after_connack(4, b(0x90, 0x03, 0x00, 0x01, 0x8F)), 0x82),
    BadInput("v311-unsuback-with-payload", 4,
             _after_connack(4, b(0xB0, 0x03, 0x00, 0x01, 0x00)), 0x81),
    BadInput("v311-disconnect-from-server", 4, _after_connack(4, b(0xE0, 0x00)), 0x82),
    BadInput("v5-connack-reason-code-0x01", 5, b(0x20, 0x03, 0x00, 0x01, 0x00), 0x82),
    BadInput("v5-connack-trailing-byte", 5, b(0x20, 0x04, 0x00, 0x00, 0x00, 0x00), 0x81),
    BadInput("v5-unsuback-without-reason-codes", 5,  # [MQTT-3.11.3-2]
             _after_connack(5, b(0xB0, 0x03, 0x00, 0x01, 0x00)), 0x82),
    BadInput("v5-unsuback-unknown-reason-code", 5,  # [MQTT-3.11.3-2]
             _after_connack(5, b(0xB0, 0x04, 0x00, 0x01, 0x00, 0x05)), 0x82),
    BadInput("v5-auth-without-method", 5,  # 3.15.2.2.2
             _after_connack(5, b(0xF0, 0x02, 0x18, 0x00)), 0x82),
    BadInput("v5-auth-unknown-reason-code", 5,  # [MQTT-3.15.2-1]
             _after_connack(5, b(0xF0, 0x02, 0x10, 0x00)), 0x82),
]
# fmt: on


# --- Feeding helpers -----------------------------------------------------------------------------

#: The error class the codec uses for each reason code.
ERROR_CLASSES: dict[int, type[MQTTError]] = {
    0x81: MalformedPacket,
    0x82: ProtocolError,
    0x84: UnsupportedProtocolVersion,
    0x8F: TopicFilterInvalid,
    0x90: TopicNameInvalid,
    0x94: TopicAliasInvalid,
    0x95: PacketTooLarge,
}


def drain(conn: MQTTConnection) -> list[Packet]:
    """Every packet the connection can produce from what it has buffered."""
    packets = []
    while (event := conn.next_event()) is not NEED_DATA:
        packets.append(event)
    return packets


def first_error(conn: MQTTConnection, data: bytes, *, byte_by_byte: bool = False) -> MQTTError:
    """Feed ``data`` and read packets until one fails; the failure must happen."""
    chunks = [data[i : i + 1] for i in range(len(data))] if byte_by_byte else [data]
    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            drain(conn)
    except MQTTError as exc:
        return exc
    raise AssertionError(f"no error from {data.hex()}")


def server(prelude: bytes = b"", max_packet_size: int = MAX_PACKET_SIZE) -> MQTTConnection:
    """A server connection that has consumed ``prelude`` (usually a CONNECT)."""
    conn = MQTTConnection(Role.SERVER, max_packet_size=max_packet_size)
    conn.receive_data(prelude)
    drain(conn)
    return conn


def client(version: int, prelude: bytes = b"") -> MQTTConnection:
    """A client connection for ``version`` that has consumed ``prelude`` (usually a CONNACK)."""
    conn = MQTTConnection(Role.CLIENT, protocol_version=version)
    conn.receive_data(prelude)
    drain(conn)
    return conn


def revalidate(packet: object) -> None:
    """Rebuild ``packet`` (and what it nests) through ``__init__``.

    The decoder's fast paths skip ``__post_init__``; this proves every decoded packet satisfies
    the dataclass invariants anyway.
    """
    if not dataclasses.is_dataclass(packet) or isinstance(packet, type):
        return
    for field in dataclasses.fields(packet):
        value = getattr(packet, field.name)
        for item in value if isinstance(value, tuple) else (value,):
            revalidate(item)
    rebuilt = dataclasses.replace(packet)
    assert rebuilt == packet
    assert hash(rebuilt) == hash(packet)
