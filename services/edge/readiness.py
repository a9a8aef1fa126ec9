"""When an edge is ready for clients: its node is in the view and it can route everywhere.

A load balancer sends a client to an edge only when that edge can serve it (/readyz, gRPC
health on --health-listen): the view lists this node (so the cluster counts it), and every
partition of the view has a master whose link from this edge is up with its subscription index
loaded (so any client's session and any publish can be routed). A standalone edge (`--standalone`:
one of a pool of edges with ids of their own, no node's) has no node to be listed: it is ready
on the second condition alone. A pure function of the view and the links, so the failover work
can refine it and tests need no processes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.membership.view import master_of
from hexmq.readiness import Readiness

# Nodes named in a reason, at most (a line for operators, not a report).
_NAMED = 5


class Link(Protocol):
    """What readiness reads of a partition link (services.edge.links.PartitionLink)."""

    @property
    def ready(self) -> bool: ...


def edge_readiness(
    node_id: str, view: mpb.View | None, links: Mapping[str, Link], *, standalone: bool = False
) -> Readiness:
    if view is None:
        return Readiness(False, "no view from membership yet")
    if not standalone and all(m.node_id != node_id for m in view.members):
        return Readiness(False, f"node {node_id} is not in view {view.epoch}")
    unrouted = 0
    masters_down: set[str] = set()
    for assignment in view.partitions:
        master = master_of(assignment) or None
        link = links.get(master) if master is not None else None
        if link is None or not link.ready:
            unrouted += 1
            if master is not None:
                masters_down.add(master)
    if unrouted:
        named = sorted(masters_down)
        nodes = ", ".join(named[:_NAMED]) + (", ..." if len(named) > _NAMED else "")
        return Readiness(
            False,
            f"view {view.epoch}: {unrouted} of {len(view.partitions)} partitions have no "
            f"master this edge can reach" + (f" (masters {nodes})" if nodes else ""),
        )
    return Readiness(True, f"view {view.epoch}: routes all {len(view.partitions)} partitions")
