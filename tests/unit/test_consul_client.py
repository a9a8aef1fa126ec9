"""make_consul: addresses, the running loop it needs, the one warning it silences, closing."""

from __future__ import annotations

import warnings

import pytest

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
