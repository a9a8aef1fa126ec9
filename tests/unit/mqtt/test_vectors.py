"""Every golden vector decodes whole, byte by byte and followed by more bytes, and encodes back."""

from __future__ import annotations

import pytest

from hexmq.mqtt import (
    NEED_DATA,
    Connect,
    Disconnect,
    MQTTConnection,
    PacketType,
    ProtocolError,
    Role,
    decode,
    encode,
)
from tests.unit.mqtt.vectors import (
    C2S,
    CONNECT_BYTES,
    S2C,
    VECTORS,
    Vector,
    client,
    prelude,
    revalidate,
    server,
)


def _id(vector: Vector) -> str:
    return f"{'3.1.1' if vector.protocol_version == 4 else '5.0'}-{vector.name}"


def _receiver(vector: Vector) -> MQTTConnection:
    """The side that receives ``vector``, with whatever must come first already consumed."""
    if vector.direction == C2S:
        return server(prelude(vector))
    return client(vector.protocol_version, prelude(vector))


def _publish(version: int) -> bytes:
    """A QoS 0 PUBLISH "a" with no payload: valid in both directions, after the handshake."""
    return b"\x30\x03\x00\x01a" if version == 4 else b"\x30\x04\x00\x01a\x00"


parametrize_vectors = pytest.mark.parametrize("vector", VECTORS, ids=_id)


@parametrize_vectors
def test_remaining_length_matches_the_bytes(vector: Vector) -> None:
    # Checked independently of the codec, so a miscounted vector cannot agree with a buggy decoder.
    data = vector.data
    length, shift, i = 0, 0, 1
    while True:
        length |= (data[i] & 0x7F) << shift
        shift += 7
        i += 1
        if data[i - 1] < 0x80:
            break
    assert len(data) - i == length


@parametrize_vectors
def test_decode_whole(vector: Vector) -> None:
    conn = _receiver(vector)
    conn.receive_data(vector.data)
    assert conn.next_event() == vector.packet
    assert conn.next_event() is NEED_DATA
    assert conn.buffered_bytes == 0


@parametrize_vectors
def test_decode_byte_by_byte(vector: Vector) -> None:
    conn = _receiver(vector)
    for i in range(len(vector.data) - 1):
        conn.receive_data(vector.data[i : i + 1])
        assert conn.next_event() is NEED_DATA
    conn.receive_data(vector.data[-1:])
    assert conn.next_event() == vector.packet
    assert conn.next_event() is NEED_DATA


@parametrize_vectors
def test_decode_with_a_partial_packet_after(vector: Vector) -> None:
    conn = _receiver(vector)
    partial = _publish(vector.protocol_version)[:3]
    conn.receive_data(vector.data + partial)
    assert conn.next_event() == vector.packet
    if isinstance(vector.packet, Disconnect):
        # Nothing may follow a DISCONNECT [MQTT-3.14.4-1]; the first byte is enough to know.
        with pytest.raises(ProtocolError):
            conn.next_event()
        return
    assert conn.next_event() is NEED_DATA
    assert conn.buffered_bytes == len(partial)


@pytest.mark.parametrize(
    "vector", [v for v in VECTORS if not isinstance(v.packet, Disconnect)], ids=_id
)
def test_decode_with_a_whole_packet_after(vector: Vector) -> None:
    conn = _receiver(vector)
    follow = _publish(vector.protocol_version)
    conn.receive_data(vector.data + follow + follow[:1])
    assert conn.next_event() == vector.packet
    assert conn.next_event() == decode(follow, vector.protocol_version)
    assert conn.next_event() is NEED_DATA
    assert conn.buffered_bytes == 1


@parametrize_vectors
def test_decode_function(vector: Vector) -> None:
    assert decode(vector.data, vector.protocol_version) == vector.packet


@parametrize_vectors
def test_decoded_packet_satisfies_the_dataclass_invariants(vector: Vector) -> None:
    conn = _receiver(vector)
    conn.receive_data(vector.data)
    revalidate(conn.next_event())


@parametrize_vectors
def test_encode(vector: Vector) -> None:
    assert encode(vector.packet, vector.protocol_version) == vector.data


@parametrize_vectors
def test_send(vector: Vector) -> None:
    if vector.direction == C2S:
        sender = MQTTConnection(Role.CLIENT, protocol_version=vector.protocol_version)
    else:
        sender = server(CONNECT_BYTES[vector.protocol_version])
    assert sender.send(vector.packet) == vector.data


def test_every_packet_type_has_vectors_in_both_versions() -> None:
    for version in (4, 5):
        covered = {
            (type(v.packet).packet_type, v.direction)
            for v in VECTORS
            if v.protocol_version == version
        }
        types = {t for t, _ in covered}
        expected = set(PacketType) - ({PacketType.AUTH} if version == 4 else set())
        assert types == expected
        # PUBLISH flows both ways.
        assert {(PacketType.PUBLISH, C2S), (PacketType.PUBLISH, S2C)} <= covered


def test_connect_vectors_name_their_own_version() -> None:
    for vector in VECTORS:
        if isinstance(vector.packet, Connect):
            assert vector.packet.protocol_version == vector.protocol_version
