"""RouteTable: where each partition's commands go, by the edge's view and its links to the
partition services. Part of the PartitionCommands core (services/edge/hold.py), which decides
what is sent and what is held; this says only where a partition's master is and whether it can
be reached. Pure: no asyncio, no I/O.

A partition has a route when its master (the first replica in the view) is a view member and
the link to that node is up (its index snapshot arrived). A route is its master, the
partition's epoch in the view and the link's session: a new view, a new master or a new link
session makes a new route (and requests in flight went to an earlier one).
"""

from __future__ import annotations

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.membership.view import master_of
from services.edge.tickets import Route


class RouteTable:
    def __init__(self) -> None:
        # Per partition, by the view: its epoch, its master ("" if none), and its route (None
        # while its master is no view member or the link to it is not up).
        self.epochs: list[int] = []
        self.masters: list[str] = []
        self.routes: list[Route | None] = []
        self.members: frozenset[str] = frozenset()
        self.view_epoch = 0
        # Nodes whose link is up (index snapshot arrived), with the link's session.
        self.links: dict[str, int] = {}

    def set_view(self, view: mpb.View) -> set[int]:
        """A newer view. Returns the partitions whose route changed."""
        count = len(view.partitions)
        if len(self.routes) < count:
            grow = count - len(self.routes)
            self.epochs += [0] * grow
            self.masters += [""] * grow
            self.routes += [None] * grow
        for a in view.partitions:
            self.epochs[a.partition] = a.epoch
            self.masters[a.partition] = master_of(a)
        self.members = frozenset(m.node_id for m in view.members)
        self.view_epoch = view.epoch
        return self._recompute()

    def link_up(self, node: str, session: int) -> set[int]:
        """The link to `node` is up (again). Returns the partitions whose route changed."""
        self.links[node] = session
        return self._recompute()

    def link_down(self, node: str) -> set[int]:
        """The link to `node` broke. Returns the partitions whose route changed."""
        self.links.pop(node, None)
        return self._recompute()

    def unreachable(self, p: int) -> str | None:
        """Why partition p has no route, or None when it has one."""
        master = self.masters[p]
        if not master:
            return f"the view (epoch {self.view_epoch}) names no master"
        if master not in self.members:
            return f"its master {master} is not in the view (epoch {self.view_epoch})"
        if master not in self.links:
            return f"the link to its master {master} is down"
        return None

    def _recompute(self) -> set[int]:
        changed: set[int] = set()
        links, members, routes = self.links, self.members, self.routes
        for p, master in enumerate(self.masters):
            session = links.get(master) if master in members else None
            old = routes[p]
            if session is None:
                new = None
            elif (
                old is not None
                and old.node == master
                and old.epoch == self.epochs[p]
                and old.link_session == session
            ):
                continue
            else:
                new = Route(master, self.epochs[p], session)
            if new != old:
                routes[p] = new
                changed.add(p)
        return changed
