"""The standard gRPC health service (grpc.health.v1.Health) on a service's gRPC server.

Membership agents probe their peers' partition services with it (failure detection,
docs/failover.md), and orchestrators and load balancers use it (`grpc_health_probe`, Kubernetes
gRPC probes). The overall status ("") answers SERVING from the moment the server answers (the
library's default); a service declares it again with `await servicer.set("", SERVING)` once it
really serves, and that declaration is what HTTP /readyz reads for services without a
readiness probe of their own (hexmq.readiness.declared_by_health).
"""

from __future__ import annotations

import threading

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

_lock = threading.Lock()
# The overall status the process last declared on any of its health servicers (None: never).
# One per process, as a process has one role; read from the metrics HTTP thread.
_declared: int | None = None


class DeclaringHealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    """The library's servicer, remembering the overall status the service declares."""

    async def set(self, service: str, status: int) -> None:
        if service == "" and not self._gracefully_shutting_down:
            _declare(status)
        await super().set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        _declare(NOT_SERVING)
        await super().enter_graceful_shutdown()


def _declare(status: int) -> None:
    global _declared
    with _lock:
        _declared = status


def declared_status() -> int | None:
    """The overall status last declared in this process (None: none declared yet)."""
    with _lock:
        return _declared


def add_health(server: grpc.aio.Server) -> DeclaringHealthServicer:
    """Register the health service on `server`; the caller sets statuses with
    `await servicer.set(name, status)` ("" is the server as a whole)."""
    servicer = DeclaringHealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer
