"""What one stream message costs on this machine, by transport (issue 14's floor).

Run as ``python -m bench.transport``: for each transport, a server process and this process
(the client) hold one bidirectional stream on loopback; the client sends small messages at a
fixed rate, open loop, and the server echoes each one. Reported per transport and rate: the
round trip's p50/p99, and the CPU each process spent per round trip (its own user + system
time from /proc over the window), so per message sent plus message received.

- ``grpc``: grpc.aio on uvloop with the edge-partition link's channel options, bytes passed
  through unserialized: what hexmq's link and replication streams pay per message, without
  hexmq's own work.
- ``asyncio``: a uvloop TCP connection with length-prefixed messages read by an
  `asyncio.Protocol`: the event loop's own cost per message, the floor of any asyncio
  transport.
- ``grpclib``: the pure-Python, asyncio-only gRPC implementation (same wire protocol), when it
  is installed (``pip install grpclib``): no poller thread.
- ``inproc``: hexmq/inproc.py, the in-process channel of a co-located node's services
  (`hexmq node`): the same servicer and stub API with no serialisation, socket or second
  process; client and server are this one process, so its CPU per message is both ends'.

One gRPC stream message costs each process it passes through its write or its read, and
each message of a hexmq publish crosses about a dozen of them at RF 3 when nothing batches
(``python -m bench.moderate`` counts them per stage), so this is the lower bound of what a
message costs at low rates, where batches are single messages.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any

from bench.stats import CLOCK_TICKS, latency_summary, process_ticks
from tests.support.ports import free_port

METHOD = "/hexmq.bench.Echo/Stream"
TRANSPORTS = ("grpc", "asyncio", "grpclib", "inproc")
_HEADER = struct.Struct(">I")


def _identity(data: bytes) -> bytes:
    return data


# ---- servers (run in their own process: `python -m bench.transport --serve KIND`) ---------


async def _serve_grpc(port: int) -> None:
    import grpc

    from hexmq.grpc_options import LINK_OPTIONS

    async def stream(requests: Any, _context: Any) -> Any:
        async for message in requests:
            yield message

    handler = grpc.method_handlers_generic_handler(
        "hexmq.bench.Echo",
        {
            "Stream": grpc.stream_stream_rpc_method_handler(
                stream, request_deserializer=_identity, response_serializer=_identity
            )
        },
    )
    server = grpc.aio.server(options=LINK_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await _ready_then_wait()
    await server.stop(None)


class _Framed(asyncio.Protocol):
    """Length-prefixed messages over a stream socket; `on_message` gets each one's body."""

    def __init__(self, on_message: Callable[[bytes], None]) -> None:
        self._on_message = on_message
        self._buffer = bytearray()
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size
            if len(self._buffer) < end:
                return
            body = bytes(self._buffer[_HEADER.size : end])
            del self._buffer[:end]
            self._on_message(body)

    def send(self, body: bytes) -> None:
        assert self.transport is not None
        self.transport.write(_HEADER.pack(len(body)) + body)


async def _serve_asyncio(port: int) -> None:
    loop = asyncio.get_running_loop()

    def factory() -> _Framed:
        protocol = _Framed(lambda body: protocol.send(body))
        return protocol

    server = await loop.create_server(factory, "127.0.0.1", port)
    await _ready_then_wait()
    server.close()


async def _serve_grpclib(port: int) -> None:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    class Echo:
        async def stream(self, stream: Any) -> None:
            async for message in stream:
                await stream.send_message(message)

        def __mapping__(self) -> dict[str, Handler]:
            return {METHOD: Handler(self.stream, Cardinality.STREAM_STREAM, bytes, bytes)}

    server = Server([Echo()], codec=_BytesCodec())
    await server.start("127.0.0.1", port)
    await _ready_then_wait()
    server.close()


class _BytesCodec:
    """grpclib codec passing bytes through (its ProtoCodec wants protobuf classes)."""

    __content_subtype__ = "proto"

    def encode(self, message: bytes, message_type: Any) -> bytes:
        return message

    def decode(self, data: bytes, message_type: Any) -> bytes:
        return data


