"""The connection object: framing, state, roles, limits and the failed state."""

from __future__ import annotations

import pytest

from hexmq.mqtt import (
    MAX_PACKET_SIZE,
    NEED_DATA,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    MQTTConnection,
    PacketTooLarge,
    PingReq,
    PingResp,
    Properties,
    ProtocolError,
    Publish,
    Role,
    SubAck,
    Subscribe,
    Subscription,
    UnsupportedProtocolVersion,
    encode,
)
from tests.unit.mqtt.vectors import (
    CONNACK_BYTES,
    CONNECT_BYTES,
    CONNECT_V5_AUTH,
    MALFORMED_CONNECT,
    client,
    drain,
    first_error,
    server,
)


def test_protocol_version_comes_from_connect() -> None:
    for version in (4, 5):
        conn = MQTTConnection(Role.SERVER)
        assert conn.protocol_version is None
        conn.receive_data(CONNECT_BYTES[version][:-1])
        assert conn.next_event() is NEED_DATA
        assert conn.protocol_version is None
        conn.receive_data(CONNECT_BYTES[version][-1:])
        assert conn.next_event() == Connect("c1", protocol_version=version)
        assert conn.protocol_version == version


def test_protocol_version_is_known_even_when_the_rest_of_connect_is_bad() -> None:
    # So the edge can refuse a broken 5.0 CONNECT with a 5.0 CONNACK (4.13.1).
    case = next(c for c in MALFORMED_CONNECT if c.name == "v5-connect-receive-maximum-0")
    conn = server()
    first_error(conn, case.data)
    assert conn.protocol_version == 5


@pytest.mark.parametrize(
    ("data", "name", "level"),
    [
        (b"\x10\x0e\x00\x04MQTX\x04\x02\x00\x3c\x00\x02c1", "MQTX", 4),
        (b"\x10\x10\x00\x06MQIsdp\x03\x02\x00\x3c\x00\x02c1", "MQIsdp", 3),
        (b"\x10\x0e\x00\x04MQTT\x06\x02\x00\x3c\x00\x02c1", "MQTT", 6),
    ],
)
def test_unsupported_protocol_says_what_the_client_asked_for(
    data: bytes, name: str, level: int
) -> None:
    conn = server()
    error = first_error(conn, data)
    assert isinstance(error, UnsupportedProtocolVersion)
    assert error.reason_code == 0x84
    assert (error.protocol_name, error.protocol_level) == (name, level)
    assert conn.protocol_version is None


def test_packet_too_large_is_refused_from_the_header_alone() -> None:
    conn = server(CONNECT_BYTES[4], max_packet_size=100)
    # 0x30, Remaining Length 98: 100 bytes in all, exactly the limit, body not sent yet.
    conn.receive_data(b"\x30\x62")
    assert conn.next_event() is NEED_DATA
    conn = server(CONNECT_BYTES[4], max_packet_size=100)
    conn.receive_data(b"\x30\x63")  # 101 bytes: refused before the body arrives
    with pytest.raises(PacketTooLarge) as info:
        conn.next_event()
    assert info.value.reason_code == 0x95


def test_packet_too_large_with_a_multi_byte_remaining_length() -> None:
    conn = server(CONNECT_BYTES[5], max_packet_size=1000)
    conn.receive_data(b"\x30\x80")  # the Remaining Length is not complete yet
    assert conn.next_event() is NEED_DATA
    conn.receive_data(b"\x08")  # 1024 + 3 bytes
    with pytest.raises(PacketTooLarge):
        conn.next_event()


def test_max_packet_size_can_change_between_packets() -> None:
    conn = server(CONNECT_BYTES[4])
    packet = Publish("t", b"x" * 50)
    data = encode(packet, 4)
    conn.receive_data(data)
    assert conn.next_event() == packet
    conn.set_max_packet_size(len(data) - 1)
    assert conn.max_packet_size == len(data) - 1
    conn.receive_data(data)
    with pytest.raises(PacketTooLarge):
        conn.next_event()


