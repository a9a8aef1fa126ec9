"""InFlight: the requests the PartitionCommands core (services/edge/hold.py) sent and has no
answer for, per node they went to (taken back when that node leaves the view or its link
breaks) and counted on each partition's PartitionHold (in flight, of them to an earlier route,
re-attaches). Pure: no asyncio, no I/O."""

from __future__ import annotations

from services.edge.partition_hold import PartitionHold
from services.edge.tickets import Kind, Route, Ticket


class InFlight:
    def __init__(self, parts: list[PartitionHold], routes: list[Route | None]) -> None:
        # The core's own lists (grown in place as views add partitions).
        self._parts = parts
        self._routes = routes
        # Per node, by serial.
        self.by_node: dict[str, dict[int, Ticket]] = {}

    def add(self, ticket: Ticket, route: Route) -> None:
        """`ticket` went to `route` (its first partition's)."""
        ticket.in_flight = True
        attach = ticket.kind is Kind.ATTACH
        parts = self._parts
        for p in ticket.partitions:
            st = parts[p]
            st.in_flight += 1
            if attach:
                st.attaching += 1
        by_node = self.by_node.get(route.node)
        if by_node is None:
            by_node = self.by_node[route.node] = {}
        by_node[ticket.serial] = ticket

    def remove(self, ticket: Ticket) -> None:
        """`ticket` is answered, or taken back."""
        ticket.in_flight = False
        routes = ticket.routes
        attach = ticket.kind is Kind.ATTACH
        for i, p in enumerate(ticket.partitions):
            st = self._parts[p]
            st.in_flight -= 1
            # (A route is replaced only by a different one: identity tells.)
            if routes[i] is not self._routes[p]:
                st.stale -= 1
            if attach:
                st.attaching -= 1
        by_node = self.by_node.get(routes[0].node)
        if by_node is not None:
            by_node.pop(ticket.serial, None)

    def take(self, node: str) -> list[Ticket]:
        """Every request in flight to `node`, removed, in the order they were made."""
        tickets = self.by_node.pop(node, None)
        if not tickets:
            return []
        taken = sorted(tickets.values(), key=lambda t: t.serial)
        for ticket in taken:
            self.remove(ticket)
        return taken
