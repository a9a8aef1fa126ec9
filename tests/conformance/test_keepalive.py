"""Keep Alive: PINGREQ keeps a connection open, silence for 1.5 x Keep Alive ends it; an edge's
maximum Keep Alive (--max-keepalive): a 5.0 client asking for more, or for none, is told a
Server Keep Alive, which is the one enforced, and a 3.1.1 client is refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from hexmq.mqtt import Disconnect, PingReq, PingResp
from tests.support.edgeproc import edge_process
from tests.support.rawclient import RawClient
from tests.support.unique import uid


@pytest.mark.parametrize("version", [4, 5])
async def test_mqtt_3_1_2_22_pingreq_keeps_the_connection_and_silence_ends_it(
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
        assert seen[0].reason_code == 0x8D
    else:
        assert seen == []


# ----- the edge's maximum Keep Alive -------------------------------------------------------


@pytest.fixture(scope="module")
def keepalive_max(node: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """An edge granting a Keep Alive of at most 2 s."""
    work = tmp_path_factory.mktemp("keepalive")
    with edge_process(node, work, ["--max-keepalive=2"], name="keepalive") as proc:
        yield proc.port


@pytest.mark.parametrize(("asked", "told"), [(60, 2), (0, 2), (1, None), (2, None)])
async def test_mqtt_3_2_2_21_server_keep_alive_replaces_a_longer_or_no_keep_alive(
    keepalive_max: int, asked: int, told: int | None
) -> None:
    """MQTT-3.2.2-21/-22: the Server Keep Alive in CONNACK is the one the client must use; sent
    only when it differs from the client's (here: over --max-keepalive, or 0)."""
    client, connack = await RawClient.connect(
        keepalive_max, f"ka-{uid()}", version=5, keepalive=asked
    )
    assert connack.reason_code == 0
    assert connack.properties.server_keep_alive == told
    await client.close()


async def test_mqtt_3_1_2_22_the_server_keep_alive_is_the_one_enforced(keepalive_max: int) -> None:
    """MQTT-3.1.2-22 with Server Keep Alive: 1.5 x the granted 2 s of silence ends the
    connection (0x8D), though the client asked for 60 s."""
    client, connack = await RawClient.connect(keepalive_max, f"ka-{uid()}", version=5, keepalive=60)
    assert connack.properties.server_keep_alive == 2
    started = time.monotonic()
    packets = await client.wait_closed(timeout=10)
    waited = time.monotonic() - started
    assert [p.reason_code for p in packets if isinstance(p, Disconnect)] == [0x8D]
    assert 2.5 <= waited < 6, waited
    await client.close()


@pytest.mark.parametrize(("asked", "code"), [(60, 2), (0, 2), (2, 0)])
async def test_mqtt_3_2_2_21_v311_keep_alive_over_the_maximum_is_refused(
    keepalive_max: int, asked: int, code: int
) -> None:
    """3.1.1 has no Server Keep Alive: over --max-keepalive (or 0) is refused with return code 2
    Identifier rejected, as mosquitto's max_keepalive does."""
    client, connack = await RawClient.connect(
        keepalive_max, f"ka-{uid()}", version=4, keepalive=asked
    )
    assert connack.reason_code == code
    if code:
        assert await client.recv() is None
    await client.close()
