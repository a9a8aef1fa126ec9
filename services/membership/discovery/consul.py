"""`--discovery consul`: the passing instances of a service in Consul's catalog, followed with
blocking queries on `/v1/health/service/<name>?passing&tag=<tag>` through py-consul.

Every membership agent registers its node as an instance of that service (name
`--discovery-consul-service`, tagged `--discovery-consul-tag`, ID = node id, Meta node_id and
the node's addresses, a TTL check its agent passes every TTL/3: services/membership/session.py),
so a node lists itself while its agent runs and Consul sees it healthy. Consul decides the
rest: an instance in maintenance (`consul maint -enable -service NODE`) or failing a check an
operator added is not listed, and so not admitted.

An instance names its node by `Meta.node_id` (the agents' own registrations); one without it
(registered by hand or by an orchestrator) names the address of a partition service:
`Service.Address` (else its node's address) and `Service.Port`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from services.membership.consul_client import NO_CREDENTIALS, ConsulCredentials
from services.membership.discovery.model import DiscoveryError, ListedNode, Listing
from services.membership.session import CONSUL_ERRORS, MAX_BACKOFF_S

log = logging.getLogger("hexmq.membership")

NAME: Final = "consul"
DEFAULT_SERVICE: Final = "hexmq"
# Below aiohttp's 300 s default timeout (STACK.md), as the agent's own watches.
BLOCKING_WAIT: Final = "20s"


@dataclass(frozen=True, slots=True)
class ConsulCatalogSettings:
    consul_addr: str
    service: str = DEFAULT_SERVICE
    tag: str = ""  # "" : every instance of the service
    credentials: ConsulCredentials = NO_CREDENTIALS  # the agent's token and TLS files

    def __post_init__(self) -> None:
        check_service_and_tag(self.service, self.tag)


def check_service_and_tag(service: str, tag: str) -> None:
    """Names that fit a URL path segment and a query value as they are."""
    for option, value in (("--discovery-consul-service", service), ("--discovery-consul-tag", tag)):
        if value != value.strip() or any(c in value for c in "/?&#% "):
            raise DiscoveryError(f"{option} must be a Consul service name or tag, got {value!r}")
    if not service:
        raise DiscoveryError("--discovery-consul-service must not be empty")


def listed_node(entry: Mapping[str, Any]) -> ListedNode:
    """One entry of /v1/health/service as the node it lists; DiscoveryError if it names none."""
    service = entry.get("Service") or {}
    meta = service.get("Meta") or {}
    node_id = str(meta.get("node_id") or "")
    host = str(service.get("Address") or (entry.get("Node") or {}).get("Address") or "")
    port = int(service.get("Port") or 0)
    where = f"service instance {service.get('ID')!r}"
    if not host:
        raise DiscoveryError(f"{where} has no address")
    try:
        return ListedNode(node_id=node_id, host=host, port=port)
    except DiscoveryError as exc:
        raise DiscoveryError(f"{where}: {exc}") from None


def health_listing(entries: Iterable[Mapping[str, Any]], source: str) -> Listing:
    """The nodes the passing instances list; an instance that names no node is logged and
    left out (it cannot admit anyone)."""
    nodes = []
    for entry in entries:
        try:
            nodes.append(listed_node(entry))
        except DiscoveryError as exc:
            log.warning("discovery %s: %s; not listed", source, exc)
    return Listing.of(nodes)


class ConsulCatalogDiscovery:
    name = NAME

    def __init__(self, settings: ConsulCatalogSettings) -> None:
        self.settings = settings

    def describe(self) -> str:
        s = self.settings
        return f"{NAME} (service {s.service}" + (f", tag {s.tag})" if s.tag else ")")

    async def listings(self) -> AsyncIterator[Listing]:
        s = self.settings
        source = self.describe()
        client = s.credentials.connect(s.consul_addr)
        index, last, failing, backoff = 0, None, False, 0.1
        try:
            while True:
                started = time.monotonic()
                try:
                    new_index, entries = await client.health.service(
                        s.service,
                        index=index or None,
                        wait=BLOCKING_WAIT,
                        passing=True,
                        tag=s.tag or None,
                    )
                except CONSUL_ERRORS as exc:
                    if not failing:
                        log.warning(
                            "discovery %s: Consul did not answer (%s); keeping the last "
                            "listing and retrying",
                            source,
                            exc or type(exc).__name__,
                        )
                    failing = True
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    index = 0  # read afresh: a restored server's index may be lower
                    continue
                if failing:
                    log.info("discovery %s: Consul answers again", source)
                failing, backoff = False, 0.1
                new_index = int(new_index)
                if index and new_index == index and time.monotonic() - started < 0.01:
                    await asyncio.sleep(0.05)  # a server that does not block: never spin
                # An index that goes backwards (a restored server) resets the watch.
                index = new_index if new_index >= index else 0
                listing = health_listing(entries or [], source)
                if listing != last:
                    last = listing
                    yield listing
        finally:
            await client.close()
