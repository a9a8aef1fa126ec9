"""The membership agent's side of discovery: runs the backend, keeps its last listing, and
tells the planner which registered nodes it lists (docs/discovery.md).

A backend that fails (raises) is logged and started again after a pause; its last listing
stays meanwhile. Host names that matching needs (a registration's partition host, when the
listing names addresses) are resolved in the background, through the DNS backend's own
resolver when that is the backend, else the system's DNS: a plan uses what is resolved so far,
and a new answer plans again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Final

import dns.asyncresolver
import dns.exception
import dns.resolver

from services.membership.discovery.dns import DnsDiscovery
from services.membership.discovery.matching import match, names_to_resolve
from services.membership.discovery.model import Discovery, Listing
from services.membership.discovery.options import DiscoverySettings
from services.membership.observed import Discovered, Registration

log = logging.getLogger("hexmq.membership")

RESTART_PAUSE_S: Final = 1.0
MAX_RESTART_PAUSE_S: Final = 30.0
RESOLVE_TIMEOUT_S: Final = 2.0

Resolve = Callable[[str], Awaitable[frozenset[str]]]


async def system_resolve(name: str) -> frozenset[str]:
    """A name's A and AAAA addresses from the system's DNS servers (/etc/resolv.conf)."""
    resolver = dns.asyncresolver.Resolver()
    resolver.lifetime = RESOLVE_TIMEOUT_S
    resolver.use_search_by_default = True
    found: set[str] = set()
    for rdtype in ("A", "AAAA"):
        try:
            answer = await resolver.resolve(name, rdtype)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            continue
        found.update(rr.to_text() for rr in answer)
    return frozenset(found)


class DiscoveryGate:
    def __init__(
        self,
        discovery: Discovery,
        *,
        node_id: str,
        describe: str,
        on_change: Callable[[], None],
        resolve: Resolve = system_resolve,
        refresh_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        restart_pause_s: float = RESTART_PAUSE_S,
    ) -> None:
        self.discovery = discovery
        self.node_id = node_id
        self.describe = describe
        self._on_change = on_change
        self._resolve = resolve
        self._refresh_s = refresh_s
        self._clock = clock
        self._restart_pause_s = restart_pause_s
        self.listing: Listing | None = None
        self.resolved: dict[str, frozenset[str]] = {}
        self._resolved_at: dict[str, float] = {}
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._said: dict[str, str] = {}

    # --- the backend -------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the backend until cancelled, restarting it after a pause if it fails."""
        pause = self._restart_pause_s
        while True:
            try:
                async for listing in self.discovery.listings():
                    self._take(listing)
                    pause = self._restart_pause_s
                log.warning("discovery %s stopped listing; starting it again", self.describe)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "discovery %s failed; keeping its last listing, starting it again in %g s",
                    self.describe,
                    pause,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, MAX_RESTART_PAUSE_S)

    def _take(self, listing: object) -> None:
        if not isinstance(listing, Listing):
            log.error(
                "discovery %s yielded %s, not a Listing; ignored",
                self.describe,
                type(listing).__name__,
            )
            return
        if listing == self.listing:
            return
        self.listing = listing
        log.info("discovery %s lists: %s", self.describe, listing.describe())
        self._on_change()

    async def stop(self) -> None:
        for task in list(self._resolving.values()):
            task.cancel()
        await asyncio.gather(*self._resolving.values(), return_exceptions=True)
        self._resolving.clear()

    # --- what the planner asks ---------------------------------------------------------------

    def discovered(
        self, registry: Mapping[str, Registration], members: Collection[str]
    ) -> Discovered:
        """Which registered nodes the last listing names (nobody before the first listing)."""
        self._resolve_names(names_to_resolve(self.listing, registry))
        outcome = match(self.listing, registry, self.resolved)
        self._explain(registry, members, outcome.discovered, outcome.conflicts)
        return outcome.discovered

    def _explain(
        self,
        registry: Mapping[str, Registration],
        members: Collection[str],
        discovered: Discovered,
        conflicts: Mapping[str, str],
    ) -> None:
        """One log line per node each time what discovery means for it changes."""
        said: dict[str, str] = {}
        for node in sorted(set(registry) | set(members)):
            listed = node in discovered.listed
            if node in conflicts:
                reg = registry[node]
                said[node] = (
                    f"discovery {self.describe} lists {conflicts[node]}, but {node} registered "
                    f"its partition service at {reg.partition_addr}: not admitted"
                )
            elif node in members and not listed:
                said[node] = (
                    f"member {node} is not listed by discovery {self.describe}; it stays a "
                    "member until it leaves or fails, and is not admitted again while unlisted"
                )
            elif node not in members and not listed and self.listing is not None:
                whom = "this node" if node == self.node_id else f"node {node}"
                said[node] = (
                    f"{whom} is registered but not listed by discovery {self.describe}: "
                    "not admitted"
                )
        for node, line in said.items():
            if self._said.get(node) != line:
                log.warning("%s", line)
        self._said = said

    def _resolve_names(self, names: set[str]) -> None:
        now = self._clock()
        for name in sorted(names):
            if name in self._resolving:
                continue
            at = self._resolved_at.get(name)
            if at is None or now - at >= self._refresh_s:
                self._resolved_at[name] = now
                self._resolving[name] = asyncio.get_running_loop().create_task(
                    self._resolve_one(name), name=f"resolve {name}"
                )

    async def _resolve_one(self, name: str) -> None:
        try:
            async with asyncio.timeout(RESOLVE_TIMEOUT_S * 2):
                addresses = await self._resolve(name)
        except (dns.exception.DNSException, ValueError, OSError, TimeoutError) as exc:
            log.debug("resolving %s for discovery failed: %s", name, exc)
            addresses = self.resolved.get(name, frozenset())
        finally:
            self._resolving.pop(name, None)
        if addresses != self.resolved.get(name):
            self.resolved[name] = addresses
            self._on_change()


def gate_for(
    discovery: Discovery,
    settings: DiscoverySettings | None,
    node_id: str,
    on_change: Callable[[], None],
) -> DiscoveryGate:
    """The agent's gate for a backend: names resolved through the DNS backend's own resolver
    when that is the backend (its --discovery-dns-server), else the system's DNS."""
    return DiscoveryGate(
        discovery,
        node_id=node_id,
        describe=settings.describe() if settings else discovery.name,
        on_change=on_change,
        resolve=discovery.resolve_host if isinstance(discovery, DnsDiscovery) else system_resolve,
        refresh_s=settings.interval_s if settings else 30.0,
    )
