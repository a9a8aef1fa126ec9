"""Reading MQTT packets off a WebSocket (websockets' client), whatever its frames hold."""

from __future__ import annotations

import asyncio
from typing import Any

from hexmq.mqtt import NEED_DATA, MQTTConnection, Packet


async def ws_packets(ws: Any, codec: MQTTConnection, count: int) -> list[Packet]:
    """The next `count` packets, within 10 s."""
    packets: list[Packet] = []
    async with asyncio.timeout(10):
        while len(packets) < count:
            event = codec.next_event()
            if event is NEED_DATA:
                codec.receive_data(await ws.recv())
            else:
                packets.append(event)
    return packets
