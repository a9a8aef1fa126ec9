"""gRPC PartitionService: the edge links, the replication streams and the status call.

Who may call what (hexmq.trust.guard; docs/security.md): a Link only an edge whose
certificate names the node its hello claims (`edge_id`); a replication stream only a
partition service whose certificate names the follower its hello claims, a member of the
view; the status any identity of the cluster.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator

import grpc

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.trust.guard import Guard
from hexmq.trust.identity import EDGE, PARTITION, ROLES
from services.partition.hello import refuse_hello
from services.partition.keys import queue_key, retained_key, sessions_key, subs_key
from services.partition.links import EdgeLink
from services.partition.node import PartitionNode
from services.partition.peers import ReplicationDriver
from services.partition.replication import Replicator
from services.partition.replication_status import follower_status
from services.partition.sessions import Session

log = logging.getLogger(__name__)


class PartitionServicer(pb_grpc.PartitionServiceServicer):
    def __init__(
        self,
        node: PartitionNode,
        replication: ReplicationDriver,
        ready: asyncio.Event,
        guard: Guard,
    ) -> None:
        self._node = node
        self._replication = replication
        self._ready = ready
        self._guard = guard

    async def Link(
        self,
        request_iterator: AsyncIterator[pb.EdgeFrame],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.PartitionFrame]:
        await self._ready.wait()
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first frame must carry hello")
            return
        await self._guard.admit(context, "Link", roles={EDGE}, claimed=first.hello.edge_id)
        peer = f"edge {first.hello.edge_id}"
        if await refuse_hello(context, peer, first.hello.protocol, "the edge's link", log):
            return
        node = self._node
        link = node.open_link(first.hello, node.clock())
        reader = asyncio.create_task(self._read(link, first, request_iterator))
        try:
            while True:
                frames = await link.frames()
                if not frames:
                    break
                for frame in frames:
                    yield frame
        finally:
            reader.cancel()
            node.close_link(link, node.clock())

    async def _read(
        self, link: EdgeLink, first: pb.EdgeFrame, frames: AsyncIterator[pb.EdgeFrame]
    ) -> None:
        node = self._node
        try:
            now = node.clock()  # (once per frame: its commands arrived together)
            for cmd in first.commands:
                node.handle(link, cmd, now)
            async for frame in frames:
                if link.closed:
                    break
                now = node.clock()
                for cmd in frame.commands:
                    node.handle(link, cmd, now)
        except grpc.aio.AioRpcError:
            pass
        except Exception:
            log.exception("edge %s: command handling failed; closing the link", link.edge_id)
        finally:
            link.close()

    async def Replicate(
        self,
        request_iterator: AsyncIterator[pb.FollowerFrame],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.MasterFrame]:
        await self._ready.wait()
        first = await anext(aiter(request_iterator), None)
        if first is None or not first.HasField("hello"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "first frame must carry hello")
            return
        await self._guard.admit(
            context,
            "Replicate",
            roles={PARTITION},
            claimed=first.hello.node_id,
            members=self._replication.members(),
        )
        async for frame in self._replication.serve_feed(first, request_iterator, context):
            yield frame

    async def Status(
        self,
        request: pb.StatusRequest,
        context: grpc.aio.ServicerContext,
    ) -> pb.StatusReply:
        await self._guard.admit(context, "Status", roles=ROLES)
        return status_reply(self._node, self._replication.core)


def status_reply(node: PartitionNode, replicator: Replicator) -> pb.StatusReply:
    """A node's partitions by role (with each follower's lag), for `hexmq cluster status`."""
    per_partition: dict[int, list[Session]] = {p: [] for p in node.mastered}
    for session in node.sessions.values():
        per_partition.setdefault(session.partition, []).append(session)
    partitions = [
        pb.PartitionStatus(
            partition=p,
            epoch=epoch,
            role="master",
            sequence=replicator.position(p)[1],
            sessions=len(per_partition[p]),
            queued_messages=sum(len(s.queue) for s in per_partition[p]),
            followers=follower_status(
                replicator, p, functools.partial(state_bytes, node, p, per_partition[p])
            ),
        )
        for p, epoch in sorted(node.mastered.items())
    ]
    partitions += [
        pb.PartitionStatus(
            partition=p,
            epoch=fp.epoch,
            role="follower",
            sequence=fp.received[1],
            master=fp.master,
        )
        for p, fp in sorted(replicator.followed.items())
    ]
    return pb.StatusReply(
        node_id=node.node_id,
        partitions=partitions,
        connected_sessions=sum(1 for s in node.sessions.values() if s.connection),
        edges=len(node.links),
        messages_in=node.messages_in,
        messages_out=node.messages_out,
    )


# Per storage op beyond its key, field and value (replication.op_size's measure).
_OP = 8


def state_bytes(node: PartitionNode, p: int, sessions: list[Session]) -> int:
    """About how large partition p's snapshot is, in replication.op_size's measure, from what
    its master holds in memory: sessions with their subscriptions, queues and inbound QoS 2
    state, and retained messages (remembered QoS 2 origins and shared handoffs, small, are
    left out)."""
    size = 0
    records = len(sessions_key(p)) + _OP
    for s in sessions:
        cid = s.client_id
        size += records + len(cid) + s.record.ByteSize()
        subs = len(subs_key(p, cid)) + _OP
        size += sum(subs + len(f) + spec.ByteSize() for f, spec in s.subscriptions.items())
        queued = len(queue_key(p, cid)) + _OP + 6  # + a message id's digits, about
        size += sum(queued + qm.ByteSize() for qm in s.queue.values())
        size += sum(queued + q.ByteSize() for q in s.q2in.values())
    retained = len(retained_key(p)) + _OP
    size += sum(
        retained + len(topic) + msg.ByteSize()
        for topic, (q, msg) in node.retained.items()
        if q == p
    )
    return size
