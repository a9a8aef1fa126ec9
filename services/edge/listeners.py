"""The edge's listeners (MQTT over TCP, TLS, WebSocket and WebSocket over TLS) and the TLS
context they share.

Every listener hands its sockets to the same ClientConnection: TCP and TLS directly (asyncio's
TLS transport does the handshake first, within the CONNECT timeout), WebSocket through the thin
adapter in services.edge.websocket. A plain listener named in --proxy-protocol (tcp, ws) first
reads the PROXY header its load balancer sends (services.edge.proxied).

With --reuse-port every listener sets SO_REUSEPORT: several edge processes of one node then
listen on the same ports and the kernel spreads new connections over them (by a hash of each
connection's addresses), so that connection handling is not one core's work. Linux lets a
process join such a port only if every socket on it set the option and runs as the same user.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import ssl
from collections.abc import Callable
from pathlib import Path

from hexmq import tls_server
from services.edge.connection import ClientConnection, ConnectionHost
from services.edge.proxied import ProxiedConnection
from services.edge.websocket import WebSocketConnection

_TLS = ssl.SSLContext | None
_Factory = Callable[[ConnectionHost], asyncio.Protocol]

# Listener kinds that can take the PROXY protocol, by their flag. TLS ones cannot: the header
# comes before the TLS handshake, which asyncio starts on accept (terminate TLS at the load
# balancer, or pass it through without the header).
PROXY_PROTOCOL_LISTENERS = {"tcp": "--listen", "ws": "--ws-listen"}


def tls_context(
    cert: Path, key: Path, ca: Path | None = None, require_client_cert: bool = False
) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or newer); ValueError naming the file that cannot be used."""
    return tls_server.server_context(cert, key, ca, require_client_cert)


def port_taken_hint(reuse_port: bool) -> str:
    """What a listener's EADDRINUSE means, with or without --reuse-port."""
    if reuse_port:
        return (
            "another process listens there without --reuse-port, or as another user (edges "
            "share a port only if each of them has --reuse-port)"
        )
    return (
        "another process listens there (several edges of a node share a port only if each "
        "of them has --reuse-port)"
    )


async def start_listeners(edge: ConnectionHost, tls: ssl.SSLContext | None) -> list[asyncio.Server]:
    """Listen on every address in the edge's config; closes what it opened if one fails, and
    raises OSError whose strerror names the listener ("--tls-listen 0.0.0.0:8883: ...")."""
    config = edge.config
    wanted: list[
        tuple[str, tuple[str, int], Callable[[ConnectionHost], asyncio.Protocol], _TLS]
    ] = [("--listen", (config.host, config.port), ClientConnection, None)]
    proxied = {PROXY_PROTOCOL_LISTENERS[kind] for kind in config.proxy_protocol}
    if config.tls_listen is not None:
        wanted.append(("--tls-listen", config.tls_listen, ClientConnection, tls))
    if config.ws_listen is not None:
        wanted.append(("--ws-listen", config.ws_listen, WebSocketConnection, None))
    if config.wss_listen is not None:
        wanted.append(("--wss-listen", config.wss_listen, WebSocketConnection, tls))
    loop = asyncio.get_running_loop()
    servers: list[asyncio.Server] = []
    try:
        for flag, (host, port), protocol, context in wanted:
            factory: Callable[[], asyncio.Protocol] = functools.partial(protocol, edge)
            if flag in proxied:
                factory = functools.partial(
                    ProxiedConnection, factory, flag, config.connect_timeout
                )
            try:
                servers.append(
                    await loop.create_server(
                        factory,
                        host,
                        port,
                        backlog=1024,
                        ssl=context,
                        # The TLS handshake is bounded like the wait for CONNECT.
                        ssl_handshake_timeout=config.connect_timeout if context else None,
                        reuse_port=config.reuse_port or None,
                    )
                )
            except OSError as exc:
                why = exc.strerror
                if exc.errno == errno.EADDRINUSE:
                    why = f"{why}: {port_taken_hint(config.reuse_port)}"
                raise OSError(exc.errno, f"{flag} {host}:{port}: {why}") from exc
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers
