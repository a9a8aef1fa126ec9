"""Idle MQTT clients, for the memory a broker spends per connection (bench/moderate.py).

Run as ``python -m bench.idle HOST PORT COUNT PREFIX``: opens COUNT clean-session MQTT 3.1.1
connections (client ids PREFIX-0, PREFIX-1, ...), each CONNECTed and CONNACKed, prints one JSON
line ``{"event": "ready", "connected": N}`` and holds them, without sending anything more,
until its stdin closes; then it closes them and exits. A refused or failed connection fails the
whole run (``{"event": "error", ...}`` and exit status 1): a partial count would make the
figure per connection wrong.
"""

from __future__ import annotations

import asyncio
import json
import sys

from hexmq.mqtt import Connect, encode

# Connections opened at once: enough to be quick, few enough not to look like a flood.
CONCURRENCY = 100
# A keepalive longer than any measurement: nothing but the CONNECT goes out.
KEEPALIVE_S = 600


async def _open(
    host: str, port: int, client_id: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(encode(Connect(client_id=client_id, keepalive=KEEPALIVE_S), 4))
    await writer.drain()
    connack = await asyncio.wait_for(reader.readexactly(4), 10)
    # 3.1.1 CONNACK: 0x20, remaining length 2, session present, return code.
    if connack[0] != 0x20 or connack[3] != 0:
        raise RuntimeError(f"{client_id}: CONNACK {connack.hex()}")
    return reader, writer


async def _main(host: str, port: int, count: int, prefix: str) -> int:
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with slots:
            return await _open(host, port, f"{prefix}-{i}")

    try:
        held = await asyncio.gather(*(one(i) for i in range(count)))
    except Exception as exc:
        print(json.dumps({"event": "error", "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return 1
    print(json.dumps({"event": "ready", "connected": len(held)}), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    for _reader, writer in held:
        writer.write(b"\xe0\x00")  # DISCONNECT
        writer.close()
    await asyncio.sleep(0.2)
    return 0


def main() -> None:
    host, port, count, prefix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    sys.exit(asyncio.run(_main(host, port, count, prefix)))


if __name__ == "__main__":
    main()
