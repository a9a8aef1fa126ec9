"""How the partition node takes the roles the agreed view gives it (docs/failover.md).

The replication state machine decides when this node starts or stops mastering a partition
(services/partition/replication.py: promoted once what it received as follower is durable,
demoted at once or once its own writes are stored); this mixin carries that into memory:

- **Promoted**: the partition is loaded from this node's Redis (sessions, subscriptions,
  queues, retained messages, QoS 2 state), then served: its subscription index goes to every
  edge under the new epoch, and the commands that waited for it are handled in arrival order.
  A session whose connection was live on the old master is kept as its connection's: its edge
  re-attaches it (AttachSession), and its will waits WILL_LINK_GRACE_MS for that.
- **Demoted**: its memory state is dropped (the new master has it); writes of it still waiting
  for followers are never acknowledged (the group commit answers their commands MOVED).
- **Fencing before a handler runs**: a command for a partition this node is about to serve (it
  is loading, or the edge already knows a newer epoch than this node's view) waits, in order,
  up to WAIT_S, instead of being refused and bounced between nodes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import redis.asyncio as redis

from hexmq import telemetry
from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.membership.view import master_of
from hexmq.ranges import ranges
from services.partition.commit_queue import StorageFailed
from services.partition.effects import Send
from services.partition.index_barrier import IndexBarrier
from services.partition.links import EdgeLink
from services.partition.master_state import SC, MasterState, _result
from services.partition.redelivery import SharedRedelivery
from services.partition.replication import Replicator
from services.partition.retained import RetainedMessages
from services.partition.sessions import Session, queued_size
from services.partition.store import StoredSession
from services.partition.takeover import HeldAnswer, Takeovers
from services.partition.wills import WillBoard

log = logging.getLogger(__name__)

# A command for a partition this node is about to serve waits this long at most, then is
# answered UNAVAILABLE (its edge holds it and asks again).
WAIT_S = 5.0
# Partitions loaded together after a promotion.
LOAD_BATCH = 32
# Sessions plus queued messages made live between two turns of the event loop while promoted
# partitions are activated: a failover or a restore promotes a node's share of every session at
# once, and activating them in one go stalled the loop past the agents' probe timeout (the node
# was then removed as silent, and the flapping went on under load).
ACTIVATE_AT_ONCE = 2000
# A connection lost with its edge link (or with the old master) may yet be re-attached by its
# edge: its will waits this much longer than its delay, so that a failover or a brief link
# outage does not publish the wills of live clients.
WILL_LINK_GRACE_MS = 5_000

Waiting = deque[tuple[EdgeLink, pb.EdgeCommand, float]]


def command_targets(cmd: pb.EdgeCommand, kind: str) -> list[tuple[int, int]]:
    """(partition, epoch) of every partition a command writes or reads as its master."""
    if kind == "publish":
        req = cmd.publish
        targets = [(t.partition, t.epoch) for t in req.targets]
        if req.HasField("retained"):
            targets.append((req.retained.partition, req.retained.epoch))
        return targets
    if kind in UNADDRESSED:
        return []
    return [(cmd.partition, cmd.partition_epoch)]


# Commands that name no partition of theirs: node-wide, or checked by their handler.
UNADDRESSED = frozenset(
    {
        "index_ack",
        "qos2_forget",
        "node_stats",
        "retained_query",
        "will_published",
        "shared_handoff_done",
        "kicked",
    }
)


class PartitionRoles(MasterState):
    replicator: Replicator | None
    # partition -> epoch, for partitions promoted here and being loaded from Redis.
    loading: dict[int, int]
    _waiting: dict[int, Waiting]
    _to_load: set[int]
    _loader: asyncio.Task[None] | None
    # When each partition being loaded was promoted (unix ns), and who mastered it before.
    _promoted_at: dict[int, int]
    _previous_master: dict[int, str]
    # Partitions this node follows but is not in sync of, since when (unix ns).
    _catching_up: dict[int, int]
    tracing: telemetry.Tracing
    on_failure: Callable[[BaseException], None]
    retained: RetainedMessages
    index_refs: dict[tuple[int, str], int]
    index_barrier: IndexBarrier
    wills: WillBoard
    redelivery: SharedRedelivery
    _dirty: dict[str, Session]
    _q2_attempts: dict[tuple[str, int], tuple[str, EdgeLink]]
    _q2_waiters: dict[tuple[str, int], list[tuple[EdgeLink, pb.EdgeCommand]]]

    if TYPE_CHECKING:  # defined by PartitionNode and the Subscriptions mixin

        def handle(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None: ...
        def _add_subscription(
            self, session: Session, spec: pb.SubscriptionSpec, *, announce: bool
        ) -> None: ...
        def _index_entries(self, partitions: Iterable[int]) -> list[pb.IndexEntry]: ...
        def _answer_takeovers(self, answers: list[HeldAnswer]) -> None: ...

        takeovers: Takeovers

    # ----- the view ----------------------------------------------------------------------

    def apply_view(self, view: mpb.View) -> None:
        """The agreed view: who masters what (for fencing answers). The roles themselves come
        from the replication state machine (`promoted`, `demoted`)."""
        old = self.view
        if old is not None:
            # Who held the partitions this view gives this node (for their failover spans).
            for a in view.partitions:
                if master_of(a) == self.node_id and a.partition < len(old.partitions):
                    before = old.partitions[a.partition].replicas
                    if before and before[0] != self.node_id:
                        self._previous_master[a.partition] = before[0]
        self._record_catchups(view)
        self.view = view
        self.retry_waiting()

    def _record_catchups(self, view: mpb.View) -> None:
        """A partition.catchup span per partition this node follows from when a view showed it
        out of the in-sync set until one shows it in (a restarted or re-admitted node catching
        up, by log or snapshot): how long the partition ran short of RF in-sync replicas."""
        now = time.time_ns()
        following = set()
        for a in view.partitions:
            if self.node_id not in a.replicas[1:]:
                continue
            following.add(a.partition)
            since = self._catching_up.get(a.partition)
            if self.node_id not in a.in_sync:
                if since is None:
                    self._catching_up[a.partition] = now
            elif since is not None:
                del self._catching_up[a.partition]
                self.tracing.record(
                    telemetry.SpanName.CATCHUP,
                    since,
                    now,
                    {
                        telemetry.Attr.PARTITION: a.partition,
                        telemetry.Attr.EPOCH: a.epoch,
                        telemetry.Attr.NODE: self.node_id,
                        telemetry.Attr.FOLLOWER: self.node_id,
                        telemetry.Attr.VIEW_EPOCH: view.epoch,
                    },
                )
        for p in set(self._catching_up) - following:
            del self._catching_up[p]

    def _view_master(self, p: int) -> tuple[str, int]:
        view = self.view
        if view is None or p >= len(view.partitions):
            return "", 0
        a = view.partitions[p]
        return master_of(a), a.epoch

    # ----- waiting commands --------------------------------------------------------------

    def _holds(
        self, link: EdgeLink, cmd: pb.EdgeCommand, targets: Sequence[tuple[int, int]]
    ) -> bool:
        """Queue the command if a partition it addresses is about to be served here (or has
        commands queued already, which it must not overtake); True if it was queued."""
        for p, epoch in targets:
            if self._waiting.get(p) or self._about_to_serve(p, epoch):
                queue = self._waiting.setdefault(p, deque())
                queue.append((link, cmd, self.monotonic() + WAIT_S))
                return True
        return False

    def _about_to_serve(self, p: int, epoch: int) -> bool:
        if self.mastered.get(p) == epoch:
            return False
        if self.loading.get(p) == epoch:
            return True
        master, known = self._view_master(p)
        # The edge knows a newer epoch than this node's view (it will arrive), or the view
        # already makes this node master and the promotion is on its way.
        return epoch > known or (master == self.node_id and epoch == known)

    def retry_waiting(self, partitions: Iterable[int] | None = None) -> None:
        """Handle again, in order, the commands waiting for these partitions (all: None)."""
        now = self.clock()
        for p in list(self._waiting if partitions is None else partitions):
            queue = self._waiting.pop(p, None)
            while queue:
                link, cmd, _deadline = queue.popleft()
                if self.links.get(link.edge_id) is link:
                    self.handle(link, cmd, now)

    @property
    def waiting_commands(self) -> int:
        """Commands waiting for a partition this node is about to serve."""
        return sum(len(queue) for queue in self._waiting.values())

    def expire_waiting(self, now: float) -> int:
        """Answer UNAVAILABLE the commands that waited past WAIT_S by `now` (the monotonic
        clock, seconds: a jump of the wall clock must not hold them longer); their edges ask
        again."""
        expired = 0
        for p, queue in list(self._waiting.items()):
            expired_here = 0
            while queue and queue[0][2] <= now:
                link, cmd, _deadline = queue.popleft()
                expired_here += 1
                if cmd.request_id:
                    link.send(
                        _result(
                            cmd.request_id,
                            SC.STATUS_CODE_UNAVAILABLE,
                            message=f"partition {p} is not served by {self.node_id} yet",
                        )
                    )
            if expired_here:
                # What queued behind the expired ones, only so as not to overtake them, goes
                # on now (or waits again, if it too names an epoch still to come). Left to
                # expire in turn, it was refused and its edge's resend queued behind the next
                # waiting command: a partition two edges wrote to stayed blocked for good.
                expired += expired_here
                self.retry_waiting([p])
        return expired

    # ----- promotion and demotion (RoleListener) ---------------------------------------

    def promoted(self, p: int) -> None:
        """This node masters p from now on: load it, then serve it."""
        assert self.replicator is not None
        epoch = self.replicator.mastered[p].epoch
        if p in self.mastered:
            self._unload([p])  # a new tenure of a partition mastered here already
        self.loading[p] = epoch
        self._promoted_at[p] = time.time_ns()
        self._to_load.add(p)
        if self._loader is None or self._loader.done():
            self._loader = asyncio.get_running_loop().create_task(self._load(), name="loader")

    def demoted(self, p: int) -> None:
        """This node no longer masters p: drop its memory state."""
        self.demoted_all([p])

    def demoted_all(self, partitions: Sequence[int]) -> None:
        """This node no longer masters these partitions: drop their memory state (in one pass
        over the sessions: a node removed from the view drops all its partitions at once)."""
        for p in partitions:
            self.loading.pop(p, None)
            self._to_load.discard(p)
        self._unload([p for p in partitions if p in self.mastered])
        self.retry_waiting(partitions)

    async def _load(self) -> None:
        """Load promoted partitions, LOAD_BATCH at a time (a failover promotes many at once:
        two Redis round trips per batch, not per partition)."""
        while self._to_load:
            batch = sorted(self._to_load)[:LOAD_BATCH]
            self._to_load.difference_update(batch)
            epochs = {p: self.loading[p] for p in batch if p in self.loading}
            started = time.monotonic()
            try:
                loaded = await self.store.load_partitions(list(epochs))
            except (redis.RedisError, OSError) as exc:
                self.on_failure(StorageFailed(f"redis read of partitions {batch} failed: {exc}"))
                return
            served: list[int] = []
            serving: list[int] = []
            work = 0
            for p, epoch in epochs.items():
                if self.loading.get(p) != epoch:
                    continue  # demoted (or promoted anew) meanwhile, or while yielding
                del self.loading[p]
                part = loaded[p]
                self._activate(p, epoch, part.sessions, part.retained)
                self.seen.load(p, part.seen)
                self.redelivery.load(part.handoffs)
                serving.append(p)
                work += len(part.sessions) + sum(len(s.queue) for s in part.sessions)
                if work >= ACTIVATE_AT_ONCE:
                    self._serve(serving)
                    served += serving
                    serving, work = [], 0
                    await asyncio.sleep(0)
            if serving:
                self._serve(serving)
                served += serving
            if served:
                log.info(
                    "master of partitions %s from now on (%d sessions loaded in %.0f ms)",
                    ranges(served),
                    sum(len(loaded[p].sessions) for p in served),
                    (time.monotonic() - started) * 1000,
                )

    def _serve(self, partitions: Sequence[int]) -> None:
        """Activated partitions start serving: their index goes to the edges, then the
        commands that waited for them are handled."""
        self._announce_partitions(partitions)
        self._record_failovers(partitions)
        self.retry_waiting(partitions)

    def _record_failovers(self, served: Sequence[int]) -> None:
        """A partition.failover span per partition this node took over from another master:
        from the promotion to serving (the Spark job's failover timeline)."""
        now = time.time_ns()
        for p in served:
            began = self._promoted_at.pop(p, now)
            previous = self._previous_master.pop(p, "")
            if not previous:
                continue  # the first view, or this node's own partition back after a restart
            self.tracing.record(
                telemetry.SpanName.FAILOVER,
                began,
                now,
                {
                    telemetry.Attr.PARTITION: p,
                    telemetry.Attr.EPOCH: self.mastered[p],
                    telemetry.Attr.NODE: self.node_id,
                    telemetry.Attr.NODE_LOST: previous,
                    # The view that made the change: a partition's epoch is the view epoch in
                    # which its master changed. The view this node holds now may be later (it
                    # applies views that arrive during a load together), and the Spark job
                    # files failovers under this epoch.
                    telemetry.Attr.VIEW_EPOCH: self.mastered[p],
                },
            )

    def _activate(
        self,
        p: int,
        epoch: int,
        sessions: Sequence[StoredSession],
        retained: Sequence[common_pb.Message],
    ) -> None:
        stamp = self.clock()
        for stored in sessions:
            session = Session(p, stored.record)
            for spec in stored.subscriptions:
                self._add_subscription(session, spec, announce=False)
            for qm in stored.queue:
                session.queue[qm.message_id] = qm
                session.queued_bytes += queued_size(qm)
                session.durable_mid = max(session.durable_mid, qm.message_id)
                # Unknown whether it was sent before (the edge says when it re-attaches): a
                # resend carries DUP.
                session.ever_sent.add(qm.message_id)
            session.q2in = stored.qos2_inbound
            rec = session.record
            if rec.will_due_at_ms:
                self.wills.schedule(rec.client_id, rec.will_due_at_ms)
            if not rec.disconnected_at_ms:
                # Its connection lives on an edge that will re-attach it, unless that edge
                # went with the old master: then the connection is lost, and so counted.
                session.orphan = rec.connection_id
                rec.disconnected_at_ms = stamp
                if rec.HasField("will"):
                    due = stamp + WILL_LINK_GRACE_MS + rec.will.delay_interval_s * 1000
                    self.wills.schedule(rec.client_id, due)
            self.sessions[session.client_id] = session
        for msg in retained:
            self.retained.put(p, msg)
        self.mastered[p] = epoch

    def _announce_partitions(self, partitions: Sequence[int]) -> None:
        """Tell every edge what these partitions hold, from scratch, at their epochs."""
        update = pb.IndexUpdate(
            reset_partitions=[
                pb.PartitionEpoch(partition=p, epoch=self.mastered[p]) for p in partitions
            ],
            entries=self._index_entries(partitions),
            # The whole of each partition's index is in this update: edges stop routing by
            # what they knew of these partitions before.
            snapshot_done=True,
            seq=self.index_barrier.next_seq(),
        )
        event = pb.PartitionEvent(index_update=update)
        for link in self.links.values():
            link.send(event)

    def _unload(self, partitions: Sequence[int]) -> None:
        """Forget these partitions' memory state (the store keeps it, as a follower's), in one
        pass over the sessions, QoS 2 attempts, index references and retained messages (a pass
        per partition made demoting a node's share of 10,000 sessions quadratic)."""
        parts = set(partitions)
        if not parts:
            return
        for p in parts:
            del self.mastered[p]
        gone = [s for s in self.sessions.values() if s.partition in parts]
        cids = set()
        for session in gone:
            cid = session.client_id
            cids.add(cid)
            del self.sessions[cid]
            self._dirty.pop(cid, None)
            self.wills.cancel(cid)
            for filt in session.subscriptions:
                self.trie.remove(filt, cid)
            session.connection = None  # its pumps and deliveries stop here
        # (A takeover's answer held for a kicked connection's close goes: see takeover.py.)
        self._answer_takeovers(self.takeovers.unload(cids))
        for attempt in [k for k in self._q2_attempts if k[0] in cids]:
            del self._q2_attempts[attempt]
        for waiter in [k for k in self._q2_waiters if k[0] in cids]:
            del self._q2_waiters[waiter]
        for ref in [k for k in self.index_refs if k[0] in parts]:
            del self.index_refs[ref]
        self.retained.unload(parts)
        for p in sorted(parts):
            self.shared.unload(p)
            self.seen.unload(p)
            self.redelivery.unload(p)

    def _kick_orphan(
        self, session: Session, reason: pb.KickReason.ValueType
    ) -> tuple[str, EdgeLink] | None:
        """Close the connection a promoted master inherited for the session (on whichever edge
        holds it), before another connection takes the session over (G5). Returns the
        connection kicked and its edge's link (None: that edge has no link to this master, so
        it cannot be told)."""
        conn_id, session.orphan = session.orphan, ""
        link = self.links.get(conn_id.split(".", 1)[0])
        if link is None:
            return None
        event = pb.PartitionEvent(
            kick=pb.Kick(
                client_id=session.client_id,
                connection_id=conn_id,
                reason=reason,
                confirm=link.kick_acks,
            )
        )
        self.commit.after(Send(link, event))
        return conn_id, link
