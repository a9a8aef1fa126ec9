"""The reconnecting stream shared by the edge's partition links and the replication streams
(hexmq/streams.py): what it tells its side, in which order, and how long it waits."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from hexmq import streams
from hexmq.streams import Backoff, keep_streaming


@pytest.fixture
def waits(monkeypatch: Any) -> list[float]:
    """The backoff's waits, recorded instead of slept."""
    recorded: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        recorded.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(streams.asyncio, "sleep", sleep)
    return recorded


async def test_backoff_doubles_to_a_second_and_resets(waits: list[float]) -> None:
    backoff = Backoff()
    for _ in range(7):
        await backoff.wait()
    backoff.reset()
    await backoff.wait()
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 0.05]


async def test_each_end_is_told_then_waited_for_and_the_side_resets_the_wait(
    waits: list[float],
) -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    told: list[str] = []
    attempts = 0

    async def run(channel: grpc.aio.Channel, backoff: Backoff) -> str:
        nonlocal attempts
        attempts += 1
        told.append(f"run {attempts}")
        if attempts == 4:
            backoff.reset()
        if attempts == 5:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                details="no protocol in common",
            )
        if attempts == 6:
            raise asyncio.CancelledError  # stopped: nothing more is told
        return "stream ended"

    task = asyncio.create_task(
        keep_streaming(
            lambda: grpc.aio.insecure_channel(f"127.0.0.1:{port}"),
            run,
            refused=lambda why, details: told.append(f"refused {why} / {details}"),
            closed=lambda why: told.append(f"closed {why}"),
        )
    )
    try:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
    finally:
        await server.stop(None)
    assert told == [
        "run 1",
        "closed stream ended",
        "run 2",
        "closed stream ended",
        "run 3",
        "closed stream ended",
        "run 4",
        "closed stream ended",
        "run 5",
        "refused FAILED_PRECONDITION: no protocol in common / no protocol in common",
        "closed FAILED_PRECONDITION: no protocol in common",
        "run 6",
    ]
    assert waits[:5] == [0.05, 0.1, 0.2, 0.05, 0.1]


async def test_a_peer_that_is_not_there_is_not_reachable(
    waits: list[float], monkeypatch: Any
) -> None:
    monkeypatch.setattr(streams, "CONNECT_TIMEOUT", 0.2)
    closed: list[str] = []

    async def run(channel: grpc.aio.Channel, backoff: Backoff) -> str:
        raise AssertionError("never connected")

    def stop_after_one(why: str) -> None:
        closed.append(why)
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await keep_streaming(
            lambda: grpc.aio.insecure_channel("127.0.0.1:1"),
            run,
            refused=lambda why, details: None,
            closed=stop_after_one,
        )
    assert closed == ["not reachable"]
