"""The hot path's transaction writer (services/partition/redis_tx.py) against a real
redis-server (the `redis_server` fixture, tests/integration/conftest.py): it writes what
redis-py's pipeline writes, and fails the way the writers expect (a redis.RedisError, or
TimeoutError past the deadline), never misreading a late answer as the next one's."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess

import pytest
import redis.asyncio as redis

from services.partition.redis_tx import RedisTransactions, timed_execute
from services.partition.replication import DEL, HDEL, HSET, Op
from services.partition.write_batch import apply_ops, put_position

Server = tuple[str, subprocess.Popen[bytes]]

OPS: list[Op] = [
    (HSET, "hx:{1}:q:a", b"1", b"first"),
    (HSET, "hx:{1}:q:b", b"1", b"other"),
    (HSET, "hx:{1}:q:a", b"2", b"second"),
    (HDEL, "hx:{1}:q:a", b"1", b""),
    (HSET, "hx:{1}:gone", b"x", b"y"),
    (DEL, "hx:{1}:gone", b"", b""),
    (HSET, "hx:{1}:q:b", b"2", bytes(range(256))),
    (HDEL, "hx:{1}:q:b", b"1", b""),
    (HDEL, "hx:{1}:q:b", b"nothing", b""),
]


async def _contents(client: redis.Redis) -> dict[bytes, dict[bytes, bytes]]:
    return {key: await client.hgetall(key) for key in sorted(await client.keys("*"))}


async def test_a_transaction_writes_what_redis_py_writes(redis_server: Server) -> None:
    url, _ = redis_server
    db3, db4 = url.rsplit("/", 1)[0] + "/3", url.rsplit("/", 1)[0] + "/4"
    writer = RedisTransactions(db3, connect_timeout=5.0)
    reader, reference = redis.Redis.from_url(db3), redis.Redis.from_url(db4)
    try:
        ours = writer.pipeline(transaction=True)
        theirs = reference.pipeline(transaction=True)
        for pipe in (ours, theirs):
            apply_ops(pipe, OPS)
            put_position(pipe, 1, (7, 42), [(1, 1), (7, 40)])
        assert len(ours) == len(theirs)
        assert await timed_execute(ours, 5.0) is None
        await theirs.execute()
        written = await _contents(reader)
        assert written == await _contents(reference)
        assert written[b"hx:{1}:q:a"] == {b"2": b"second"}
        assert written[b"hx:1:meta"] == {b"epoch": b"7", b"seq": b"42", b"history": b"1:1,7:40"}
    finally:
        await writer.aclose()
        await reader.aclose()
        await reference.aclose()


async def test_a_refused_command_fails_the_transaction_and_the_next_one_works(
    redis_server: Server,
) -> None:
    url, _ = redis_server
    plain = redis.Redis.from_url(url)
    await plain.set("a-string", "v")
    writer = RedisTransactions(url, connect_timeout=5.0)
    try:
        tx = writer.pipeline()
        tx.hset("a-string", mapping={"f": "v"})  # WRONGTYPE when EXEC runs it
        tx.hset("h", mapping={"f": "v"})
        with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
            await tx.execute()
        tx = writer.pipeline()
        tx.hset("h2", mapping={"f": "w"})
        assert await tx.execute() == [1]
        assert await plain.hgetall("h2") == {b"f": b"w"}
    finally:
        await writer.aclose()
        await plain.aclose()


async def test_a_stopped_redis_times_out_and_its_late_answer_is_not_read_as_the_next(
    redis_server: Server,
) -> None:
    url, server = redis_server
    writer = RedisTransactions(url, connect_timeout=5.0)
    try:
        warm = writer.pipeline()
        warm.hset("k", mapping={"n": 0})
        await warm.execute()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            late = writer.pipeline()
            late.hset("k", mapping={"n": 1})
            late.hset("k", mapping={"m": 1})
            with pytest.raises(TimeoutError):
                await timed_execute(late, 0.3)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        # The late transaction's answer (two results) arrives on its closed connection; the
        # next transaction has a connection of its own and reads its own (one result).
        tx = writer.pipeline()
        tx.hset("k2", mapping={"a": 1, "b": 2})
        assert await timed_execute(tx, 5.0) is None
        check = writer.pipeline()
        check.hdel("k2", "a")
        assert await check.execute() == [1]
    finally:
        await writer.aclose()


async def test_a_dead_redis_fails_the_write_with_a_redis_error(redis_server: Server) -> None:
    url, server = redis_server
    writer = RedisTransactions(url, connect_timeout=1.0)
    try:
        tx = writer.pipeline()
        tx.hset("k", mapping={"n": 0})
        await tx.execute()
        server.kill()
        server.wait(timeout=10)
        await asyncio.sleep(0.05)
        for _ in range(2):  # the open connection, then a new one
            tx = writer.pipeline()
            tx.hset("k", mapping={"n": 1})
            with pytest.raises(redis.ConnectionError):
                await timed_execute(tx, 2.0)
    finally:
        await writer.aclose()


async def test_a_password_in_the_url_is_used_and_a_wrong_one_is_refused(
    redis_server: Server,
) -> None:
    url, _ = redis_server
    plain = redis.Redis.from_url(url)
    await plain.config_set("requirepass", "s3cret")
    await plain.aclose()
    good = RedisTransactions(url.replace("redis://", "redis://:s3cret@"), connect_timeout=5.0)
    bad = RedisTransactions(url.replace("redis://", "redis://:wrong@"), connect_timeout=5.0)
    try:
        tx = good.pipeline()
        tx.hset("k", mapping={"n": 1})
        assert await tx.execute() == [1]
        tx = bad.pipeline()
        tx.hset("k", mapping={"n": 2})
        with pytest.raises(redis.AuthenticationError, match="redis refused"):
            await tx.execute()
    finally:
        await good.aclose()
        await bad.aclose()


async def test_a_handshake_redis_does_not_answer_fails_in_time_and_leaks_nothing(
    redis_server: Server,
) -> None:
    """A Redis that accepts the connection (the kernel does, for a stopped process) but never
    answers the AUTH: the connect fails within the connect timeout, as a ConnectionError, and
    the half-open connection is closed, not left behind."""
    url, server = redis_server
    writer = RedisTransactions(url.replace("redis://", "redis://:pw@"), connect_timeout=0.3)
    loop = asyncio.get_running_loop()
    os.kill(server.pid, signal.SIGSTOP)
    try:
        tx = writer.pipeline()
        tx.hset("k", mapping={"n": 1})
        started = loop.time()
        with pytest.raises(redis.ConnectionError, match=r"within 0\.3s"):
            await tx.execute()
        assert loop.time() - started < 2.0
    finally:
        os.kill(server.pid, signal.SIGCONT)
        await writer.aclose()
    assert writer._idle == []
