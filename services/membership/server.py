"""gRPC MembershipService: the agent's face to the node's own services.

Watch streams agreed views (nothing until the first view exists) and, when the caller is the
partition service (incarnation > 0), registers that incarnation for as long as the stream is
open; GetView, Propose, Lease and Status answer from the agent (services/membership/agent.py).

Who may call what (hexmq.trust.guard; docs/security.md): anything that changes the cluster or
speaks for the node (a Watch that registers a partition service, Propose) only the node's own
partition service; Leave the node's own services or an operator; the node's lease its own
partition service or an operator; the view and the status any identity of the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.node_protocol import THIS_RELEASE, ProtocolError, Support, link_refusal
from hexmq.trust.guard import Guard
from hexmq.trust.identity import EDGE, MEMBERSHIP, OPERATOR, PARTITION, ROLES
from services.membership.proposals import ProposalError, requests_from_proto

if TYPE_CHECKING:
    from services.membership.agent import MembershipAgent

log = logging.getLogger("hexmq.membership")


class MembershipServicer(pb_grpc.MembershipServiceServicer):
    def __init__(self, agent: MembershipAgent, guard: Guard) -> None:
        self._agent = agent
        self._guard = guard
        self._node = agent.config.node_id

    async def _own_partition(self, context: grpc.aio.ServicerContext, rpc: str) -> None:
        await self._guard.admit(context, rpc, roles={PARTITION}, node=self._node)

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.View]:
        incarnation = request.incarnation
        if incarnation:
            # Registers the node with this incarnation: only its own partition service may.
            await self._own_partition(context, "Watch with an incarnation")
            protocol = await self._partition_protocol(request, context)
            self._agent.partition_attached(incarnation, protocol)
        else:
            await self._guard.admit(context, "Watch", roles={EDGE, PARTITION, OPERATOR})
        try:
            epoch = request.after_epoch
            while True:
                view = await self._agent.board.newer_than(epoch)
                epoch = view.epoch
                yield view
        finally:
            if incarnation:
                self._agent.partition_detached(incarnation)

    async def _partition_protocol(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> Support:
        """What the watching partition service speaks; its watch is refused if that shares no
        version with this agent (the node could not be registered as either speaks)."""
        try:
            protocol = Support.from_proto(request.protocol)
        except ProtocolError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"protocol: {exc}")
            raise AssertionError("unreachable") from exc
        why = link_refusal(
            f"partition service incarnation {request.incarnation}", protocol, THIS_RELEASE
        )
        if why is not None:
            log.error("refusing the watch: %s; upgrade this agent or that service", why)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
            raise AssertionError("unreachable")
        return protocol

    async def GetView(
        self, request: pb.GetViewRequest, context: grpc.aio.ServicerContext
    ) -> pb.View:
        await self._guard.admit(context, "GetView", roles=ROLES)
        view = self._agent.board.view
        if view is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no view agreed yet")
            raise AssertionError("unreachable")
        return view

    async def Propose(
        self, request: pb.ProposeRequest, context: grpc.aio.ServicerContext
    ) -> pb.ProposeReply:
        await self._own_partition(context, "Propose")
        view = self._agent.board.view
        if view is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no view agreed yet")
            raise AssertionError("unreachable")
        current = self._agent.incarnation
        if request.incarnation != current or current == 0:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"incarnation {request.incarnation} is not the partition service this agent "
                f"serves ({current or 'none is watching'})",
            )
            raise AssertionError("unreachable")
        try:
            requests = requests_from_proto(request, view.partition_count)
        except ProposalError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("unreachable") from exc
        try:
            return await self._agent.propose(requests)
        except TimeoutError:
            await context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                "the change does not hold in an agreed view yet; ask again",
            )
            raise AssertionError("unreachable") from None

    async def Lease(
        self, request: pb.LeaseRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LeaseState]:
        await self._guard.admit(context, "Lease", roles={PARTITION, OPERATOR}, node=self._node)
        seen = self._agent.lease_version
        while True:
            lease = self._agent.lease()
            yield pb.LeaseState(valid=lease.valid, valid_for_ms=lease.valid_for_ms)
            seen = await self._agent.lease_changes(seen)

    async def Status(
        self, request: pb.MembershipStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.MembershipStatus:
        await self._guard.admit(context, "Status", roles=ROLES)
        return self._agent.status()

    async def Leave(
        self, request: pb.LeaveRequest, context: grpc.aio.ServicerContext
    ) -> pb.LeaveReply:
        await self._guard.admit(
            context, "Leave", roles={PARTITION, MEMBERSHIP, OPERATOR}, node=self._node
        )
        if self._agent.board.view is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no view agreed yet")
            raise AssertionError("unreachable")
        return await self._agent.leave(request.wait_ms / 1000)