@pytest.mark.parametrize("size", [0, 1, MAX_PACKET_SIZE + 1])
def test_max_packet_size_bounds(size: int) -> None:
    with pytest.raises(ValueError, match="max_packet_size"):
        MQTTConnection(Role.SERVER, max_packet_size=size)


def test_bad_protocol_version_argument() -> None:
    with pytest.raises(ValueError, match="protocol_version"):
        MQTTConnection(Role.CLIENT, protocol_version=3)


def test_error_state_is_sticky_and_ignores_new_data() -> None:
    conn = server(CONNECT_BYTES[4])
    conn.receive_data(b"\x36\x00")  # PUBLISH QoS 3
    with pytest.raises(MalformedPacket) as first:
        conn.next_event()
    conn.receive_data(b"\xc0\x00")
    with pytest.raises(MalformedPacket) as second:
        conn.next_event()
    assert second.value is first.value


def test_wrong_first_byte_fails_before_the_rest_arrives() -> None:
    conn = server(CONNECT_BYTES[4])
    conn.receive_data(b"\x00")  # reserved type 0: nothing after it can make it valid
    with pytest.raises(MalformedPacket):
        conn.next_event()


def test_many_packets_in_one_read_and_buffer_compaction() -> None:
    conn = server(CONNECT_BYTES[5])
    packets = [Publish(f"t/{i}", bytes(i % 200), qos=1, packet_id=i + 1) for i in range(3000)]
    stream = b"".join(encode(p, 5) for p in packets)
    received = []
    # Uneven chunks, so packets straddle reads and the consumed prefix gets reclaimed.
    for start in range(0, len(stream), 7919):
        conn.receive_data(stream[start : start + 7919])
        received.extend(drain(conn))
    assert received == packets
    assert conn.buffered_bytes == 0


def test_buffered_bytes() -> None:
    conn = server(CONNECT_BYTES[4])
    conn.receive_data(b"\xc0\x00\xc0")
    assert conn.buffered_bytes == 3
    assert conn.next_event() == PingReq()
    assert conn.buffered_bytes == 1
    assert conn.next_event() is NEED_DATA


def test_subscription_identifier_is_refused_from_a_client_but_not_from_a_server() -> None:
    packet = Publish("a", properties=Properties(subscription_identifiers=(5,)))
    conn = server(CONNECT_BYTES[5])
    conn.receive_data(encode(packet, 5))
    with pytest.raises(ProtocolError, match="Subscription Identifier"):
        conn.next_event()
    conn = client(5, CONNACK_BYTES[5])
    conn.receive_data(encode(packet, 5))
    assert conn.next_event() == packet


def test_auth_needs_an_authentication_method_in_connect() -> None:
    auth = Auth(0x18, Properties(authentication_method="M"))
    conn = server(CONNECT_V5_AUTH)
    conn.receive_data(encode(auth, 5))
    assert conn.next_event() == auth
    conn = server(CONNECT_BYTES[5])
    conn.receive_data(encode(auth, 5))
    with pytest.raises(ProtocolError, match=r"MQTT-4\.12\.0-7"):
        conn.next_event()


def test_client_role_handshake() -> None:
    conn = MQTTConnection(Role.CLIENT)
    assert conn.protocol_version is None
    # Nothing can come from the server before our CONNECT.
    conn.receive_data(CONNACK_BYTES[5])
    with pytest.raises(ProtocolError):
        conn.next_event()

    conn = MQTTConnection(Role.CLIENT)
    assert conn.send(Connect("c1", protocol_version=5)) == CONNECT_BYTES[5]
    assert conn.protocol_version == 5
    # The server may not send AUTH: our CONNECT named no method [MQTT-4.12.0-6].
    conn.receive_data(b"\xf0\x00")
    with pytest.raises(ProtocolError):
        conn.next_event()

    conn = MQTTConnection(Role.CLIENT)
    conn.send(Connect("c1", protocol_version=5, properties=Properties(authentication_method="M")))
    auth = Auth(0x18, Properties(authentication_method="M"))
    conn.receive_data(encode(auth, 5) + CONNACK_BYTES[5] + b"\xd0\x00")
    assert drain(conn) == [auth, ConnAck(), PingResp()]


