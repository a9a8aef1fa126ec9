"""A long-lived gRPC stream to one peer, opened again whenever it ends: the loop shared by the
edge's links to partition nodes (services/edge/links.py) and a follower's replication streams
from its masters (services/partition/peers.py).

Each attempt connects (the channel has 5 s to become ready), runs the stream until it ends,
tells the side why, and waits before the next: 50 ms, doubling to 1 s. When the wait goes back
to 50 ms is the side's choice (`Backoff.reset`): the edge resets it once a stream opens, a
follower only once its master has sent something. What a stream says (its hello, its frames)
and what a link going up or down means stay with the side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc

from hexmq.trust.grpc_tls import PeerRefused

# A new channel to the peer each attempt (hexmq.trust.grpc_tls.ClusterTLS.channel: TLS or
# plain text as the peer serves, with the credentials as they are on disk now).
Dial = Callable[[], grpc.aio.Channel]

CONNECT_TIMEOUT = 5.0
FIRST_BACKOFF = 0.05
MAX_BACKOFF = 1.0


class Backoff:
    """The wait before the next attempt: FIRST_BACKOFF, doubled after each, at most MAX_BACKOFF."""

    __slots__ = ("delay",)

    def __init__(self) -> None:
        self.delay = FIRST_BACKOFF

    def reset(self) -> None:
        self.delay = FIRST_BACKOFF

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, MAX_BACKOFF)


async def keep_streaming(
    dial: Dial,
    run: Callable[[grpc.aio.Channel, Backoff], Awaitable[str]],
    *,
    refused: Callable[[str, str | None], None],
    closed: Callable[[str], None],
) -> None:
    """Stream to a peer until cancelled, opening the stream again after each end.

    `dial()` makes the channel of each attempt (a peer this process may not dial, PeerRefused,
    counts as a failed attempt). `run(channel, backoff)` opens the stream on a ready channel
    and takes what it sends until it ends, and returns why ("stream ended", or the side's own
    reason); gRPC errors and the connect timeout are caught here. `refused(why, details)`:
    the peer refused the stream (FAILED_PRECONDITION: no protocol in common). `closed(why)`:
    the stream is gone, or never opened; the next attempt follows the wait."""
    backoff = Backoff()
    while True:
        try:
            async with dial() as channel:
                await channel_ready(channel)
                why = await run(channel, backoff)
        except PeerRefused as exc:
            why = f"not dialled: {exc}"
        except TimeoutError:
            why = "not reachable"
        except grpc.aio.AioRpcError as exc:
            why = f"{exc.code().name}: {exc.details()}"
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                refused(why, exc.details())
        closed(why)
        stop_if_cancelled()
        await backoff.wait()


async def channel_ready(channel: grpc.aio.Channel) -> None:
    """Wait until `channel` is connected: TimeoutError after CONNECT_TIMEOUT.

    Not asyncio.wait_for: on Python 3.11 it returns the result, and drops the cancellation,
    when the channel gets ready in the same turn of the loop as the task is cancelled (seed
    4002 of the fault campaign, at load 28: a replication link its driver had stopped kept
    streaming, holding a departed master's link down and, twice to one master, pushing its
    twin's stream out 280 times a second). asyncio.timeout runs the wait in this task and
    raises the cancellation."""
    async with asyncio.timeout(CONNECT_TIMEOUT):
        await channel.channel_ready()


def stop_if_cancelled() -> None:
    """Raise CancelledError if this task was asked to stop and something it awaited swallowed
    the request (a library that catches CancelledError, or wait_for as above): a reconnect
    loop must end when it is stopped, whatever it called."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
