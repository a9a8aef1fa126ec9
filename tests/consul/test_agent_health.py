"""Agent services with TTL checks, health ?passing, the catalog, and sessions bound to a check."""

from __future__ import annotations

import asyncio
import time

import consul.aio
import pytest
from consul.exceptions import ConsulException

from tests.consul.conftest import Scratch


async def passing_ids(client: consul.aio.Consul, service: str) -> list[str]:
    _, nodes = await client.health.service(service, passing=True)
    return [n["Service"]["ID"] for n in nodes]


async def test_health_passing_follows_ttl_check_pass_warn_and_fail(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    service, check_id = await scratch.ttl_service("web")
    _, nodes = await consul_client.health.service(service)
    assert [n["Service"]["ID"] for n in nodes] == [service]  # critical until the first pass
    own = [c for c in nodes[0]["Checks"] if c["CheckID"] == check_id]
    assert [c["Status"] for c in own] == ["critical"]
    assert await passing_ids(consul_client, service) == []
    await consul_client.agent.check.ttl_pass(check_id, "ready")
    assert await passing_ids(consul_client, service) == [service]
    _, nodes = await consul_client.health.service(service, passing=True, tag="hexmq-test")
    check = next(c for c in nodes[0]["Checks"] if c["CheckID"] == check_id)
    assert (check["Status"], check["Output"]) == ("passing", "ready")
    await consul_client.agent.check.ttl_warn(check_id)
    assert await passing_ids(consul_client, service) == []
    await consul_client.agent.check.ttl_pass(check_id)
    await consul_client.agent.check.ttl_fail(check_id, "stopped")
    assert await passing_ids(consul_client, service) == []


async def test_agent_and_catalog_list_the_service_and_its_check(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    service, check_id = await scratch.ttl_service("web")
    services = await consul_client.agent.services()
    assert (services[service]["Service"], services[service]["Port"]) == (service, 1)
    checks = await consul_client.agent.checks()
    assert (checks[check_id]["ServiceID"], checks[check_id]["Status"]) == (service, "critical")
    _, catalog = await consul_client.catalog.services()
    assert catalog[service] == ["hexmq-test"]
    _, nodes = await consul_client.catalog.service(service)
    assert [(n["ServiceID"], n["ServicePort"]) for n in nodes] == [(service, 1)]
    assert await consul_client.agent.service.deregister(service) is True
    assert service not in await consul_client.agent.services()
    assert check_id not in await consul_client.agent.checks()


async def test_a_check_update_of_an_unknown_check_is_a_server_error(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    with pytest.raises(ConsulException, match="does not have associated TTL"):
        await consul_client.agent.check.ttl_pass(f"service:hexmq-test-{scratch.tag}-none")


async def test_a_session_cannot_name_a_critical_check(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    _, check_id = await scratch.ttl_service("web")
    with pytest.raises(ConsulException, match="critical"):
        await scratch.session(checks=[check_id])


async def test_a_check_ttl_running_out_invalidates_the_session_and_releases_its_keys(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    service, check_id = await scratch.ttl_service("agent", ttl="2s")
    await consul_client.agent.check.ttl_pass(check_id)
    session_id = await scratch.session(checks=[check_id], lock_delay=0)
    key = scratch.key("members/n1")
    assert await consul_client.kv.put(key, b"n1", acquire=session_id) is True
    passed_at = time.monotonic()
    deadline = passed_at + 2 + 5  # the check's TTL, and slack for a loaded machine
    while (await consul_client.session.info(session_id))[1] is not None:
        assert time.monotonic() < deadline, "the session outlived its check's TTL"
        await asyncio.sleep(0.1)
    assert time.monotonic() - passed_at >= 1.9  # not before the TTL ran out
    _, entry = await consul_client.kv.get(key)
    assert "Session" not in entry
    _, nodes = await consul_client.health.service(service)
    check = next(c for c in nodes[0]["Checks"] if c["CheckID"] == check_id)
    assert check["Status"] == "critical"
    assert check["Output"].startswith("TTL expired")


async def test_deregistering_the_service_invalidates_sessions_on_its_check(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    service, check_id = await scratch.ttl_service("web")
    await consul_client.agent.check.ttl_pass(check_id)
    session_id = await scratch.session(checks=[check_id], behavior="delete", lock_delay=0)
    await consul_client.kv.put(scratch.key("owned"), b"x", acquire=session_id)
    await consul_client.agent.service.deregister(service)
    deadline = time.monotonic() + 5
    while (await consul_client.session.info(session_id))[1] is not None:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    assert (await consul_client.kv.get(scratch.key("owned")))[1] is None
