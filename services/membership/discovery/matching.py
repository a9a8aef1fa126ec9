"""Which registered nodes a listing names (pure; docs/discovery.md, "Who is listed").

A listed node id names the registration with that id; a listed address names the
registrations whose partition service is at that host (and port, if the listing has one).
Hosts match when they are the same IP or name, or when a name resolves to the other's IP:
the agent passes what it resolved (`resolved`, name -> IPs), so this stays free of I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hexmq.netaddr import parse_hostport
from services.membership.discovery.model import ListedNode, Listing, is_ip, normal_host
from services.membership.observed import Discovered, Registration


@dataclass(frozen=True, slots=True)
class Match:
    discovered: Discovered
    # node -> what the listing says of it, for a listed node id whose registration is at
    # another address (not admitted; the agent logs it).
    conflicts: Mapping[str, str]


def _identities(
    host: str, addresses: frozenset[str], resolved: Mapping[str, frozenset[str]]
) -> frozenset[str]:
    host = normal_host(host)
    return frozenset({host}) | addresses | resolved.get(host, frozenset())


def registration_host(reg: Registration) -> tuple[str, int]:
    host, port = parse_hostport(reg.partition_addr, what="partition_addr")
    return normal_host(host), port


def _at(entry: ListedNode, reg: Registration, resolved: Mapping[str, frozenset[str]]) -> bool:
    host, port = registration_host(reg)
    if entry.port and entry.port != port:
        return False
    listed = _identities(entry.host, entry.addresses, resolved)
    return bool(listed & _identities(host, frozenset(), resolved))


def match(
    listing: Listing | None,
    registry: Mapping[str, Registration],
    resolved: Mapping[str, frozenset[str]] | None = None,
) -> Match:
    """The registered nodes `listing` names, and how many listed entries have no serving
    registration yet. No listing yet (None): nobody is listed."""
    if listing is None:
        return Match(Discovered(frozenset()), {})
    resolved = resolved or {}
    listed: set[str] = set()
    conflicts: dict[str, str] = {}
    missing = 0
    for entry in sorted(listing.nodes, key=lambda e: (e.node_id, e.host, e.port)):
        if entry.node_id:
            reg = registry.get(entry.node_id)
            hits = []
            if reg is not None:
                if not entry.host or _at(entry, reg, resolved):
                    hits = [entry.node_id]
                else:
                    conflicts[entry.node_id] = entry.describe()
        else:
            hits = [node for node, reg in registry.items() if _at(entry, reg, resolved)]
        listed.update(hits)
        if not any(registry[node].incarnation > 0 for node in hits):
            missing += 1
    return Match(Discovered(frozenset(listed), missing), conflicts)


def names_to_resolve(listing: Listing | None, registry: Mapping[str, Registration]) -> set[str]:
    """Host names whose IPs matching may need: those of registrations, when the listing
    names addresses, and listed names that came without their addresses."""
    if listing is None:
        return set()
    names = {e.host for e in listing.nodes if e.host and not e.addresses and not is_ip(e.host)}
    if any(e.host for e in listing.nodes):
        for reg in registry.values():
            try:
                host, _ = registration_host(reg)
            except ValueError:
                continue
            if not is_ip(host):
                names.add(host)
    return names
