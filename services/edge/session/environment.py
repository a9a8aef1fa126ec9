"""EdgeServices: what a session core reads from its edge (services/edge/server.py implements
it; tests/support/edge_harness.py too): in-memory state, no I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from services.edge.access import AccessControl
    from services.edge.config import EdgeConfig
    from services.edge.limits import ConnectionLimit, ConnectionRate
    from services.edge.router import Router
    from services.edge.stats import EdgeStats
    from services.edge.tickets import Route
    from services.edge.tracing import EdgeTracer


class EdgeServices(Protocol):
    """The edge's settings, counters, tracer, routes (and subscription index), access control
    and limits; whether a partition takes commands and where they go."""

    config: EdgeConfig
    stats: EdgeStats
    tracer: EdgeTracer
    router: Router
    access: AccessControl
    limit: ConnectionLimit
    connect_rate: ConnectionRate | None

    def partition_open(self, p: int) -> bool:
        """Partition p takes commands now (services/edge/dispatch.py)."""
        ...

    def partition_route(self, p: int) -> Route | None:
        """Where partition p's commands go now."""
        ...

    def assign_client_id(self) -> str:
        """A new client id for a client that sent an empty one (MQTT-3.1.3-6)."""
        ...
