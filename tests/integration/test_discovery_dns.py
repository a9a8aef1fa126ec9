"""DNS discovery against a real DNS server the test controls (tests/support/dnsserver.py:
dnslib on a loopback address), resolved by the backend's own dnspython resolver: it finds the
nodes, follows every change of the records, and keeps its last listing while the server fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from services.membership.discovery.dns import DnsDiscovery, DnsSettings
from services.membership.discovery.matching import match
from services.membership.discovery.model import ListedNode, Listing
from services.membership.observed import Registration
from tests.support.dnsserver import ZoneServer

DNS_ADDRESS = "127.0.0.77"
NAME = "partitions.hexmq.test"
SRV_NAME = "_partition._tcp.hexmq.test"


@pytest.fixture
def zone() -> Iterator[ZoneServer]:
    server = ZoneServer(DNS_ADDRESS)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Follower:
    """Runs a backend's listings() into a queue, as the agent's gate does."""

    def __init__(self, discovery: DnsDiscovery) -> None:
        self.seen: asyncio.Queue[Listing] = asyncio.Queue()
        self.task = asyncio.create_task(self._follow(discovery))

    async def _follow(self, discovery: DnsDiscovery) -> None:
        async for listing in discovery.listings():
            self.seen.put_nowait(listing)

    async def next(self, timeout: float = 5.0) -> Listing:
        return await asyncio.wait_for(self.seen.get(), timeout)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def follow() -> AsyncIterator[list[Follower]]:
    followers: list[Follower] = []
    yield followers
    for f in followers:
        await f.stop()


def hosts(listing: Listing) -> set[str]:
    return {n.host for n in listing.nodes}


async def test_address_records_are_listed_and_followed(
    zone: ZoneServer, follow: list[Follower]
) -> None:
    zone.set(NAME, "A", ["127.0.0.2", "127.0.0.3"])
    settings = DnsSettings(NAME, "address", 0.2, 1.0, (zone.address, zone.port))
    follower = Follower(DnsDiscovery(settings))
    follow.append(follower)
    assert hosts(await follower.next()) == {"127.0.0.2", "127.0.0.3"}
    zone.set(NAME, "A", ["127.0.0.2", "127.0.0.4"])  # one node replaced (compose --scale)
    assert hosts(await follower.next()) == {"127.0.0.2", "127.0.0.4"}
    zone.set(NAME, "AAAA", ["::1"])
    assert hosts(await follower.next()) == {"127.0.0.2", "127.0.0.4", "::1"}
    zone.set(NAME, "A", [])
    zone.set(NAME, "AAAA", [])  # the name is gone: NXDOMAIN is an answer, nobody listed
    assert await follower.next() == Listing()
    # Asked again every interval, whatever the TTL (1 s here): a few queries a second.
    asked = sum(1 for q in zone.queries if q == (NAME, "A"))
    assert asked >= 4


async def test_a_failing_server_keeps_the_last_listing_until_it_answers_again(
    zone: ZoneServer, follow: list[Follower], caplog: pytest.LogCaptureFixture
) -> None:
    zone.set(NAME, "A", ["127.0.0.2"])
    settings = DnsSettings(NAME, "address", 0.2, 0.5, (zone.address, zone.port))
    follower = Follower(DnsDiscovery(settings))
    follow.append(follower)
    assert hosts(await follower.next()) == {"127.0.0.2"}
    zone.failing = True  # SERVFAIL to everything
    zone.set(NAME, "A", ["127.0.0.3"])
    await asyncio.sleep(1.0)
    assert follower.seen.empty(), "a failing server changed the listing"
    assert f"A {NAME}" in caplog.text
    assert "keeping the last listing (127.0.0.2)" in caplog.text
    zone.failing = False
    assert hosts(await follower.next()) == {"127.0.0.3"}


async def test_a_server_that_does_not_answer_is_a_failed_read_not_an_empty_listing() -> None:
    silent = ZoneServer(DNS_ADDRESS)  # a port nobody serves
    discovery = DnsDiscovery(DnsSettings(NAME, "address", 0.2, 0.3, (silent.address, silent.port)))
    with pytest.raises(ValueError, match=rf"A {NAME}: "):
        await discovery.read()


async def test_srv_records_list_targets_and_ports_with_their_addresses(
    zone: ZoneServer, follow: list[Follower]
) -> None:
    zone.set(SRV_NAME, "SRV", [("n1.hexmq.test.", 7001), ("n2.hexmq.test.", 7002)])
    zone.set("n1.hexmq.test", "A", ["127.0.0.1"])
    zone.set("n2.hexmq.test", "A", ["127.0.0.1"])
    settings = DnsSettings(SRV_NAME, "srv", 0.2, 1.0, (zone.address, zone.port))
    follower = Follower(DnsDiscovery(settings))
    follow.append(follower)
    listing = await follower.next()
    assert listing == Listing.of(
        [
            ListedNode(host="n1.hexmq.test", port=7001, addresses=frozenset({"127.0.0.1"})),
            ListedNode(host="n2.hexmq.test", port=7002, addresses=frozenset({"127.0.0.1"})),
        ]
    )
    # Nodes on one IP are told apart by the SRV port (a local cluster, a pod's named port).
    registry = {
        f"n{i}": Registration(f"n{i}", f"127.0.0.1:700{i}", "x:1", "x:2", 1, 0) for i in (1, 2, 3)
    }
    assert match(listing, registry).discovered.listed == {"n1", "n2"}
    zone.set(SRV_NAME, "SRV", [("n2.hexmq.test.", 7002), ("n3.hexmq.test.", 7003)])
    zone.set("n3.hexmq.test", "A", ["127.0.0.1"])
    listing = await follower.next()
    assert match(listing, registry).discovered.listed == {"n2", "n3"}
