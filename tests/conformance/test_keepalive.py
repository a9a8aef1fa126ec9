"""Keep Alive: PINGREQ keeps a connection open, silence for 1.5 x Keep Alive ends it."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hexmq.mqtt import Disconnect, PingReq, PingResp
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_2_22_pingreq_keeps_the_connection_and_silence_ends_it(  # type: ignore[no-untyped-def]
    node,
    version: int,
) -> None:
    """MQTT-3.1.2-22: no packet within 1.5 x Keep Alive: the server closes the connection.

    5.0 gets DISCONNECT 0x8D first. Also MQTT-3.12.4-1 (a PINGREQ gets its PINGRESP) and
    MQTT-3.1.2-24 (3.1.1), the same rule by 3.1.1's number.
    """
    client, _ = await RawClient.connect(
        node.mqtt_port(1), f"ka-{uid()}", version=version, keepalive=1
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    for _ in range(3):  # 3 pings over ~2.4 s: longer than 1.5 x keepalive, still connected
        await asyncio.sleep(0.8)
        await client.send(PingReq())
        assert isinstance(await client.recv(), PingResp)
    quiet_from = loop.time()
    seen = await client.wait_closed(timeout=5)
    await client.close()
    waited = loop.time() - quiet_from
    assert loop.time() - started > 2.4
    # MQTT-3.1.2-24: closed after 1.5 x keepalive of silence (with timer slack), not before.
    assert 1.4 <= waited <= 3.0, waited
    if version == 5:
        assert [type(p) for p in seen] == [Disconnect]
        assert seen[0].reason_code == 0x8D  # type: ignore[union-attr]
    else:
        assert seen == []
