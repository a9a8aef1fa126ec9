"""What node discovery hands the membership agent, and what a backend (built in or a plugin)
implements (docs/discovery.md).

A backend's `listings()` is an async iterator of `Listing`s: the nodes that belong to the
cluster now, a new listing whenever that changes. Each listed node names a node id, an address
(the node's partition service, what peers dial), or both. Pure data: no I/O here.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol, runtime_checkable

from services.membership.consul_client import NO_CREDENTIALS, ConsulCredentials

# The node id syntax of services/membership/records.py (--node-id).
_NODE_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
# A DNS name or an IP literal: no spaces, no brackets inside, no port.
_HOST: Final = re.compile(r"[A-Za-z0-9_.:%-]{1,253}")


class DiscoveryError(ValueError):
    """A discovery setting, file or answer that cannot be used; the message names what (the
    option, the file and line, the DNS name, the plugin)."""


def normal_host(host: str) -> str:
    """How hosts are compared: an IP literal in its compressed form (IPv6 without brackets),
    a name in lower case without its trailing dot."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return text.rstrip(".").lower()


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(normal_host(host))
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class ListedNode:
    """One node that discovery lists: by node id, by address, or both.

    `host` and `port` are where the node's partition service is reached (its
    --partition-addr); port 0 means any port on that host (an A/AAAA record). `addresses` are
    IPs the host is known to have (a DNS backend that resolved an SRV target), so that the
    agent need not resolve it again."""

    node_id: str = ""
    host: str = ""
    port: int = 0
    addresses: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.node_id and not self.host:
            raise DiscoveryError("a listed node needs a node id, a host, or both")
        if self.node_id and not _NODE_ID.fullmatch(self.node_id):
            raise DiscoveryError(
                f"listed node id {self.node_id!r} is not a node id (1-63 letters, digits, "
                "'_', '.' or '-')"
            )
        if self.host and not _HOST.fullmatch(self.host.strip("[]")):
            raise DiscoveryError(f"listed host {self.host!r} is not a host name or IP address")
        if not 0 <= self.port <= 65535 or (self.port and not self.host):
            raise DiscoveryError(
                f"listed port {self.port} must be 1-65535 and come with a host (0: any port)"
            )
        for address in self.addresses:
            if not is_ip(address):
                raise DiscoveryError(f"listed address {address!r} is not an IP address")
        object.__setattr__(self, "host", normal_host(self.host) if self.host else "")
        object.__setattr__(self, "addresses", frozenset(normal_host(a) for a in self.addresses))

    def describe(self) -> str:
        where = f"{self.host}:{self.port}" if self.port else self.host
        return " at ".join(part for part in (self.node_id, where) if part)


@dataclass(frozen=True, slots=True)
class Listing:
    """The nodes discovery lists at one moment (an empty listing admits nobody new)."""

    nodes: frozenset[ListedNode] = frozenset()

    @classmethod
    def of(cls, nodes: Iterable[ListedNode]) -> Listing:
        return cls(frozenset(nodes))

    def describe(self) -> str:
        return ", ".join(sorted(n.describe() for n in self.nodes)) or "nobody"


@dataclass(frozen=True, slots=True)
class DiscoveryContext:
    """What a backend may need to know about the node it runs for."""

    node_id: str
    cluster: str
    partition_addr: str
    mqtt_addr: str
    membership_addr: str
    consul_addr: str
    # --discovery-option KEY=VALUE pairs (plugins read their settings here).
    options: Mapping[str, str] = field(default_factory=dict)
    # The agent's token and TLS files for consul_addr: `consul_credentials.connect(addr)`.
    consul_credentials: ConsulCredentials = NO_CREDENTIALS


@runtime_checkable
class Discovery(Protocol):
    """A discovery backend. `name` appears in logs; `listings()` yields the first listing as
    soon as it has one and a new one whenever the set changes, and runs until cancelled (a
    backend that cannot reach its source keeps quiet, or raises to be restarted after a
    pause; the agent keeps the last listing meanwhile)."""

    name: str

    def listings(self) -> AsyncIterator[Listing]: ...
