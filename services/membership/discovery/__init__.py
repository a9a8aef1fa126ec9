"""Node discovery: which nodes may join the cluster (docs/discovery.md).

Built in: `static` (a members file), `consul` (the passing instances of a Consul catalog
service), `dns` (A/AAAA or SRV records of a name). Plugins: entry point group
`hexmq.discovery` (plugins.py). What a plugin imports from here:

    from services.membership.discovery import Discovery, DiscoveryContext, ListedNode, Listing
"""

from services.membership.discovery.model import (
    Discovery,
    DiscoveryContext,
    DiscoveryError,
    ListedNode,
    Listing,
)

__all__ = ["Discovery", "DiscoveryContext", "DiscoveryError", "ListedNode", "Listing"]
