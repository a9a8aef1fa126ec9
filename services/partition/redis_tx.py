"""RedisTransactions: the hot path's MULTI/EXEC writer, packed by hiredis and sent in one write.

The group commit and the follower's writes send one transaction per batch: hundreds a second
at moderate load, each a few commands. redis-py's Pipeline spends about 210 us of CPU on a
transaction of four HSET/HDEL commands here (connection pool, retry wrapper, command and
reply handling in Python); the same commands packed by hiredis, written to the socket at once
and their replies parsed by hiredis's reader take about 50 us (2 vCPU Xeon, Python 3.11,
redis 7.0; docs/benchmarks.md, "Fewer costs per batch"). At 3 nodes and RF 3, redis-py's
pipelines were a third of a partition service's Python time at 1,000 messages a second.

Only these two writers use it; reads, snapshots and the rest stay on redis-py.
`RedisTransactions.pipeline()` gives the part of redis-py's Pipeline they use (`hset` with a
mapping, `hdel`, `delete`, `len`, `execute`: `Commands`), so apply_ops, put_position
(services/partition/write_batch.py) and timed_execute take either.

Failures are redis-py's exceptions (ConnectionError, ResponseError, TimeoutError from the
caller's deadline), so the writers' handling is unchanged: a failed transaction stops the
service. A connection whose transaction failed or was cancelled is closed (a late answer would
otherwise be read as the next transaction's); the next transaction opens a new one.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Mapping
from typing import Any, Protocol, cast

import hiredis
import redis.asyncio as redis
from redis.asyncio.connection import parse_url

from services.partition.redis_access import RedisAccess, is_tls
from services.partition.write_batch import CommandSink

Arg = str | bytes | int | float

# A deadline noticed this much later than it passed means this process was not running
# (stopped, or starved of CPU) around it.
STALL_S = 0.5


class Commands(CommandSink, Protocol):
    """The part of a redis-py transaction pipeline the writers use: redis-py's own Pipeline, or
    a Transaction (the hot path's writer)."""

    def __len__(self) -> int: ...

    async def execute(self) -> list[Any]: ...


class TransactionClient(Protocol):
    """What hands out transactions: a redis.Redis, or RedisTransactions."""

    def pipeline(self, transaction: bool = True) -> Commands: ...


async def timed_execute(pipe: Commands, limit: float | None) -> None:
    """Run a pipeline within `limit` seconds in all (TimeoutError past it), for a writer
    without per-reply timeouts (RedisTransactions); None: the client's own per-reply timeouts
    apply.

    Time this process did not run does not count against Redis: when the deadline is noticed
    more than STALL_S after it passed (the process was stopped, as a paused node is, or
    starved), Redis's answer may be in the socket unread, and the pipeline gets `limit` again
    from then. A deadline noticed sooner than that gets STALL_S more, once: the loop runs its
    due timers before it reads the sockets, so a process that resumes just past its deadline
    (a node paused for 5.4 s with a write in flight, against 5 s: make test-fault, 2026-11-29)
    sees the deadline before the answer that came with it; and a node's processes resume one
    after another. A Redis that does not answer fails it all the same, `limit` (and once
    STALL_S) later."""
    if limit is None:
        await pipe.execute()
        return
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as timeout:
        check: asyncio.TimerHandle
        graced = False

        def due(deadline: float) -> None:
            nonlocal check, graced
            now = loop.time()
            if now - deadline > STALL_S:
                check = loop.call_at(now + limit, due, now + limit)
            elif not graced:
                graced = True
                check = loop.call_at(now + STALL_S, due, now + STALL_S)
            else:
                timeout.reschedule(now)  # expires: the pipeline is cancelled, TimeoutError

        first = loop.time() + limit
        check = loop.call_at(first, due, first)
        try:
            await pipe.execute()
        finally:
            check.cancel()


def _pack(args: tuple[Arg, ...]) -> bytes:
    # hiredis's stub declares a 1-tuple; it packs a command of any length.
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]
    return packed


_MULTI = _pack(("MULTI",))
_EXEC = _pack(("EXEC",))


