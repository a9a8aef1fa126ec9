"""`make_consul(addr)`: the py-consul asyncio client the agents and tests use.

    consul = make_consul("127.0.0.1:8500")      # inside a running event loop
    try:
        index, entry = await consul.kv.get("hexmq/c1/view", index=last, wait="30s")
    finally:
        await consul.close()                     # closes its aiohttp session and connector

`consul.aio.Consul` opens an aiohttp.ClientSession when it is built, so it must be built inside
a running loop and closed with `await consul.close()` (the same as `await consul.http.close()`,
or `async with make_consul(...) as consul:`); an unclosed one warns "Unclosed client session".
Its requests time out after aiohttp's default 300 s: keep blocking queries' `wait` well below
that ("30s"), Consul's own default wait being 5 min. Its connector holds at most 100
connections (aiohttp's default) and each blocking query holds one while it waits: a client
with 100 queries blocked makes every other request wait for one of them to return.
"""

from __future__ import annotations

import asyncio
import warnings
from urllib.parse import urlsplit

import consul.aio

SCHEMES = ("http", "https")


def parse_consul_addr(addr: str) -> tuple[str, str, int]:
    """ "HOST:PORT", "http://HOST:PORT" or "https://HOST:PORT" -> (scheme, host, port)."""
    text = addr.strip()
    url = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = url.port
    except ValueError:
        port = -1
    if (
        url.scheme not in SCHEMES
        or not url.hostname
        or port is None
        or port < 1
        or url.path not in ("", "/")
        or url.query
        or url.username
    ):
        raise ValueError(
            f"a Consul address is HOST:PORT, http://HOST:PORT or https://HOST:PORT, got {addr!r}"
        )
    host = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
    return url.scheme, host, port


def make_consul(addr: str) -> consul.aio.Consul:
    """A py-consul asyncio client for `addr`; call it inside a running event loop."""
    asyncio.get_running_loop()  # a clear RuntimeError outside a loop, before aiohttp's own
    scheme, host, port = parse_consul_addr(addr)
    with warnings.catch_warnings():
        # py-consul 1.8 passes TCPConnector(ssl_context=...), which aiohttp deprecates: that
        # one warning, raised while the client is built, would fail `-W error` runs.
        warnings.filterwarnings(
            "ignore",
            message=r"ssl_context is deprecated, use ssl=context instead",
            category=DeprecationWarning,
        )
        return consul.aio.Consul(host=host, port=port, scheme=scheme)
