"""`make_consul(addr)`: the py-consul asyncio client the agents and tests use.

    consul = make_consul("127.0.0.1:8500")      # inside a running event loop
    consul = make_consul("https://consul.internal:8501", token=TokenFile(path, opt).current,
                         ca="ca.pem", cert="client.pem", key="client.key")
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

The ACL token (sent as X-Consul-Token): `token` is a string, or a function asked before every
request (a token file rotated by the operator is used from the next request on, with no new
client); `token=""` sends none. Without `token`, py-consul sends CONSUL_HTTP_TOKEN when it is
set; a `token` given wins over it (as Consul's own command line flags win over the variable).

HTTPS (an `https://` address): the server's certificate is checked against the system's CAs
plus `ca`; `cert` and `key` are the client certificate a server with verify_incoming asks for.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import consul.aio

SCHEMES = ("http", "https")

TokenSource = Callable[[], str]


class _TokenHTTPClient(consul.aio.HTTPClient):  # type: ignore[misc]  # py-consul is untyped
    """py-consul's aiohttp adapter, adding the client's token to every request that carries
    none: py-consul 1.8 sends it only from the endpoints that take one (not agent.self(),
    status.leader(), ...), where Consul's own clients send it always."""

    def __init__(self, *args: Any, token: Callable[[], str | None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._token = token

    def _request(
        self,
        callback: Any,
        method: str,
        uri: str,
        headers: dict[str, str] | None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if not (headers and "X-Consul-Token" in headers):
            token = self._token()
            if token:
                headers = {**(headers or {}), "X-Consul-Token": token}
        return super()._request(callback, method, uri, headers, *args, **kwargs)


class ConsulClient(consul.aio.Consul):  # type: ignore[misc]  # py-consul is untyped
    """py-consul's asyncio client whose token comes from a function, asked on every request
    (and sent with every request: _TokenHTTPClient). py-consul reads `self.token` for each
    request's X-Consul-Token header; its constructor sets it (CONSUL_HTTP_TOKEN, else the
    token argument) through the setter."""

    _token_source: Callable[[], str | None] = staticmethod(lambda: None)

    def http_connect(
        self, host: str, port: int, scheme: str, verify: bool | str = True, cert: Any = None
    ) -> Any:
        return _TokenHTTPClient(
            host,
            port,
            scheme,
            loop=self.loop,
            connections_limit=self.connections_limit,
            connections_timeout=self.connections_timeout,
            verify=verify,
            cert=cert,
            token=lambda: self.token,
        )

    @property
    def token(self) -> str | None:
        return self._token_source()

    @token.setter
    def token(self, value: str | None) -> None:
        self._token_source = lambda: value

    def use_token(self, source: TokenSource) -> None:
        self._token_source = source

    def prepare_headers(self, token: str | None = None) -> dict[str, str]:
        """py-consul's, asking the token function once (py-consul's own asks twice)."""
        token = token or self.token
        return {"X-Consul-Token": token} if token else {}


@dataclass(frozen=True, slots=True)
class ConsulCredentials:
    """What a client presents to Consul besides its address: the ACL token (None: py-consul's
    CONSUL_HTTP_TOKEN, if set) and, for an https:// address, the CA and a client certificate."""

    token: str | TokenSource | None = None
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def connect(self, addr: str) -> consul.aio.Consul:
        return make_consul(addr, token=self.token, ca=self.ca, cert=self.cert, key=self.key)


# No token of its own (py-consul's CONSUL_HTTP_TOKEN, if set), no TLS files.
NO_CREDENTIALS: Final = ConsulCredentials()


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


def check_tls_files(
    addr: str, ca: Path | str | None, cert: Path | str | None, key: Path | str | None
) -> None:
    """ValueError unless the TLS files fit the address: an https:// one, cert with key."""
    scheme, _, _ = parse_consul_addr(addr)
    if scheme != "https" and (ca or cert or key):
        raise ValueError(
            f"a CA or client certificate is for an https:// Consul address, not {addr!r}"
        )
    if bool(cert) != bool(key):
        raise ValueError("a client certificate needs its key, and a key its certificate")


def make_consul(
    addr: str,
    *,
    token: str | TokenSource | None = None,
    ca: Path | str | None = None,
    cert: Path | str | None = None,
    key: Path | str | None = None,
) -> consul.aio.Consul:
    """A py-consul asyncio client for `addr`; call it inside a running event loop. ValueError
    for TLS files that do not fit the address (check_tls_files)."""
    asyncio.get_running_loop()  # a clear RuntimeError outside a loop, before aiohttp's own
    scheme, host, port = parse_consul_addr(addr)
    check_tls_files(addr, ca, cert, key)
    tls: dict[str, object] = {}
    if ca:
        tls["verify"] = str(ca)  # else py-consul's default: CONSUL_HTTP_SSL_VERIFY, or True
    if cert and key:
        tls["cert"] = (str(cert), str(key))
    with warnings.catch_warnings():
        # py-consul 1.8 passes TCPConnector(ssl_context=...), which aiohttp deprecates: that
        # one warning, raised while the client is built, would fail `-W error` runs.
        warnings.filterwarnings(
            "ignore",
            message=r"ssl_context is deprecated, use ssl=context instead",
            category=DeprecationWarning,
        )
        client = ConsulClient(host=host, port=port, scheme=scheme, **tls)
    if callable(token):
        client.use_token(token)
    elif token is not None:
        client.token = token  # wins over CONSUL_HTTP_TOKEN, which py-consul prefers
    return client
