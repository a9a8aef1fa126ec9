"""Consul catalog discovery (services/membership/discovery/consul.py) against the Consul of
this suite: `hexmq consul-dev`, or a real Consul with CONSUL_HTTP_ADDR. Instances of one
scratch service, registered as the membership agents register their nodes (ID = node id,
Meta node_id, tagged, a TTL check), come and go; the backend's blocking health queries follow
them: a passing instance is listed, a failing or deregistered one is not, an instance of
another tag never is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import consul.aio
import pytest

from services.membership.consul_client import ConsulCredentials
from services.membership.discovery.consul import ConsulCatalogDiscovery, ConsulCatalogSettings
from services.membership.discovery.model import Listing
from services.membership.records import MemberRecord, service_registration
from tests.consul.conftest import Scratch


class Catalog:
    """Registers instances of one scratch service the way the agents do (removed at the end
    by the scratch space)."""

    def __init__(self, client: consul.aio.Consul, scratch: Scratch) -> None:
        self.client = client
        self.scratch = scratch
        self.service = f"hexmq-test-{scratch.tag}"

    async def register(self, node: str, port: int, tag: str = "c1") -> str:
        """Node `node` (service ID `<scratch>-<node>`), passing; its check ID."""
        sid = f"{self.service}-{node}"
        record = MemberRecord(node, f"127.0.0.1:{port}", "127.0.0.1:1883", "127.0.0.1:2884", 1)
        kwargs = service_registration(record, 10, self.service, (tag,))
        kwargs["service_id"] = sid  # scratch IDs: a shared Consul may have other n1s
        assert await self.client.agent.service.register(**kwargs)
        self.scratch._services.append(sid)
        return f"service:{sid}"


@pytest.fixture
async def catalog(consul_client: consul.aio.Consul, scratch: Scratch) -> Catalog:
    return Catalog(consul_client, scratch)


@pytest.fixture
async def follow(
    consul_addr: str, consul_token: str | None, catalog: Catalog
) -> AsyncIterator[asyncio.Queue[Listing]]:
    seen: asyncio.Queue[Listing] = asyncio.Queue()
    credentials = ConsulCredentials(token=consul_token)
    settings = ConsulCatalogSettings(consul_addr, catalog.service, "c1", credentials=credentials)

    async def run() -> None:
        async for listing in ConsulCatalogDiscovery(settings).listings():
            seen.put_nowait(listing)

    task = asyncio.create_task(run())
    yield seen
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def listed(seen: asyncio.Queue[Listing], want: set[tuple[str, int]]) -> Listing:
    """The next listings until one lists exactly `want` (node id, port); fails after 5 s."""
    async with asyncio.timeout(5):
        while True:
            listing = await seen.get()
            if {(n.node_id, n.port) for n in listing.nodes} == want:
                return listing


async def test_passing_instances_are_listed_and_followed(
    consul_client: consul.aio.Consul, catalog: Catalog, follow: asyncio.Queue[Listing]
) -> None:
    assert await listed(follow, set()) == Listing()  # nobody registered yet
    await catalog.register("n1", 7001)
    check2 = await catalog.register("n2", 7002)
    await catalog.register("n3", 7003, tag="other-cluster")  # another tag: never listed
    listing = await listed(follow, {("n1", 7001), ("n2", 7002)})
    assert {n.host for n in listing.nodes} == {"127.0.0.1"}
    # A failing check (an operator's, maintenance, a lapsed TTL) takes the node out...
    await consul_client.agent.check.ttl_fail(check2, "draining")
    await listed(follow, {("n1", 7001)})
    # ... and a passing one brings it back; a new instance is listed too.
    await consul_client.agent.check.ttl_pass(check2)
    await catalog.register("n4", 7004)
    await listed(follow, {("n1", 7001), ("n2", 7002), ("n4", 7004)})
    # A deregistered instance is gone.
    assert await consul_client.agent.service.deregister(f"{catalog.service}-n1")
    await listed(follow, {("n2", 7002), ("n4", 7004)})


async def test_the_watch_blocks_instead_of_polling(
    consul_client: consul.aio.Consul, catalog: Catalog, follow: asyncio.Queue[Listing]
) -> None:
    await catalog.register("n1", 7001)
    await listed(follow, {("n1", 7001)})
    await asyncio.sleep(1.0)
    assert follow.empty()  # nothing changed: nothing new, and no busy loop made one
    started = asyncio.get_running_loop().time()
    await catalog.register("n2", 7002)
    await listed(follow, {("n1", 7001), ("n2", 7002)})
    assert asyncio.get_running_loop().time() - started < 2.0  # woken, not a timed poll
