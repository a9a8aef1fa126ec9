"""make_consul: addresses, the running loop it needs, the one warning it silences, closing."""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from services.membership.consul_client import make_consul, parse_consul_addr


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [
        ("127.0.0.1:8500", ("http", "127.0.0.1", 8500)),
        ("http://consul.local:8500", ("http", "consul.local", 8500)),
        ("https://10.0.0.1:8501/", ("https", "10.0.0.1", 8501)),
        ("[::1]:8500", ("http", "[::1]", 8500)),
    ],
)
def test_an_address_is_host_port_or_a_url(addr: str, parsed: tuple[str, str, int]) -> None:
    assert parse_consul_addr(addr) == parsed


@pytest.mark.parametrize(
    "addr", ["", "consul", "consul:http", "127.0.0.1:0", "ftp://h:1", "http://h:1/v1", "h:70000"]
)
def test_a_bad_address_is_refused_naming_it(addr: str) -> None:
    with pytest.raises(ValueError, match="a Consul address is HOST:PORT") as info:
        parse_consul_addr(addr)
    assert repr(addr) in str(info.value)


def test_it_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):
        make_consul("127.0.0.1:8500")


async def test_it_builds_under_warnings_as_errors_and_closes_its_session() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client = make_consul("127.0.0.1:8500")
    assert client.http.base_uri == "http://127.0.0.1:8500"
    await client.close()
    assert client.http._session.closed


async def test_the_warning_filter_is_gone_once_the_client_is_built() -> None:
    before = list(warnings.filters)
    await make_consul("127.0.0.1:8500").close()
    assert warnings.filters == before


# --- the ACL token and TLS files -------------------------------------------------------------


@pytest.fixture
async def echo_server() -> AsyncIterator[tuple[str, list[str | None]]]:
    """A stand-in Consul that answers every request with `[]` and records the
    X-Consul-Token header of each (None: none sent)."""
    seen: list[str | None] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.get("X-Consul-Token"))
        return web.json_response([], headers={"X-Consul-Index": "1"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"{host}:{port}", seen
    finally:
        await runner.cleanup()


async def test_the_token_is_sent_with_every_request_even_where_py_consul_forgets_it(
    echo_server: tuple[str, list[str | None]],
) -> None:
    addr, seen = echo_server
    client = make_consul(addr, token="t1")
    try:
        await client.kv.get("k")
        await client.agent.self()  # py-consul 1.8 adds no token to these two
        await client.status.leader()
        await client.kv.get("k", token="explicit")  # a per-call token still wins
    finally:
        await client.close()
    assert seen == ["t1", "t1", "t1", "explicit"]


async def test_a_token_function_is_asked_before_each_request(
    echo_server: tuple[str, list[str | None]],
) -> None:
    addr, seen = echo_server
    tokens = iter(["old", "old", "new"])
    client = make_consul(addr, token=lambda: next(tokens))
    try:
        for _ in range(3):
            await client.kv.get("k")
    finally:
        await client.close()
    assert seen == ["old", "old", "new"]


async def test_consul_http_token_is_used_without_a_token_and_a_given_one_wins(
    echo_server: tuple[str, list[str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    addr, seen = echo_server
    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "from-env")
    for token in (None, "given", ""):
        client = make_consul(addr, token=token)
        try:
            await client.kv.get("k")
        finally:
            await client.close()
    assert seen == ["from-env", "given", None]  # token="": none at all


@pytest.mark.parametrize(
    ("addr", "files", "error"),
    [
        ("127.0.0.1:8500", {"ca": "ca.pem"}, "for an https:// Consul address"),
        ("http://127.0.0.1:8500", {"cert": "c.pem", "key": "k.pem"}, "https://"),
        ("https://127.0.0.1:8501", {"cert": "c.pem"}, "needs its key"),
        ("https://127.0.0.1:8501", {"key": "k.pem"}, "needs its key"),
    ],
)
async def test_tls_files_must_fit_the_address(addr: str, files: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        make_consul(addr, **files)
