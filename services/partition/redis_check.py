"""The partition service's first words with its Redis: whether both of its clients get in
(`check_redis`), and, when they do not, a reason an operator can act on."""

from __future__ import annotations

import asyncio
import ssl

import redis.asyncio as redis

from services.partition.redis_access import PASSWORD_VARIABLE, RedisAccess
from services.partition.redis_tx import RedisTransactions


async def check_redis(
    client: redis.Redis, writer: RedisTransactions, access: RedisAccess, within: float
) -> str | None:
    """None once Redis answers PING and the transaction writer holds a connection; else why
    not. A Redis still starting (refusing connections, loading its append-only file) is waited
    for, up to `within` seconds; a refused password or permission, or a TLS failure, is not
    (waiting would not change it)."""
    last: BaseException | None = None
    try:
        async with asyncio.timeout(within):
            while True:
                try:
                    await client.ping()
                    await writer.connect()
                    return None
                except redis.AuthenticationError as exc:
                    return (
                        f"refused user {access.who}: {exc} (the password: --redis-password-file "
                        f"or {PASSWORD_VARIABLE}; the user: --redis-user)"
                    )
                except redis.ResponseError as exc:
                    return f"refused user {access.who}: {exc}"
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    if tls_failure(exc):
                        return f"failed TLS: {exc} (--redis-ca, --redis-cert, --redis-key)"
                    last = exc
                    await asyncio.sleep(0.05)
    except TimeoutError:
        why = f" (last: {last})" if last is not None else ""
        return f"did not answer within {within:.0f}s{why}"


def tls_failure(exc: BaseException) -> bool:
    """A TLS handshake refused by either side (not a connection cut during one)."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if isinstance(cause, ssl.SSLError) and not isinstance(
            cause, ssl.SSLEOFError | ssl.SSLZeroReturnError
        ):
            return True
    return False
