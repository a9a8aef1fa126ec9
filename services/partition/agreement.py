"""The partition service's side of the agreement: what it asks its node's membership agent.

Only a partition's master knows how far its followers are, so it alone asks for in-sync
changes (a caught-up follower added, a lagging or lost one removed) and, once quiesced, for the
handover the view asks of it (docs/failover.md). Each request is one `Propose` call that the
agent answers once the change holds in an agreed view, or can no longer be made. The agent also
streams the node's liveness lease, which a lone master of a replicated partition needs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.membership.v1 import membership_pb2_grpc as mpb_grpc
from hexmq.trust.grpc_tls import RenewingChannel
from services.partition.replication import HandoverReady, InSyncChange

log = logging.getLogger(__name__)

# A Propose call waits for the agreed view; past this the request is asked again.
PROPOSE_TIMEOUT_S = 30.0


class AgreementClient:
    def __init__(self, target: str, incarnation: int, channel: RenewingChannel) -> None:
        self._target = target
        self._incarnation = incarnation
        self._channel = channel

    async def _stub(self) -> mpb_grpc.MembershipServiceStub:
        return mpb_grpc.MembershipServiceStub(await self._channel.get())

    async def close(self) -> None:
        await self._channel.close()

    async def in_sync(self, change: InSyncChange) -> bool:
        """Ask for the change; True once it holds in an agreed view, False when the agent will
        not make it (an addition it refuses; any change once the partition moved on: this
        node no longer masters it at that epoch, and must not shrink the set it counts
        acknowledgements from). An agent of v0.2.0 answers a moot removal as made."""
        request = mpb.ProposeRequest(
            incarnation=self._incarnation,
            in_sync=[
                mpb.InSyncChange(
                    partition=change.partition,
                    epoch=change.epoch,
                    add=[change.follower] if change.add else [],
                    remove=[] if change.add else [change.follower],
                    add_incarnations={change.follower: change.incarnation} if change.add else {},
                )
            ],
        )
        reply = await (await self._stub()).Propose(request, timeout=PROPOSE_TIMEOUT_S)
        return change.partition not in reply.rejected

    async def handover(self, ready: HandoverReady) -> bool:
        """Ask for the handover; True once the view has made `ready.to` master."""
        request = mpb.ProposeRequest(
            incarnation=self._incarnation,
            handovers=[mpb.Handover(partition=ready.partition, epoch=ready.epoch, to=ready.to)],
        )
        reply = await (await self._stub()).Propose(request, timeout=PROPOSE_TIMEOUT_S)
        return ready.partition not in reply.rejected

    async def leases(self) -> AsyncIterator[mpb.LeaseState]:
        """The agent's lease messages, reconnecting on its own (while the agent cannot be
        reached, the last lease runs out by itself)."""
        backoff = 0.05
        while True:
            try:
                async for state in (await self._stub()).Lease(mpb.LeaseRequest()):
                    backoff = 0.05
                    yield state
            except grpc.aio.AioRpcError as exc:
                log.debug("lease stream from %s: %s", self._target, exc.code().name)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
