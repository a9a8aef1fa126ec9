"""Property tests: bad bytes only ever raise MQTTError; valid packets round-trip.

Every decoded packet is also rebuilt through its dataclass ``__init__`` (``revalidate``), since the
decoder's fast paths skip ``__post_init__``. Any exception other than MQTTError fails the test, and
so does an MQTTError converted from another exception (``__cause__`` set): the codec must detect
every problem itself.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hexmq.mqtt import (
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MQTTConnection,
    MQTTError,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Role,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
    decode,
    encode,
)
from hexmq.mqtt.properties import PROPERTY_SPECS, WILL_PROPERTIES, PropertyType
from hexmq.mqtt.reason_codes import (
    AUTH_REASON_CODES,
    CONNACK_REASON_CODES,
    DISCONNECT_REASON_CODES,
    PUBACK_REASON_CODES,
    PUBREL_REASON_CODES,
    SUBACK_REASON_CODES,
    SUBACK_RETURN_CODES_V311,
    UNSUBACK_REASON_CODES,
)
from tests.unit.mqtt.vectors import (
    C2S,
    CONNACK_BYTES,
    CONNECT_BYTES,
    CONNECT_V5_AUTH,
    VECTORS,
    Vector,
    client,
    drain,
    prelude,
    revalidate,
    server,
)

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ROUND_TRIP = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

T = PacketType
versions = st.sampled_from([4, 5])


# --- Feeding bytes ---------------------------------------------------------------------------


def feed(conn: MQTTConnection, chunks: list[bytes]) -> None:
    """Feed chunks; packets must be valid, and the only error allowed is a detected MQTTError."""
    error: MQTTError | None = None
    try:
        for chunk in chunks:
            conn.receive_data(chunk)
            for packet in drain(conn):
                revalidate(packet)
    except MQTTError as exc:
        error = exc
    if error is None:
        return
    check_detected(error)
    # ... and the connection stays failed.
    with pytest.raises(MQTTError) as again:
        conn.next_event()
    assert again.value is error


def check_detected(error: MQTTError) -> None:
    assert error.__cause__ is None, f"converted, not detected: {error.__cause__!r}"
    assert 0x80 <= error.reason_code <= 0xFF


def framed(first: int, body: bytes) -> bytes:
    """A packet with a correct Remaining Length, so the fuzz reaches the body decoders."""
    n, length = len(body), bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        length.append(digit | (0x80 if n else 0))
        if not n:
            return bytes((first,)) + bytes(length) + body


# First bytes that pass the fixed-header checks, so the body is what gets fuzzed.
FIRST_BYTES = [0x10, 0x20, 0x40, 0x50, 0x62, 0x70, 0x82, 0x90, 0xA2, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0]
FIRST_BYTES += list(range(0x30, 0x40))
bodies = st.builds(
    framed, st.sampled_from(FIRST_BYTES) | st.integers(0, 255), st.binary(max_size=80)
)
streams = st.lists(bodies | st.binary(max_size=40), max_size=6)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@FUZZ
@given(version=st.sampled_from([None, 4, 5]), chunks=streams)
def test_random_bytes_to_a_server(version: int | None, chunks: list[bytes]) -> None:
    conn = server(CONNECT_BYTES[version] if version else b"")
    feed(conn, chunks)


@FUZZ
@given(chunks=streams)
def test_random_bytes_to_a_server_that_allows_auth(chunks: list[bytes]) -> None:
    feed(server(CONNECT_V5_AUTH), chunks)


@FUZZ
@given(version=versions, connack=st.booleans(), chunks=streams)
def test_random_bytes_to_a_client(version: int, connack: bool, chunks: list[bytes]) -> None:
    feed(client(version, CONNACK_BYTES[version] if connack else b""), chunks)


@FUZZ
@given(version=versions, data=st.binary(max_size=60) | bodies)
def test_random_bytes_to_decode(version: int, data: bytes) -> None:
    error: MQTTError | None = None
    try:
        revalidate(decode(data, version))
    except MQTTError as exc:
        error = exc
    if error is not None:
        check_detected(error)


mutation = st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
    st.integers(0, 10_000),
    st.integers(0, 255),
)


def mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, value in mutations:
        i = where % (len(out) + 1)
        if kind == "insert":
            out.insert(i, value)
        elif not out or i == len(out):
            continue
        elif kind == "flip":
            out[i] ^= 1 << (value % 8)
        elif kind == "set":
            out[i] = value
        elif kind == "delete":
            del out[i]
        else:
            del out[i:]
    return bytes(out)


@FUZZ
@given(
    vector=st.sampled_from(VECTORS),
    mutations=st.lists(mutation, min_size=1, max_size=4),
    cuts=st.lists(st.integers(0, 1000), max_size=3),
)
def test_mutated_vectors(
    vector: Vector, mutations: list[tuple[str, int, int]], cuts: list[int]
) -> None:
    data = mutate(vector.data, mutations)
    if vector.direction == C2S:
        conn = server(prelude(vector))
    else:
        conn = client(vector.protocol_version, prelude(vector))
    feed(conn, split(data, cuts))


# --- Valid packets ---------------------------------------------------------------------------

# MQTT strings: any code point but U+0000 and the surrogates (1.5.4).
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
names = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#"), min_size=1, max_size=12
)
filters = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1)
packet_ids = st.integers(1, 0xFFFF)


def _value(spec_type: PropertyType, low: int, high: int) -> st.SearchStrategy[Any]:
    if spec_type is PropertyType.BOOL:
        return st.booleans()
    if spec_type is PropertyType.UTF8:
        return text
    if spec_type is PropertyType.BINARY:
        return st.binary(max_size=12)
    if spec_type is PropertyType.UTF8_PAIR:
        return st.lists(st.tuples(text, text), max_size=3).map(tuple)
    if spec_type is PropertyType.VBI:
        return st.lists(st.integers(low, high), max_size=3).map(tuple)
    return st.integers(low, high)


def properties(
    context: int, version: int, **fixed: st.SearchStrategy[Any]
) -> st.SearchStrategy[Properties]:
    """Properties valid for ``context``; ``fixed`` overrides the strategy of some attributes."""
    if version == 4:
        return st.just(NO_PROPERTIES)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for spec in PROPERTY_SPECS:
        if context not in spec.packets:
            continue
        if spec.attr == "response_topic":
            value: st.SearchStrategy[Any] = names
        elif spec.attr == "subscription_identifiers" and context != T.PUBLISH:
            value = st.lists(st.integers(1, 268_435_455), max_size=1).map(tuple)
        else:
            value = _value(spec.type, spec.minimum, spec.maximum)
        empty = () if spec.attr in ("user_properties", "subscription_identifiers") else None
        fields[spec.attr] = st.just(empty) | value
    fields.update(fixed)
    return st.fixed_dictionaries(fields).map(lambda kw: Properties(**kw))


@st.composite
def publishes(draw: st.DrawFn, version: int, from_client: bool = False) -> Publish:
    qos = draw(st.integers(0, 2))
    fixed = {"subscription_identifiers": st.just(())} if from_client else {}
    props = draw(properties(T.PUBLISH, version, **fixed))
    topic = draw(names | st.just("")) if props.topic_alias is not None else draw(names)
    return Publish(
        topic,
        draw(st.binary(max_size=40)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        props,
    )


@st.composite
def connects(draw: st.DrawFn, version: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(names),
            draw(st.binary(max_size=20)),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(properties(WILL_PROPERTIES, version)),
        )
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=12))
    if version == 4 and username is None:
        password = None
    props = draw(properties(T.CONNECT, version))
    if props.authentication_data is not None and props.authentication_method is None:
        props = Properties(**{**_fields(props), "authentication_data": None})
    return Connect(
        draw(text),
        version,
        draw(st.booleans()),
        draw(st.integers(0, 0xFFFF)),
        username,
        password,
        will,
        props,
    )


def _fields(props: Properties) -> dict[str, Any]:
    return {name: getattr(props, name) for name in Properties.__dataclass_fields__}


@st.composite
def subscriptions(draw: st.DrawFn, version: int) -> Subscription:
    topic_filter = draw(filters | st.just("$share/g/a/#"))
    if version == 4:
        return Subscription(topic_filter, draw(st.integers(0, 2)))
    shared = topic_filter.startswith("$share/")
    return Subscription(
        topic_filter,
        draw(st.integers(0, 2)),
        draw(st.booleans()) and not shared,
        draw(st.booleans()),
        draw(st.integers(0, 2)),
    )


def acks(version: int, cls: type[PubAck | PubRec | PubRel | PubComp]) -> st.SearchStrategy[Packet]:
    if version == 4:
        return st.builds(cls, packet_ids)
    codes = PUBREL_REASON_CODES if cls in (PubRel, PubComp) else PUBACK_REASON_CODES
    return st.builds(
        cls, packet_ids, st.sampled_from(sorted(codes)), properties(cls.packet_type, version)
    )


@st.composite
def auths(draw: st.DrawFn) -> Auth:
    if draw(st.booleans()):
        return Auth()
    props = draw(properties(T.AUTH, 5, authentication_method=text))
    return Auth(draw(st.sampled_from(sorted(AUTH_REASON_CODES))), props)


def from_client(version: int) -> st.SearchStrategy[Packet]:
    options: list[st.SearchStrategy[Packet]] = [
        publishes(version, from_client=True),
        *(acks(version, cls) for cls in (PubAck, PubRec, PubRel, PubComp)),
        st.builds(
            Subscribe,
            packet_ids,
            st.lists(subscriptions(version), min_size=1, max_size=3).map(tuple),
            properties(T.SUBSCRIBE, version),
        ),
        st.builds(
            Unsubscribe,
            packet_ids,
            st.lists(filters, min_size=1, max_size=3).map(tuple),
            properties(T.UNSUBSCRIBE, version),
        ),
        st.just(PingReq()),
    ]
    if version == 5:
        options.append(auths())
    return st.one_of(options)


def from_server(version: int) -> st.SearchStrategy[Packet]:
    suback_codes = SUBACK_RETURN_CODES_V311 if version == 4 else SUBACK_REASON_CODES
    options: list[st.SearchStrategy[Packet]] = [
        publishes(version),
        *(acks(version, cls) for cls in (PubAck, PubRec, PubRel, PubComp)),
        st.builds(
            SubAck,
            packet_ids,
            st.lists(st.sampled_from(sorted(suback_codes)), min_size=1, max_size=4).map(tuple),
            properties(T.SUBACK, version),
        ),
        st.just(PingResp()),
    ]
    if version == 4:
        options.append(st.builds(UnsubAck, packet_ids))
    else:
        unsuback_codes = st.sampled_from(sorted(UNSUBACK_REASON_CODES))
        options.append(
            st.builds(
                UnsubAck,
                packet_ids,
                st.lists(unsuback_codes, min_size=1, max_size=4).map(tuple),
                properties(T.UNSUBACK, version),
            )
        )
        options.append(auths())
    return st.one_of(options)


@st.composite
def connacks(draw: st.DrawFn, version: int) -> ConnAck:
    if version == 4:
        code = draw(st.integers(0, 5))
    else:
        code = draw(st.sampled_from(sorted(CONNACK_REASON_CODES)))
    return ConnAck(draw(st.booleans()) and not code, code, draw(properties(T.CONNACK, version)))


def disconnects(version: int) -> st.SearchStrategy[Disconnect]:
    if version == 4:
        return st.just(Disconnect())
    return st.builds(
        Disconnect,
        st.sampled_from(sorted(DISCONNECT_REASON_CODES)),
        properties(T.DISCONNECT, version),
    )


@st.composite
def any_packet(draw: st.DrawFn) -> tuple[int, Packet]:
    version = draw(versions)
    packet = draw(
        st.one_of(
            connects(version),
            connacks(version),
            from_client(version),
            from_server(version),
            disconnects(version),
        )
    )
    return version, packet


@ROUND_TRIP
@given(case=any_packet())
def test_round_trip(case: tuple[int, Packet]) -> None:
    version, packet = case
    data = encode(packet, version)
    decoded = decode(data, version)
    assert decoded == packet
    revalidate(decoded)
    assert encode(decoded, version) == data


@st.composite
def client_streams(draw: st.DrawFn) -> tuple[int, Connect, list[Packet]]:
    version = draw(versions)
    connect = draw(connects(version))
    if version == 5 and connect.properties.authentication_method is None:
        # AUTH is allowed only after a CONNECT that names a method [MQTT-4.12.0-7].
        props = Properties(**{**_fields(connect.properties), "authentication_method": "M"})
        connect = Connect(
            connect.client_id, 5, connect.clean_start, connect.keepalive, connect.username,
            connect.password, connect.will, props,
        )  # fmt: skip
    packets = draw(st.lists(from_client(version), max_size=6))
    if draw(st.booleans()):
        packets.append(draw(disconnects(version)))
    return version, connect, packets


@ROUND_TRIP
@given(stream=client_streams(), cuts=st.lists(st.integers(0, 10_000), max_size=5))
def test_stream_of_packets_through_a_server(
    stream: tuple[int, Connect, list[Packet]], cuts: list[int]
) -> None:
    version, connect, packets = stream
    sender = MQTTConnection(Role.CLIENT, protocol_version=version)
    data = b"".join(sender.send(p) for p in [connect, *packets])
    conn = server()
    received: list[Packet] = []
    for chunk in split(data, cuts):
        conn.receive_data(chunk)
        received.extend(drain(conn))
    assert received == [connect, *packets]
    assert conn.protocol_version == version
