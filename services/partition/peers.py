"""ReplicationDriver: the I/O around the Replicator state machine (partition/replication.py),
which it carries out (`process`) after every step, in parts of their own:

- Master side (replication_feeds.py): each follower node opens one Replicate stream to this
  node (`serve_feed`); entries and snapshot chunks go down it, its acknowledgements and gap
  requests come back.
- Follower side: one link per node that masters partitions this node follows
  (master_link.py), and one writer task putting what they bring into this node's Redis
  (replica_writer.py).
- The view (`apply_view`, through view_door.py only): the members to dial, the protocol the
  cluster speaks, and the assignments, with the stored positions of partitions new here.
- Agreement: in-sync changes and handovers the state machine asks for go to the node's
  membership agent (services/partition/agreement.py), and its answers come back in; the
  agent's liveness lease is fed in as it changes.
- Roles: partitions this node starts or stops mastering are handed to the partition node
  (`RoleListener`), which loads or drops their memory state.
- Time: the state machine ticks every `tick_s` (lag detection, gap and join retries).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import grpc

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import ClusterProtocol
from hexmq.ranges import ranges
from hexmq.trust.grpc_tls import ClusterTLS
from services.partition.agreement import AgreementClient
from services.partition.master_link import MasterLinks
from services.partition.redis_tx import TransactionClient
from services.partition.replica_writer import ReplicaWriter
from services.partition.replication import (
    Assignment,
    Entry,
    HandoverReady,
    InSyncChange,
    Replicator,
)
from services.partition.replication_feeds import FollowerFeeds
from services.partition.store import RedisStore

log = logging.getLogger(__name__)

# How long to wait before asking the agent again after it could not be reached.
AGENT_RETRY_S = 0.5


# Releases the batches behind these tokens, each with the partitions aborted meanwhile.
Release = Callable[[list[tuple[object, frozenset[int]]]], None]


def _no_release(tokens: list[tuple[object, frozenset[int]]]) -> None:
    raise RuntimeError("batches were replicated before anything could release them")


class RoleListener(Protocol):
    """What the partition node hears of the roles the state machine takes."""

    def promoted(self, p: int) -> None: ...
    def demoted_all(self, partitions: Sequence[int]) -> None: ...


class ReplicationDriver:
    def __init__(
        self,
        core: Replicator,
        store: RedisStore,
        on_failure: Callable[[BaseException], None],
        *,
        roles: RoleListener | None = None,
        release: Release = _no_release,
        tick_s: float = 0.1,
        incarnation: int = 0,
        agent: AgreementClient | None = None,
        writer: TransactionClient | None = None,
        write_timeout: float | None = None,
        tls: ClusterTLS,
    ) -> None:
        self.core = core
        self.store = store
        self.tick_s = tick_s
        self.incarnation = incarnation
        self.roles = roles
        # What releases the master's batches once every in-sync follower has them
        # (group_commit.release_batches over the node's commit queue).
        self._release = release
        self._agent = agent
        self.feeds = FollowerFeeds(core, store, self.process, on_failure)
        self.links = MasterLinks(
            core, tls=tls, incarnation=incarnation, process=self.process, spawn=self._spawn
        )
        # What the follower's writes go through (the store's client, unless the service gives
        # its transaction writer: then each MULTI/EXEC has write_timeout in all).
        self.writer = ReplicaWriter(
            core, store, self.process, on_failure, writer=writer, write_timeout=write_timeout
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._asks: set[asyncio.Task[None]] = set()
        # When the lease stops being valid unless renewed (monotonic seconds).
        self._lease_until = 0.0
        self._lease_timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.writer.run(), name="replica-writer"),
            asyncio.create_task(self._tick_loop(), name="replica-ticker"),
        ]
        if self._agent is not None:
            self._tasks.append(asyncio.create_task(self._lease_loop(), name="lease"))

    async def stop(self) -> None:
        await self.links.stop()
        reads = self.feeds.close()
        if self._lease_timer is not None:
            self._lease_timer.cancel()
        tasks = [*self._tasks, *reads, *self._asks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def members(self) -> set[str]:
        """The node ids of the view's members (who may follow this node's partitions)."""
        return self.links.members()

    def admitted(self, view: mpb.View) -> bool:
        """The view admits this node with this partition service (its incarnation; a view
        that names none admits any, as a static membership does)."""
        me = next((m for m in view.members if m.node_id == self.core.node_id), None)
        return me is not None and me.incarnation in (0, self.incarnation)

    async def apply_view(self, view: mpb.View) -> None:
        """The agreed view (from services/partition/view_door.py only, after the node's)."""
        core = self.core
        self.links.set_peers({m.node_id: (m.partition_addr, m.tls) for m in view.members})
        assignments: dict[int, Assignment] = {}
        if self.admitted(view):
            assignments = {
                a.partition: Assignment(
                    a.epoch, tuple(a.replicas), frozenset(a.in_sync), a.handover_to
                )
                for a in view.partitions
            }
        fresh = [
            p
            for p, a in assignments.items()
            if core.node_id in a.replicas and p not in core.mastered and p not in core.followed
        ]
        stored = await self.store.load_positions(fresh) if fresh else {}
        protocol = ClusterProtocol.of_view(view)
        if protocol != core.protocol:
            log.info(
                "view %d: the cluster speaks protocol %s (was %s)",
                view.epoch,
                protocol.describe(),
                core.protocol.describe(),
            )
        telemetry.METRICS.show_protocol(protocol)
        core.set_protocol(protocol)
        core.set_view(assignments, stored)
        self.process()

    def _spawn(self, work: object, name: str) -> None:
        task = asyncio.ensure_future(work)  # type: ignore[call-overload]
        task.set_name(name)
        self._asks.add(task)
        task.add_done_callback(self._asks.discard)

    def master_durable(
        self, entries: list[Entry], token: object, aborted: frozenset[int], lazy: bool
    ) -> None:
        """A batch is durable here (GroupCommit's `on_durable`): its entries go to the
        followers, and its token comes back to `release` once they all have them."""
        self.core.master_durable(entries, token, aborted)
        self.process(lazy=lazy)

    def process(self, *, lazy: bool = False) -> None:
        """Carry out what the state machine has decided. `lazy`: what it sends followers now
        are a lazy batch's entries (hexmq/pacing.py), which may wait for company."""
        ready = self.core.ready()
        if not ready:
            return
        if ready.committed:
            self._release(ready.committed)
        roles = self.roles
        if roles is not None:
            if ready.demoted:
                log.info("no longer master of partitions %s", ranges(ready.demoted))
                roles.demoted_all(ready.demoted)
            for p in ready.promoted:
                roles.promoted(p)
        if ready.relink:
            self.links.relink()
        for change in ready.in_sync_changes:
            self._spawn(self._ask_in_sync(change), "in-sync-change")
        for handover in ready.handovers:
            self._spawn(self._ask_handover(handover), "handover")
        for follower, items in ready.to_followers.items():
            self.feeds.push(follower, items, lazy=lazy)
        for master, frame in ready.to_masters.items():
            self.links.push(master, frame)
        if ready.persist:
            self.writer.add(ready.persist)
        for read in ready.snapshot_reads:
            self.feeds.start_read(read)

    def serve_feed(
        self,
        first: pb.FollowerFrame,
        requests: AsyncIterator[pb.FollowerFrame],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.MasterFrame]:
        """Feed the follower whose hello is `first` (checked by the servicer) until it goes."""
        return self.feeds.serve(first, requests, context)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            self.core.tick()
            self.process()

    # ----- agreement -------------------------------------------------------------------

    async def _ask_in_sync(self, change: InSyncChange) -> None:
        agent = self._agent
        if agent is None:
            # No agent (a single node's view never changes): nothing to agree with.
            self.core.in_sync_settled(change, made=not change.add)
            self.process()
            return
        try:
            made = await agent.in_sync(change)
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            log.warning(
                "membership agent unreachable for an in-sync change of partition %d (%s); "
                "asking again",
                change.partition,
                exc,
            )
            await asyncio.sleep(AGENT_RETRY_S)
            self.core.in_sync_failed(change)
        else:
            if made:
                log.info(
                    "partition %d epoch %d: %s %s the in-sync set",
                    change.partition,
                    change.epoch,
                    change.follower,
                    "added to" if change.add else "removed from",
                )
            else:
                log.info(
                    "partition %d epoch %d: %s not added to the in-sync set (the view moved on)",
                    change.partition,
                    change.epoch,
                    change.follower,
                )
            self.core.in_sync_settled(change, made=made)
        self.process()

    async def _ask_handover(self, handover: HandoverReady) -> None:
        agent = self._agent
        made = False
        if agent is not None:
            try:
                made = await agent.handover(handover)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                log.warning("membership agent unreachable for a handover (%s)", exc)
        if not made:
            await asyncio.sleep(AGENT_RETRY_S)
            self.core.handover_settled(handover)
            self.process()

    async def _lease_loop(self) -> None:
        """Follow the agent's lease: valid for valid_for_ms from each message, unless renewed."""
        agent = self._agent
        assert agent is not None
        loop = asyncio.get_running_loop()
        async for state in agent.leases():
            if self._lease_timer is not None:
                self._lease_timer.cancel()
                self._lease_timer = None
            valid = state.valid and state.valid_for_ms > 0
            if valid:
                self._lease_until = time.monotonic() + state.valid_for_ms / 1000
                self._lease_timer = loop.call_later(state.valid_for_ms / 1000, self._lease_lapsed)
            self.core.set_lease(valid)
            self.process()

    def _lease_lapsed(self) -> None:
        self._lease_timer = None
        log.warning("liveness lease lapsed: lone masters stop acknowledging until it is renewed")
        self.core.set_lease(False)
        self.process()
