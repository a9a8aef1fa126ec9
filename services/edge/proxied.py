"""Listeners behind a load balancer that speaks the PROXY protocol (--proxy-protocol tcp|ws).

`ProxiedConnection` is the socket's protocol until the PROXY header has arrived: it reads the
header (services.edge.proxyproto), then starts the listener's own protocol (ClientConnection,
WebSocketConnection) on a `ProxiedTransport`, which is the socket's transport except that its
peer is the client the header names. So every user of the peer address (log lines, the
mqtt.connect span, enhanced-authentication plugins) sees the real client, with no change to
the connection code. A malformed header, or none within --connect-timeout, closes that
connection only, with one log line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from services.edge.proxyproto import ProxyHeader, ProxyHeaderError, ProxyHeaderReader

log = logging.getLogger("hexmq.edge.proxy")


class ProxiedTransport(asyncio.Transport):
    """The socket's transport, with the peer the PROXY header names."""

    def __init__(self, transport: asyncio.Transport, header: ProxyHeader) -> None:
        super().__init__()
        self._transport = transport
        self._header = header

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername" and self._header.source is not None:
            return self._header.source
        if name == "proxy_header":
            return self._header
        if name == "socket_peername":  # where the connection really comes from (the balancer)
            return self._transport.get_extra_info("peername", default)
        return self._transport.get_extra_info(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self._transport.writelines(list_of_data)

    def write_eof(self) -> None:
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def close(self) -> None:
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)


class ProxiedConnection(asyncio.Protocol):
    """Reads the PROXY header, then hands the connection to `inner` (made only then, so a
    connection counts against --max-connections once its client is known)."""

    def __init__(
        self, inner: Callable[[], asyncio.Protocol], listener: str, header_timeout: float
    ) -> None:
        self._make_inner = inner
        self._listener = listener
        self._header_timeout = header_timeout
        self._reader = ProxyHeaderReader()
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = transport  # type: ignore[assignment]
        self._timer = asyncio.get_running_loop().call_later(self._header_timeout, self._timed_out)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
            return
        if self._transport is None or self._transport.is_closing():
            return
        try:
            header = self._reader.feed(data)
        except ProxyHeaderError as exc:
            self._refuse(f"malformed PROXY protocol header: {exc}")
            return
        if header is None:
            return
        self._cancel_timer()
        inner = self._inner = self._make_inner()
        inner.connection_made(ProxiedTransport(self._transport, header))
        if self._reader.rest:
            inner.data_received(self._reader.rest)

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()
        return None  # closes the socket

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()

    def _timed_out(self) -> None:
        self._timer = None
        if self._inner is None:
            self._refuse(f"no PROXY protocol header within {self._header_timeout:g} s")

    def _refuse(self, why: str) -> None:
        self._cancel_timer()
        transport = self._transport
        if transport is None:
            return
        peer = transport.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if peer else "?"
        log.warning("closing %s on %s: %s", where, self._listener, why)
        transport.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
