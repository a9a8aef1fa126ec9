"""bench.transport, the per-message floor of issue 14's figures: each transport echoes every
message it is sent over one real loopback stream, and the CPU per message comes from both
processes."""

from __future__ import annotations

import pytest

from bench import transport
from tests.support.ports import free_port


@pytest.mark.parametrize("kind", ["grpc", "asyncio", "inproc"])
def test_every_message_comes_back_and_both_processes_are_counted(kind: str) -> None:
    rows = transport.measure(kind, [400], 0.5, free_port())
    assert len(rows) == 1
    row = rows[0]
    assert row["transport"] == kind
    assert row["messages"] == 200
    assert row["echoed"] == 200
    assert row["latency"]["count"] == 200
    # CPU is read in clock ticks (10 ms): 200 echoes over loopback TCP may take less than
    # one in the server; over gRPC they take several. Under 1 s in all, either way.
    assert 0 <= row["server_us"] < 5_000
    if kind == "inproc":
        # One process is both ends (hexmq/inproc.py): all its CPU is the client's, and 200
        # echoes may take less than a tick.
        assert row["server_us"] == 0
        assert 0 <= row["client_us"] < 5_000
        return
    assert 0 < row["client_us"] < 5_000
    if kind == "grpc":
        assert row["server_us"] > 0


def test_the_table_names_each_transport_and_rate() -> None:
    row = {
        "transport": "grpc",
        "rate": 5000,
        "echoed": 20000,
        "client_us": 115.0,
        "server_us": 99.5,
        "latency": {"p50_us": 480.0, "p99_us": 2650.0},
    }
    text = transport.table([row])
    assert "grpc" in text.splitlines()[2]
    assert "5,000" in text
    assert "99.5" in text
    assert "2.65" in text


def test_an_unknown_transport_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        transport.main(["--transports", "grpc,zmq"])
    assert "unknown transport zmq" in capsys.readouterr().err
