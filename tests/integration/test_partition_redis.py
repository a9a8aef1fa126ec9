"""The partition service's Redis client against a real redis-server (the `redis_server`
fixture, tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest
import redis.asyncio as redis

from services.partition.store import REDIS_CONNECTIONS, redis_client


async def test_more_concurrent_commands_than_connections_wait_instead_of_failing(
    redis_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    redis_url, _ = redis_server
    # 150 commands holding a connection 0.3 s each: a node owing many snapshots at once.
    # redis-py's default pool fails the 101st with "Too many connections", which stopped the
    # partition service (a storage failure); these wait for a free connection.
    client = redis_client(redis_url, timeout=5.0)
    try:
        results = await asyncio.gather(
            *(client.blpop([f"nothing:{i}"], timeout=0.3) for i in range(150))
        )
        assert results == [None] * 150
        assert client.connection_pool.max_connections == REDIS_CONNECTIONS
    finally:
        await client.aclose()


async def test_with_redis_stopped_every_connection_busy_a_command_fails_in_bounded_time(
    redis_server: tuple[str, subprocess.Popen[bytes]],
) -> None:
    # A Redis that stops answering while every connection is taken: a further command waits
    # for a connection, then for its answer, each bounded by the timeout, and fails (the
    # service stops: fail-stop), it does not hang.
    url, server = redis_server
    client = redis_client(url, timeout=0.5)
    await client.ping()
    os.kill(server.pid, signal.SIGSTOP)
    try:
        holders = [asyncio.ensure_future(client.get(f"k{i}")) for i in range(REDIS_CONNECTIONS)]
        await asyncio.sleep(0)
        started = time.monotonic()
        with pytest.raises(redis.RedisError):
            await client.get("k")
        assert time.monotonic() - started < 3.0
        outcomes = await asyncio.gather(*holders, return_exceptions=True)
        assert all(isinstance(o, redis.RedisError) for o in outcomes)
    finally:
        os.kill(server.pid, signal.SIGCONT)
        await client.aclose()
