"""gRPC MembershipService: serves the current view and streams every new one.

The backend here is the embedded static one (the members file); the Consul-backed agreement of
a later issue publishes views through the same `ViewBoard`, so the gRPC surface stays the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc


class ViewBoard:
    """Holds the latest view and wakes watchers when a newer one is published."""

    def __init__(self, view: pb.View) -> None:
        self._view = view
        self._changed = asyncio.Condition()

    @property
    def view(self) -> pb.View:
        return self._view

    async def publish(self, view: pb.View) -> None:
        if view.epoch <= self._view.epoch:
            raise ValueError(f"view epoch {view.epoch} is not newer than {self._view.epoch}")
        async with self._changed:
            self._view = view
            self._changed.notify_all()

    async def newer_than(self, epoch: int) -> pb.View:
        async with self._changed:
            await self._changed.wait_for(lambda: self._view.epoch > epoch)
            return self._view


class MembershipServicer(pb_grpc.MembershipServiceServicer):
    def __init__(self, board: ViewBoard) -> None:
        self._board = board

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.View]:
        epoch = request.after_epoch
        while True:
            view = await self._board.newer_than(epoch)
            epoch = view.epoch
            yield view

    async def GetView(
        self, request: pb.GetViewRequest, context: grpc.aio.ServicerContext
    ) -> pb.View:
        return self._board.view

    # The static backend agrees on nothing: proposals, leases and status arrive with the
    # Consul-backed agent (docs/failover.md).

    async def Propose(
        self, request: pb.ProposeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProposeReply:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "static membership takes no proposals")
        raise AssertionError("unreachable")

    async def Lease(
        self, request: pb.LeaseRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LeaseState]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "static membership holds no lease")
        yield pb.LeaseState()

    async def Status(
        self, request: pb.MembershipStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.MembershipStatus:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "static membership has no status")
        raise AssertionError("unreachable")