async def _ready_then_wait() -> None:
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


# ---- the client: one run per transport and rate ------------------------------------------


Send = Callable[[bytes], Awaitable[None] | None]


async def _drive(
    rate: int, duration: float, send: Send, received: asyncio.Queue[bytes]
) -> tuple[list[int], int]:
    """Send `rate` messages a second for `duration` seconds; the round-trip times (ns) of
    every echo and how many were sent."""
    count = int(rate * duration)
    sent_at: dict[bytes, int] = {}
    samples: list[int] = []

    async def collect() -> None:
        for _ in range(count):
            body = await received.get()
            samples.append(time.perf_counter_ns() - sent_at.pop(body))

    collector = asyncio.ensure_future(collect())
    start = time.perf_counter()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = i.to_bytes(8, "big") + bytes(56)  # 64 bytes, as bench.moderate's payloads
        sent_at[body] = time.perf_counter_ns()
        pending = send(body)
        if pending is not None:
            await pending
    await asyncio.wait_for(collector, timeout=30)
    return samples, count


async def _reading(
    stream: AsyncIterable[bytes], send: Send, run: Callable[[Send, asyncio.Queue[bytes]], Any]
) -> Any:
    """`run(send, received)` while a task puts each message of `stream` into `received`."""
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def read() -> None:
        async for body in stream:
            received.put_nowait(body)

    reader = asyncio.ensure_future(read())
    try:
        return await run(send, received)
    finally:
        reader.cancel()


async def _client_grpc(port: int, run: Callable[[Send, asyncio.Queue[bytes]], Any]) -> Any:
    import grpc

    from hexmq.grpc_options import LINK_OPTIONS

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=LINK_OPTIONS) as channel:
        call = channel.stream_stream(
            METHOD, request_serializer=_identity, response_deserializer=_identity
        )()
        try:
            return await _reading(call, call.write, run)
        finally:
            call.cancel()


async def _client_asyncio(port: int, run: Callable[[Send, asyncio.Queue[bytes]], Any]) -> Any:
    received: asyncio.Queue[bytes] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(
        lambda: _Framed(received.put_nowait), "127.0.0.1", port
    )
    try:
        return await run(protocol.send, received)
    finally:
        transport.close()


async def _client_grpclib(port: int, run: Callable[[Send, asyncio.Queue[bytes]], Any]) -> Any:
    from grpclib.client import Channel
    from grpclib.const import Cardinality

    channel = Channel("127.0.0.1", port, codec=_BytesCodec())
    try:
        async with channel.request(METHOD, Cardinality.STREAM_STREAM, bytes, bytes) as stream:
            await stream.send_request()
            try:
                return await _reading(stream, stream.send_message, run)
            finally:
                await stream.end()
    finally:
        channel.close()


async def _client_inproc(run: Callable[[Send, asyncio.Queue[bytes]], Any]) -> Any:
    import grpc

    from hexmq.inproc import LocalServer
    from hexmq.trust.identity import EDGE, Identity

    async def stream(requests: Any, _context: Any) -> Any:
        async for message in requests:
            yield message

    server = LocalServer("echo")
    service, name = METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                service, {name: grpc.stream_stream_rpc_method_handler(stream)}
            ),
        )
    )
    await server.start()
    async with server.channel(Identity(EDGE, "bench")) as channel:
        call = channel.stream_stream(METHOD)()
        try:
            return await _reading(call, call.write, run)
        finally:
            call.cancel()
            await server.stop(None)


_SERVERS = {"grpc": _serve_grpc, "asyncio": _serve_asyncio, "grpclib": _serve_grpclib}
_CLIENTS = {"grpc": _client_grpc, "asyncio": _client_asyncio, "grpclib": _client_grpclib}


def available(kind: str) -> bool:
    if kind != "grpclib":
        return True
    try:
        import grpclib  # noqa: F401
    except ImportError:
        return False
    return True


def measure(kind: str, rates: list[int], duration: float, port: int) -> list[dict[str, Any]]:
    """Start `kind`'s server process, run each rate against it from this process."""
    if kind == "inproc":
        return measure_in_process(rates, duration)
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.transport", "--serve", kind, "--port", str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdin is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError(f"{kind} server did not start")

        async def run(send: Send, received: asyncio.Queue[bytes]) -> list[dict[str, Any]]:
            rows = []
            await _drive(200, 0.5, send, received)  # warm-up: connection, caches, first calls
            for rate in rates:
                mine, theirs = process_ticks(os.getpid()), process_ticks(server.pid)
                samples, count = await _drive(rate, duration, send, received)
                mine_after, theirs_after = process_ticks(os.getpid()), process_ticks(server.pid)
                assert None not in (mine, theirs, mine_after, theirs_after)
                rows.append(
                    {
                        "transport": kind,
                        "rate": rate,
                        "messages": count,
                        "echoed": len(samples),
                        "client_us": _per_message(mine_after - mine, count),  # type: ignore[operator]
                        "server_us": _per_message(theirs_after - theirs, count),  # type: ignore[operator]
                        "latency": latency_summary(samples),
                    }
                )
            return rows

        return _run_on_uvloop(_CLIENTS[kind](port, run))
    finally:
        for pipe in (server.stdin, server.stdout):  # closing stdin ends the server
            if pipe is not None:
                pipe.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def measure_in_process(rates: list[int], duration: float) -> list[dict[str, Any]]:
    """The in-process channel: both ends in this process (its CPU is both ends'; server 0)."""

    async def run(send: Send, received: asyncio.Queue[bytes]) -> list[dict[str, Any]]:
        rows = []
        await _drive(200, 0.5, send, received)
        for rate in rates:
            mine = process_ticks(os.getpid())
            samples, count = await _drive(rate, duration, send, received)
            mine_after = process_ticks(os.getpid())
            assert mine is not None
            assert mine_after is not None
            rows.append(
                {
                    "transport": "inproc",
                    "rate": rate,
                    "messages": count,
                    "echoed": len(samples),
                    "client_us": _per_message(mine_after - mine, count),
                    "server_us": 0.0,
                    "latency": latency_summary(samples),
                }
            )
        return rows

    return _run_on_uvloop(_client_inproc(run))


def _per_message(ticks: int, count: int) -> float:
    return round(ticks / CLOCK_TICKS / count * 1_000_000, 1)


def _run_on_uvloop(coro: Any) -> Any:
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "transport  rate/s  echoed  p50 ms  p99 ms  client us/msg  server us/msg",
        "-" * 70,
    ]
    for row in rows:
        lat = row["latency"]
        lines.append(
            f"{row['transport']:<9} {row['rate']:>7,} {row['echoed']:>7,} "
            f"{lat['p50_us'] / 1000:>7.2f} {lat['p99_us'] / 1000:>7.2f} "
            f"{row['client_us']:>14.1f} {row['server_us']:>14.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.transport",
        description="CPU per stream message and round trip, grpc.aio against the event loop's "
        "own floor (and grpclib when installed): one bidirectional echo stream on loopback.",
    )
    parser.add_argument("--transports", default=",".join(TRANSPORTS), metavar="LIST")
    parser.add_argument("--rates", default="1000,2000,5000", metavar="LIST")
    parser.add_argument("--duration", type=float, default=4.0, metavar="S")
    parser.add_argument("--port", type=int, default=0, metavar="PORT", help="default: a free one")
    parser.add_argument("--out", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--serve", choices=TRANSPORTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _run_on_uvloop(_SERVERS[args.serve](args.port))
        return 0
    kinds = [k for k in args.transports.split(",") if k]
    unknown = [k for k in kinds if k not in TRANSPORTS]
    if unknown:
        parser.error(f"unknown transport {', '.join(unknown)} (of {', '.join(TRANSPORTS)})")
    rates = [int(r) for r in args.rates.split(",") if r]
    rows: list[dict[str, Any]] = []
    for kind in kinds:
        if not available(kind):
            print(f"bench: {kind} is not installed (pip install {kind}); left out", flush=True)
            continue
        rows += measure(kind, rates, args.duration, args.port or free_port())
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "cpus": os.cpu_count()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