class _Connection(asyncio.Protocol):
    """One connection to Redis with at most one request (a run of commands) in flight."""

    def __init__(self) -> None:
        self._reader = hiredis.Reader()
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[list[Any]] | None = None
        self._expected = 0
        self._replies: list[Any] = []
        self.broken: redis.ConnectionError | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have its methods.
        self._transport = cast("asyncio.Transport", transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        reader, replies = self._reader, self._replies
        reader.feed(data)
        try:
            while (reply := reader.gets()) is not False:
                replies.append(reply)
        except hiredis.ProtocolError as exc:
            self._fail(redis.ConnectionError(f"bad reply from redis: {exc}"))
            return
        waiter = self._waiter
        if waiter is not None and len(replies) >= self._expected:
            self._waiter, self._replies = None, []
            if not waiter.done():
                waiter.set_result(replies)

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc is not None else ""
        self._fail(redis.ConnectionError(f"connection to redis lost{reason}"))

    def _fail(self, error: redis.ConnectionError) -> None:
        if self.broken is None:
            self.broken = error
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(self.broken)
        if self._transport is not None:
            self._transport.close()

    async def call(self, packed: list[bytes]) -> list[Any]:
        """Send the packed commands at once; their replies, in order (error replies as
        hiredis.ReplyError values)."""
        if self.broken is not None:
            raise self.broken
        assert self._transport is not None
        assert self._waiter is None
        waiter = asyncio.get_running_loop().create_future()
        self._waiter, self._expected = waiter, len(packed)
        self._transport.write(b"".join(packed))
        replies: list[Any] = await waiter
        return replies

    def close(self) -> None:
        self._fail(redis.ConnectionError("connection closed"))


class Transaction:
    """Commands for one MULTI/EXEC, as redis-py's Pipeline(transaction=True) takes them."""

    __slots__ = ("_commands", "_owner")

    def __init__(self, owner: RedisTransactions) -> None:
        self._owner = owner
        self._commands: list[bytes] = []

    def __len__(self) -> int:
        return len(self._commands)

    def hset(self, name: str, *, mapping: Mapping[str | bytes, Arg]) -> None:
        args: list[Arg] = ["HSET", name]
        for field, value in mapping.items():
            args.append(field)
            args.append(value)
        self._commands.append(_pack(tuple(args)))

    def hdel(self, name: str, *fields: str | bytes) -> None:
        self._commands.append(_pack(("HDEL", name, *fields)))

    def delete(self, *names: str) -> None:
        self._commands.append(_pack(("DEL", *names)))

    async def execute(self) -> list[Any]:
        """Run the commands in one MULTI/EXEC; their results (redis.ResponseError if any
        failed: Redis applied the others)."""
        commands, self._commands = self._commands, []
        if not commands:
            return []
        return await self._owner.run([_MULTI, *commands, _EXEC])


class RedisTransactions:
    """MULTI/EXEC transactions on connections of their own (one per transaction in flight),
    to the Redis at `url` (redis[s]://[[user]:password@]host:port/db or unix://path?db=N), as
    `access` says (the user and password, if not in the URL; TLS for rediss://)."""

    def __init__(
        self, url: str, *, connect_timeout: float, access: RedisAccess | None = None
    ) -> None:
        params = parse_url(url)
        access = access or RedisAccess()
        self._path: str | None = params.get("path")
        self._host: str = params.get("host", "localhost")
        self._port: int = int(params.get("port", 6379))
        # As redis-py's SSLConnection: the URL's host is the name the certificate must carry.
        self._ssl: ssl.SSLContext | None = access.ssl_context() if is_tls(url) else None
        self._handshake: list[tuple[Arg, ...]] = []
        auth = access.auth_args()
        if not auth and params.get("password") is not None:
            username = params.get("username")
            auth = (username, params["password"]) if username else (params["password"],)
        if auth:
            self._handshake.append(("AUTH", *auth))
        self._who = auth[0] if len(auth) == 2 else "default"
        db = int(params.get("db", 0))
        if db:
            self._handshake.append(("SELECT", db))
        self._connect_timeout = connect_timeout
        self._idle: list[_Connection] = []
        self._closed = False

    def pipeline(self, transaction: bool = True) -> Transaction:
        if not transaction:
            raise ValueError("RedisTransactions only runs MULTI/EXEC transactions")
        return Transaction(self)

    async def run(self, packed: list[bytes]) -> list[Any]:
        """Send MULTI, commands, EXEC (packed) on an idle connection; EXEC's results."""
        conn = self._idle.pop() if self._idle else await self._open()
        try:
            replies = await conn.call(packed)
        except BaseException:
            # Failed, timed out or cancelled: an answer may still come on this connection.
            conn.close()
            raise
        if self._closed:
            conn.close()
        else:
            self._idle.append(conn)
        return _exec_results(replies)

    async def _open(self) -> _Connection:
        if self._closed:
            raise redis.ConnectionError("the transaction writer is closed")
        loop = asyncio.get_running_loop()
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self._connect_timeout):
                if self._path is not None:
                    _transport, conn = await loop.create_unix_connection(_Connection, self._path)
                else:
                    _transport, conn = await loop.create_connection(
                        _Connection,
                        self._host,
                        self._port,
                        ssl=self._ssl,
                        server_hostname=self._host if self._ssl is not None else None,
                    )
                if self._handshake:
                    replies = await conn.call([_pack(c) for c in self._handshake])
                    for command, reply in zip(self._handshake, replies, strict=True):
                        if isinstance(reply, hiredis.ReplyError):
                            name = command[0] if isinstance(command[0], str) else "it"
                            raise redis.AuthenticationError(
                                f"redis refused {name} as user {self._who}: {reply}"
                            )
        except BaseException as exc:
            if conn is not None:
                conn.close()  # connected, but the handshake failed or was cut short
            if isinstance(exc, TimeoutError):
                raise redis.ConnectionError(
                    f"redis did not accept a connection within {self._connect_timeout:g}s"
                ) from None
            if isinstance(exc, OSError):
                raise redis.ConnectionError(f"cannot connect to redis: {exc}") from exc
            raise
        return conn

    async def connect(self) -> None:
        """Open a connection now, kept for the first transaction: its handshake checks the
        credentials and TLS at start rather than at the first write."""
        self._idle.append(await self._open())

    async def aclose(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _exec_results(replies: list[Any]) -> list[Any]:
    """EXEC's results from the replies to MULTI, the commands and EXEC, or the first error."""
    for reply in replies[:-1]:
        if isinstance(reply, hiredis.ReplyError):
            # Refused while queueing: EXEC then aborts the whole transaction.
            raise redis.ResponseError(str(reply))
    results = replies[-1]
    if isinstance(results, hiredis.ReplyError):
        raise redis.ResponseError(str(results))
    if not isinstance(results, list):
        raise redis.ResponseError(f"unexpected answer to EXEC: {results!r}")
    for result in results:
        if isinstance(result, hiredis.ReplyError):
            raise redis.ResponseError(str(result))
    return results
