"""Consul's ACL token rules, for the endpoints the membership agents use, with ACLs enabled,
default policy deny and one management token (the suite's `consul_token`).

Against `hexmq consul-dev --acl-token-file` by default; against a real Consul (CONSUL_HTTP_ADDR)
these must pass unchanged when it runs with ACLs enabled and default policy deny, and
CONSUL_HTTP_TOKEN holds a management token (tests/consul/conftest.py shows how); without
CONSUL_HTTP_TOKEN they are skipped. The anonymous token must have no policy (Consul's default).

- the token is taken from `?token=`, else X-Consul-Token, else `Authorization: Bearer`;
- no token is the anonymous token: a request that needs a right is a 403 saying which
  (acl/errors.go PermissionDeniedError), a listing is filtered to nothing, silently;
- a token that does not exist is a 403 `ACL not found`;
- /v1/status/leader and /v1/status/peers need no token.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import consul
import consul.aio
import pytest

from services.membership.consul_client import make_consul
from tests.consul.conftest import Scratch

HINT = "The anonymous token is used implicitly when a request does not specify a token."


def denied(permission: str, name: str) -> str:
    return (
        f"Permission denied: anonymous token lacks permission '{permission}' on \"{name}\". {HINT}"
    )


@pytest.fixture
def token(consul_token: str | None) -> str:
    if consul_token is None:
        pytest.skip("a real Consul without CONSUL_HTTP_TOKEN: ACLs are taken to be off")
    return consul_token


@pytest.fixture
async def anonymous(consul_addr: str, token: str) -> AsyncIterator[consul.aio.Consul]:
    """A client that sends no token (token="": not even CONSUL_HTTP_TOKEN)."""
    client = make_consul(consul_addr, token="")
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def http(consul_addr: str) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    base = consul_addr if "://" in consul_addr else f"http://{consul_addr}"
    async with aiohttp.ClientSession() as session:
        yield session, base


async def test_without_a_token_a_request_that_needs_a_right_is_a_403_naming_it(
    consul_client: consul.aio.Consul, anonymous: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("view")
    assert await consul_client.kv.put(key, b"epoch 1")
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.kv.get(key)
    assert str(info.value) == denied("key:read", key)
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.kv.put(key, b"epoch 666")
    assert str(info.value) == denied("key:write", key)
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.kv.delete(scratch.prefix, recurse=True)
    assert str(info.value) == denied("key:write", scratch.prefix)
    # The key is still there, unchanged, and a missing key is refused the same.
    assert (await consul_client.kv.get(key))[1]["Value"] == b"epoch 1"
    with pytest.raises(consul.ACLPermissionDenied):
        await anonymous.kv.get(scratch.key("missing"))


async def test_without_a_token_sessions_services_and_the_agent_are_refused(
    consul_client: consul.aio.Consul, anonymous: consul.aio.Consul, scratch: Scratch
) -> None:
    node = (await consul_client.agent.self())["Config"]["NodeName"]
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.session.create(name=f"hexmq-test-{scratch.tag}")
    assert str(info.value) == denied("session:write", node)
    session_id = await scratch.session(lock_delay=0)
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.session.destroy(session_id)
    assert str(info.value) == denied("session:write", node)
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.session.renew(session_id)
    assert str(info.value) == denied("session:write", node)
    service, check = await scratch.ttl_service("web")
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.agent.check.ttl_pass(check)
    assert str(info.value) == denied("service:write", service)
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.agent.service.deregister(service)
    assert str(info.value) == denied("service:write", service)
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.agent.service.register(f"{service}-other", port=1)
    assert str(info.value) == denied("service:write", f"{service}-other")
    with pytest.raises(consul.ACLPermissionDenied) as info:
        await anonymous.agent.self()
    assert str(info.value) == denied("agent:read", node)
    # Nothing changed: the session lives, the service is registered.
    assert (await consul_client.session.info(session_id))[1] is not None
    assert service in await consul_client.agent.services()


async def test_rights_are_checked_on_what_exists_only(anonymous: consul.aio.Consul) -> None:
    # Session.Apply returns early for a session that does not exist, before any right; renew
    # answers its 404 (py-consul: NotFound) the same way.
    missing = str(uuid.uuid4())
    assert await anonymous.session.destroy(missing) is True
    with pytest.raises(consul.NotFound):
        await anonymous.session.renew(missing)


async def test_without_a_token_listings_are_empty_not_refused(
    consul_client: consul.aio.Consul,
    anonymous: consul.aio.Consul,
    scratch: Scratch,
    http: tuple[aiohttp.ClientSession, str],
) -> None:
    assert await consul_client.kv.put(scratch.key("members/n1"), b"n1")
    session_id = await scratch.session(lock_delay=0)
    service, _ = await scratch.ttl_service("web")
    # With the token all of it is there...
    assert (await consul_client.kv.get(scratch.prefix, recurse=True))[1]
    assert service in await consul_client.agent.services()
    # ... without, nothing: a prefix with nothing to show is a 404, as if it were empty.
    assert (await anonymous.kv.get(scratch.prefix, recurse=True))[1] is None
    assert (await anonymous.kv.get(scratch.prefix, keys=True))[1] is None
    assert (await anonymous.session.info(session_id))[1] is None
    assert (await anonymous.session.list())[1] == []
    assert (await anonymous.health.service(service))[1] == []
    assert (await anonymous.catalog.service(service))[1] == []
    assert (await anonymous.catalog.services())[1] == {}
    assert await anonymous.agent.services() == {}
    assert await anonymous.agent.checks() == {}
    # Consul says results were filtered only to a request that names a token: not here...
    session, base = http
    async with session.get(f"{base}/v1/catalog/services") as resp:
        assert resp.status == 200
        assert "X-Consul-Results-Filtered-By-ACLs" not in resp.headers
        assert resp.headers["X-Consul-Default-ACL-Policy"] == "deny"
    # ... but to the anonymous token named by its secret, "anonymous", yes.
    headers = {"X-Consul-Token": "anonymous"}
    async with session.get(f"{base}/v1/catalog/services", headers=headers) as resp:
        assert resp.status == 200
        assert await resp.json() == {}
        assert resp.headers["X-Consul-Results-Filtered-By-ACLs"] == "true"


async def test_a_token_that_does_not_exist_is_a_403_acl_not_found(
    consul_addr: str, token: str, scratch: Scratch
) -> None:
    stranger = make_consul(consul_addr, token=str(uuid.uuid4()))
    requests: list[Callable[[], Awaitable[object]]] = [
        lambda: stranger.kv.get(scratch.key("view")),
        lambda: stranger.kv.put(scratch.key("view"), b"x"),
        lambda: stranger.session.list(),
        lambda: stranger.catalog.services(),
        lambda: stranger.agent.services(),
    ]
    try:
        for request in requests:
            with pytest.raises(consul.ACLPermissionDenied) as info:
                await request()
            assert str(info.value) == "ACL not found"
    finally:
        await stranger.close()


@pytest.mark.parametrize("where", ["header", "query", "bearer"])
async def test_the_token_is_taken_from_the_header_the_query_or_a_bearer(
    http: tuple[aiohttp.ClientSession, str], token: str, scratch: Scratch, where: str
) -> None:
    session, base = http
    url = f"{base}/v1/kv/{scratch.key(where)}"
    given = {
        "header": ({"X-Consul-Token": token}, {}),
        "query": ({}, {"token": token}),
        "bearer": ({"Authorization": f"Bearer {token}"}, {}),
    }
    headers, params = given[where]
    async with session.put(url, data=b"v", headers=headers, params=params) as resp:
        assert resp.status == 200, await resp.text()
        assert await resp.json() is True
    async with session.get(url, headers=headers, params=params) as resp:
        assert resp.status == 200, await resp.text()
    async with session.get(url) as resp:
        assert resp.status == 403


async def test_the_query_parameter_wins_over_the_header_and_the_header_over_a_bearer(
    http: tuple[aiohttp.ClientSession, str], token: str, scratch: Scratch
) -> None:
    session, base = http
    url = f"{base}/v1/kv/{scratch.key('missing')}"  # 404 when allowed, 403 when not
    wrong = str(uuid.uuid4())
    cases = [
        ({"X-Consul-Token": wrong}, {"token": token}, 404),
        ({"X-Consul-Token": token}, {"token": wrong}, 403),
        ({"X-Consul-Token": token, "Authorization": f"Bearer {wrong}"}, {}, 404),
        ({"X-Consul-Token": wrong, "Authorization": f"Bearer {token}"}, {}, 403),
    ]
    for headers, params, status in cases:
        async with session.get(url, headers=headers, params=params) as resp:
            assert resp.status == status, (headers.keys(), params.keys(), await resp.text())


async def test_status_endpoints_answer_without_a_token_or_with_a_wrong_one(
    anonymous: consul.aio.Consul, http: tuple[aiohttp.ClientSession, str]
) -> None:
    leader = await anonymous.status.leader()
    assert leader in await anonymous.status.peers()
    session, base = http
    for path in ("/v1/status/leader", "/v1/status/peers"):
        async with session.get(f"{base}{path}", params={"token": str(uuid.uuid4())}) as resp:
            assert resp.status == 200


async def test_a_blocking_query_with_the_token_blocks_and_wakes(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("view")
    assert await consul_client.kv.put(key, b"epoch 1")
    index, _ = await consul_client.kv.get(key)
    watcher = asyncio.create_task(consul_client.kv.get(key, index=index, wait="20s"))
    await asyncio.sleep(0.3)
    assert not watcher.done()  # it blocks: the token let it in, and nothing changed yet
    assert await consul_client.kv.put(key, b"epoch 2")
    new_index, entry = await asyncio.wait_for(watcher, 5)
    assert int(new_index) > int(index)
    assert entry["Value"] == b"epoch 2"
