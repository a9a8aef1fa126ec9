"""Bad input raises the codec's own error with the reason code the specification names.

The tables live in ``vectors.py`` so the edge's integration tests can replay them over TCP.
"""

from __future__ import annotations

import pytest

from hexmq.mqtt import MQTTConnection
from tests.unit.mqtt.vectors import (
    CONNECT_BYTES,
    ERROR_CLASSES,
    MALFORMED,
    MALFORMED_CONNECT,
    MALFORMED_FROM_SERVER,
    TEST_MAX_PACKET_SIZE,
    BadInput,
    client,
    first_error,
    server,
)


def _id(case: BadInput) -> str:
    return f"{'3.1.1' if case.protocol_version == 4 else '5.0'}-{case.name}"


def _check(conn: MQTTConnection, case: BadInput, byte_by_byte: bool) -> None:
    error = first_error(conn, case.data, byte_by_byte=byte_by_byte)
    assert error.reason_code == case.reason_code, error
    assert type(error) is ERROR_CLASSES[case.reason_code]
    # Found by an explicit check: not an IndexError or UnicodeError converted after the fact.
    assert error.__cause__ is None
    assert error.message
    # The connection stays failed, with the same error, whatever arrives next.
    conn.receive_data(b"\xc0\x00")
    with pytest.raises(type(error)) as again:
        conn.next_event()
    assert again.value is error


@pytest.mark.parametrize("byte_by_byte", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("case", MALFORMED, ids=_id)
def test_malformed_after_connect(case: BadInput, byte_by_byte: bool) -> None:
    conn = server(CONNECT_BYTES[case.protocol_version], TEST_MAX_PACKET_SIZE)
    _check(conn, case, byte_by_byte)


@pytest.mark.parametrize("byte_by_byte", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("case", MALFORMED_CONNECT, ids=_id)
def test_malformed_from_the_first_byte(case: BadInput, byte_by_byte: bool) -> None:
    _check(server(), case, byte_by_byte)


@pytest.mark.parametrize("byte_by_byte", [False, True], ids=["whole", "byte-by-byte"])
@pytest.mark.parametrize("case", MALFORMED_FROM_SERVER, ids=_id)
def test_malformed_from_the_server(case: BadInput, byte_by_byte: bool) -> None:
    _check(client(case.protocol_version), case, byte_by_byte)


def test_tables_have_unique_names_per_version() -> None:
    for table in (MALFORMED, MALFORMED_CONNECT, MALFORMED_FROM_SERVER):
        keys = [(case.name, case.protocol_version) for case in table]
        assert len(keys) == len(set(keys))


def test_tables_cover_every_error_class() -> None:
    codes = {case.reason_code for case in MALFORMED + MALFORMED_CONNECT + MALFORMED_FROM_SERVER}
    # 0x8F is hexmq.topics' (filter grammar is the edge's call, see codec docstring).
    assert codes == set(ERROR_CLASSES) - {0x8F}
