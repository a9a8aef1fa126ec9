"""The standard gRPC health service (grpc.health.v1.Health) on a service's gRPC server.

Membership agents probe their peers' partition services with it (failure detection,
docs/failover.md), and orchestrators use it as a liveness check. The overall status ("") is
SERVING once the service serves; a service may set its own name's status too.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def add_health(server: grpc.aio.Server) -> health.aio.HealthServicer:
    """Register the health service on `server`; the caller sets statuses with
    `await servicer.set(name, status)` ("" is the server as a whole)."""
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer
