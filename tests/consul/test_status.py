"""Status, the agent's identity, and what an unknown path answers."""

from __future__ import annotations

import re

import aiohttp
import consul.aio


async def test_the_leader_is_one_host_port_string_among_the_peers(
    consul_client: consul.aio.Consul,
) -> None:
    leader = await consul_client.status.leader()
    assert re.fullmatch(r"\S+:\d+", leader), leader
    assert leader in await consul_client.status.peers()


async def test_agent_self_names_the_node_and_datacenter(consul_client: consul.aio.Consul) -> None:
    config = (await consul_client.agent.self())["Config"]
    assert isinstance(config["NodeName"], str)
    assert config["NodeName"]
    assert isinstance(config["Datacenter"], str)


async def test_an_unknown_endpoint_is_a_404_saying_so(consul_addr: str) -> None:
    base = consul_addr if "://" in consul_addr else f"http://{consul_addr}"
    async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/no-such-thing") as resp:
        assert resp.status == 404
        assert await resp.text() == "Invalid URL path: not a recognized HTTP API endpoint\n"


async def test_a_wrong_method_is_a_405_naming_it(consul_addr: str) -> None:
    base = consul_addr if "://" in consul_addr else f"http://{consul_addr}"
    async with aiohttp.ClientSession() as http, http.post(f"{base}/v1/status/leader") as resp:
        assert resp.status == 405
        assert await resp.text() == "method POST not allowed"
        assert "GET" in resp.headers["Allow"]