def test_client_refuses_client_packets_and_a_second_connack() -> None:
    conn = client(4, CONNACK_BYTES[4])
    conn.receive_data(b"\xc0\x00")  # PINGREQ comes from clients only
    with pytest.raises(ProtocolError, match="not sent by a server"):
        conn.next_event()
    conn = client(5, CONNACK_BYTES[5])
    conn.receive_data(CONNACK_BYTES[5])
    with pytest.raises(ProtocolError, match=r"MQTT-3\.2\.0-2"):
        conn.next_event()


def test_server_refuses_server_packets() -> None:
    conn = server(CONNECT_BYTES[5])
    conn.receive_data(b"\xd0\x00")
    with pytest.raises(ProtocolError, match="not sent by a client"):
        conn.next_event()


def test_disconnect_from_the_server_closes_a_5_0_client() -> None:
    conn = client(5, CONNACK_BYTES[5])
    conn.receive_data(b"\xe0\x01\x8b" + b"\xd0\x00")
    assert conn.next_event() == Disconnect(0x8B)
    with pytest.raises(ProtocolError, match="after DISCONNECT"):
        conn.next_event()


def test_send_checks_the_role() -> None:
    conn = server(CONNECT_BYTES[4])
    with pytest.raises(ValueError, match="does not send"):
        conn.send(PingReq())
    with pytest.raises(ValueError, match="does not send"):
        conn.send(Subscribe(1, (Subscription("a"),)))
    assert conn.send(SubAck(1, (0,))) == b"\x90\x03\x00\x01\x00"
    cli = MQTTConnection(Role.CLIENT, protocol_version=4)
    with pytest.raises(ValueError, match="does not send"):
        cli.send(PingResp())


def test_server_cannot_send_before_it_knows_the_version() -> None:
    conn = MQTTConnection(Role.SERVER)
    with pytest.raises(ValueError, match="encode"):
        conn.send(ConnAck(reason_code=1))
    # What the edge does instead for a refused CONNECT:
    assert encode(ConnAck(reason_code=1), 4) == b"\x20\x02\x00\x01"


def test_send_after_disconnect() -> None:
    conn = server(CONNECT_BYTES[5])
    assert conn.send(Disconnect(0x8B)) == b"\xe0\x01\x8b"
    with pytest.raises(ValueError, match="after DISCONNECT"):
        conn.send(PingResp())


def test_client_connect_must_match_the_configured_version() -> None:
    conn = MQTTConnection(Role.CLIENT, protocol_version=4)
    with pytest.raises(ValueError, match="level 4"):
        conn.send(Connect("c1", protocol_version=5))


def test_send_uses_the_connection_version() -> None:
    v4 = server(CONNECT_BYTES[4])
    v5 = server(CONNECT_BYTES[5])
    assert v4.send(Publish("a")) == b"\x30\x03\x00\x01a"
    assert v5.send(Publish("a")) == b"\x30\x04\x00\x01a\x00"
    with pytest.raises(ValueError, match=r"5\.0"):
        v4.send(Publish("a", properties=Properties(message_expiry_interval=1)))


def test_role_and_repr_of_need_data() -> None:
    assert server().role is Role.SERVER
    assert repr(NEED_DATA) == "NEED_DATA"
    assert Properties() == NO_PROPERTIES


def test_error_repr_and_codes() -> None:
    error = PacketTooLarge("too big")
    assert repr(error) == "PacketTooLarge('too big', reason_code=0x95)"
    assert str(error) == "too big"
    assert MalformedPacket("x", reason_code=0x99).reason_code == 0x99
