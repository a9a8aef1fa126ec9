"""`--discovery dns`: the records of one DNS name, resolved again every interval (as HiveMQ's
DNS discovery serves `docker compose` and Kubernetes headless services).

- `--discovery-dns-records address` (default): the name's A and AAAA records, one IP per node
  (a compose service or network alias, a headless service). A node is listed when its
  partition service's host is one of those IPs (or a name that resolves to one).
- `srv`: its SRV records, one target and port per node; listed is the node whose partition
  service is at that target (or one of its IPs) and port.

NXDOMAIN and an empty answer are answers (nobody listed); a timeout or a server failure is
not, and the last listing stays (services/membership/discovery/polling.py). No cache: every
interval asks the server again, whatever the records' TTL.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import dns.asyncresolver
import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver

from services.membership.discovery.model import DiscoveryError, ListedNode, Listing
from services.membership.discovery.polling import poll_listings

NAME: Final = "dns"
RECORD_KINDS: Final = ("address", "srv")
DEFAULT_DNS_PORT: Final = 53


@dataclass(frozen=True, slots=True)
class DnsSettings:
    name: str
    records: str = "address"
    interval_s: float = 5.0
    timeout_s: float = 2.0
    server: tuple[str, int] | None = None  # None: the system's (/etc/resolv.conf)

    def __post_init__(self) -> None:
        check_dns_name(self.name)
        if self.records not in RECORD_KINDS:
            raise DiscoveryError(
                f"--discovery-dns-records must be one of {', '.join(RECORD_KINDS)}, got "
                f"{self.records!r}"
            )
        for option, value in (
            ("--discovery-interval", self.interval_s),
            ("--discovery-dns-timeout", self.timeout_s),
        ):
            if not value > 0:
                raise DiscoveryError(f"{option} must be more than 0 seconds, got {value}")


def check_dns_name(name: str) -> str:
    if not name or " " in name:
        raise DiscoveryError(f"--discovery-dns-name must be a DNS name, got {name!r}")
    try:
        dns.name.from_text(name)
    except dns.exception.DNSException as exc:
        raise DiscoveryError(f"--discovery-dns-name {name!r} is not a DNS name: {exc}") from None
    return name


def parse_dns_server(text: str) -> tuple[str, int]:
    """`IP`, `IP:PORT` or `[IPv6]:PORT` -> (ip, port): the server to ask instead of the
    system's."""
    value = text.strip()
    host, port = value, DEFAULT_DNS_PORT
    if value.startswith("["):
        inside, _, rest = value[1:].partition("]")
        host = inside
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise DiscoveryError(f"--discovery-dns-server must be IP[:PORT], got {text!r}")
            port = int(rest[1:])
    elif value.count(":") == 1:
        host, _, port_text = value.partition(":")
        if not port_text.isdigit():
            raise DiscoveryError(f"--discovery-dns-server must be IP[:PORT], got {text!r}")
        port = int(port_text)
    try:
        ip = str(ipaddress.ip_address(host))
    except ValueError:
        raise DiscoveryError(
            f"--discovery-dns-server must be an IP address (with an optional :PORT), got {text!r}"
        ) from None
    if not 0 < port < 65536:
        raise DiscoveryError(f"--discovery-dns-server port must be 1-65535, got {port}")
    return ip, port


def address_listing(ips: Iterable[str]) -> Listing:
    return Listing.of(ListedNode(host=ip) for ip in ips)


def srv_listing(
    targets: Iterable[tuple[str, int]], addresses: Mapping[str, frozenset[str]]
) -> Listing:
    """SRV answers (target, port) with each target's IPs. A target of "." says the service is
    not offered there (RFC 2782): not a node."""
    nodes = []
    for target, port in targets:
        host = target.rstrip(".").lower()
        if host and port:
            known = addresses.get(host, frozenset())
            nodes.append(ListedNode(host=host, port=port, addresses=known))
    return Listing.of(nodes)


class DnsDiscovery:
    name = NAME

    def __init__(self, settings: DnsSettings) -> None:
        self.settings = settings
        self._resolver: dns.asyncresolver.Resolver | None = None

    def resolver(self) -> dns.asyncresolver.Resolver:
        if self._resolver is None:
            s = self.settings
            if s.server is None:
                resolver = dns.asyncresolver.Resolver()  # /etc/resolv.conf
                resolver.use_search_by_default = True
            else:
                resolver = dns.asyncresolver.Resolver(configure=False)
                resolver.nameservers = [s.server[0]]
                resolver.port = s.server[1]
            resolver.lifetime = s.timeout_s
            resolver.timeout = s.timeout_s
            resolver.cache = None
            self._resolver = resolver
        return self._resolver

    async def _query(self, qname: str, rdtype: str) -> list[dns.rdata.Rdata]:
        """The records; [] for NXDOMAIN or no records of that type; DiscoveryError when the
        DNS did not answer."""
        try:
            answer = await self.resolver().resolve(qname, rdtype)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.Timeout:
            raise DiscoveryError(
                f"{rdtype} {qname}: no answer within {self.settings.timeout_s:g} s"
            ) from None
        except dns.exception.DNSException as exc:
            raise DiscoveryError(f"{rdtype} {qname}: {exc}") from None
        return list(answer)

    async def resolve_host(self, qname: str) -> frozenset[str]:
        """A name's A and AAAA addresses, through this backend's resolver."""
        a, aaaa = await asyncio.gather(self._query(qname, "A"), self._query(qname, "AAAA"))
        return frozenset(rr.to_text() for rr in (*a, *aaaa))

    async def read(self) -> Listing:
        name = self.settings.name
        if self.settings.records == "address":
            return address_listing(await self.resolve_host(name))
        records = await self._query(name, "SRV")
        targets = [(rr.target.to_text(), int(rr.port)) for rr in records]  # type: ignore[attr-defined]
        hosts = sorted({t.rstrip(".").lower() for t, _ in targets if t.rstrip(".")})
        found = await asyncio.gather(*(self.resolve_host(f"{h}.") for h in hosts))
        return srv_listing(targets, dict(zip(hosts, found, strict=True)))

    def listings(self) -> AsyncIterator[Listing]:
        return poll_listings(
            f"{NAME} ({self.settings.records} {self.settings.name})",
            self.read,
            self.settings.interval_s,
            (DiscoveryError,),
        )
