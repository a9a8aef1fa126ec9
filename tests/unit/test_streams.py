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


class _ReadyOnCue:
    """A channel that gets ready when the test says so, and a stream on it that never ends."""

    def __init__(self) -> None:
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.streams = 0

    async def __aenter__(self) -> _ReadyOnCue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def channel_ready(self) -> None:
        await self.ready

    async def run(self, channel: Any, backoff: Backoff) -> str:
        self.streams += 1
        await asyncio.Event().wait()
        return "stream ended"


async def _started(channel: _ReadyOnCue, run: Any) -> asyncio.Task[None]:
    task = asyncio.create_task(
        keep_streaming(lambda: channel, run, refused=lambda *_: None, closed=lambda _: None)
    )
    for _ in range(5):  # into the wait for the channel
        await asyncio.sleep(0)
    return task


async def test_a_stop_that_comes_as_the_channel_gets_ready_ends_the_loop() -> None:
    # Seed 4002 of the fault campaign: the replication link its driver had stopped (its master
    # had left) opened its stream all the same and kept it, and reconnected ever after, since
    # asyncio.wait_for (Python 3.11) returns the result and drops the cancellation when both
    # come in the same turn of the loop.
    channel = _ReadyOnCue()
    task = await _started(channel, channel.run)
    channel.ready.set_result(None)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done
    assert task.cancelled()
    assert channel.streams == 0


async def test_a_stop_that_the_stream_swallows_still_ends_the_loop() -> None:
    channel = _ReadyOnCue()
    channel.ready.set_result(None)
    swallowed = 0

    async def run_that_swallows(ch: Any, backoff: Backoff) -> str:
        nonlocal swallowed
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            swallowed += 1  # as a library might: the stream just "ended"
            if swallowed > 1:
                raise  # (only once: a loop that goes on must not outlive the test)
        return "stream ended"

    task = await _started(channel, run_that_swallows)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    assert task in done
    assert task.cancelled()
    assert swallowed == 1
