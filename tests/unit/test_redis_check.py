"""The partition service's start check of its Redis (services/partition/redis_check.py): a
Redis still starting is waited for, a refusal that waiting would not change is reported at
once with the options to look at."""

from __future__ import annotations

import ssl
from typing import Any, cast

import redis.asyncio as redis

from services.partition.redis_access import RedisAccess
from services.partition.redis_check import check_redis, tls_failure


class Client:
    """Answers PING with each of `answers` in turn (an exception is raised), then PONG."""

    def __init__(self, *answers: BaseException) -> None:
        self.answers = list(answers)
        self.pings = 0

    async def ping(self) -> bool:
        self.pings += 1
        if self.answers:
            raise self.answers.pop(0)
        return True


class Writer:
    def __init__(self) -> None:
        self.connected = False

    async def connect(self) -> None:
        self.connected = True


async def check(client: Client, writer: Writer, within: float = 5.0) -> str | None:
    return await check_redis(
        cast(Any, client), cast(Any, writer), RedisAccess(user="hx"), within=within
    )


async def test_a_redis_still_starting_is_waited_for() -> None:
    client, writer = Client(redis.ConnectionError("refused"), redis.BusyLoadingError()), Writer()
    assert await check(client, writer) is None
    assert client.pings == 3
    assert writer.connected


async def test_a_refused_password_is_reported_at_once_naming_the_options() -> None:
    client = Client(redis.AuthenticationError("WRONGPASS"))
    why = await check(client, Writer())
    assert why is not None
    assert why.startswith("refused user hx: WRONGPASS")
    assert "--redis-password-file" in why
    assert client.pings == 1


async def test_a_redis_that_never_answers_is_reported_with_its_last_error() -> None:
    client = Client(*[redis.ConnectionError("refused")] * 1000)
    assert await check(client, Writer(), within=0.2) == ("did not answer within 0s (last: refused)")


def test_a_refused_handshake_is_a_tls_failure_and_a_cut_one_is_not() -> None:
    refused = redis.ConnectionError("handshake")
    refused.__cause__ = ssl.SSLCertVerificationError("certificate verify failed")
    cut = redis.ConnectionError("eof")
    cut.__cause__ = ssl.SSLEOFError("EOF occurred in violation of protocol")
    assert tls_failure(refused)
    assert not tls_failure(cut)
    assert not tls_failure(redis.ConnectionError("refused"))
