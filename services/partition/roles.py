"""How the partition master takes the roles the agreed view gives it (docs/failover.md), as
functions of its state (the state's `roles` part, services/partition/state.py). The replication
state machine decides when this node starts or stops mastering a partition
(services/partition/replication.py); the adapter (services/partition/node.py, and
services/partition/promotion.py for the load from Redis) carries that into memory here:

- **Promoted**: the partition is loaded from this node's Redis (promotion.py), then activated
  (`activate`: sessions, subscriptions, queues, retained messages, QoS 2 state) and served
  (`serve`): its subscription index goes to every edge under the new epoch, and the commands
  that waited for it are handled in arrival order. A session whose connection was live on the
  old master is kept as its connection's: its edge re-attaches it (AttachSession), and its
  will waits WILL_LINK_GRACE_MS for that.
- **Demoted**: its memory state is dropped (`unload`; the new master has it); writes of it
  still waiting for followers are never acknowledged (the group commit answers their commands
  MOVED).
- **Fencing before a handler runs**: a command for a partition this node is about to serve (it
  is loading, or the edge already knows a newer epoch than this node's view) waits, in order,
  up to WAIT_S (`must_wait`, `hold`), instead of being refused and bounced between nodes.

No clock is read here: `now` (unix ms), `now_ns` (unix ns, for spans) and the monotonic
`deadline`s come from the adapter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.membership.view import master_of
from services.partition.effects import RecordSpan, Send
from services.partition.fencing import SC, result
from services.partition.links import EdgeLink
from services.partition.session_commands import answer_takeovers
from services.partition.sessions import Session, queued_size
from services.partition.state import PartitionState
from services.partition.stored import StoredPartition, StoredSession
from services.partition.subscriptions import add_subscription, announce_partitions
from services.partition.wills import WILL_LINK_GRACE_MS

# A command for a partition this node is about to serve waits this long at most, then is
# answered UNAVAILABLE (its edge holds it and asks again).
WAIT_S = 5.0

__all__ = ["WAIT_S", "WILL_LINK_GRACE_MS"]


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


# ----- the view ------------------------------------------------------------------------


def apply_view(state: PartitionState, view: mpb.View, now_ns: int) -> None:
    """The agreed view: who masters what (for fencing answers). The roles themselves come from
    the replication state machine (`promote`, `unload`)."""
    roles = state.roles
    old = roles.view
    node_id = state.node_id
    if old is not None:
        # Who held the partitions this view gives this node (for their failover spans).
        for a in view.partitions:
            if master_of(a) == node_id and a.partition < len(old.partitions):
                before = old.partitions[a.partition].replicas
                if before and before[0] != node_id:
                    roles.previous_master[a.partition] = before[0]
    _record_catchups(state, view, now_ns)
    roles.view = view


def _record_catchups(state: PartitionState, view: mpb.View, now_ns: int) -> None:
    """A partition.catchup span per partition this node follows from when a view showed it
    out of the in-sync set until one shows it in (a restarted or re-admitted node catching up,
    by log or snapshot): how long the partition ran short of RF in-sync replicas."""
    catching_up = state.roles.catching_up
    node_id = state.node_id
    following = set()
    for a in view.partitions:
        if node_id not in a.replicas[1:]:
            continue
        following.add(a.partition)
        since = catching_up.get(a.partition)
        if node_id not in a.in_sync:
            if since is None:
                catching_up[a.partition] = now_ns
        elif since is not None:
            del catching_up[a.partition]
            attributes: dict[str, str | int] = {
                telemetry.Attr.PARTITION: a.partition,
                telemetry.Attr.EPOCH: a.epoch,
                telemetry.Attr.NODE: node_id,
                telemetry.Attr.FOLLOWER: node_id,
                telemetry.Attr.VIEW_EPOCH: view.epoch,
            }
            state.outbox.append(
                RecordSpan(telemetry.SpanName.CATCHUP, since, now_ns, dict(attributes))
            )
    for p in set(catching_up) - following:
        del catching_up[p]


def _view_master(state: PartitionState, p: int) -> tuple[str, int]:
    view = state.roles.view
    if view is None or p >= len(view.partitions):
        return "", 0
    a = view.partitions[p]
    return master_of(a), a.epoch


# ----- waiting commands ----------------------------------------------------------------


def must_wait(state: PartitionState, targets: Sequence[tuple[int, int]]) -> int | None:
    """The partition a command addressing `targets` must wait for: one about to be served
    here, or one with commands queued already, which it must not overtake (None: none)."""
    waiting = state.roles.waiting
    for p, epoch in targets:
        if waiting.get(p) or _about_to_serve(state, p, epoch):
            return p
    return None


def hold(
    state: PartitionState, p: int, link: EdgeLink, cmd: pb.EdgeCommand, deadline: float
) -> None:
    """Queue the command until p is served, or until `deadline` (monotonic seconds)."""
    state.roles.waiting.setdefault(p, deque()).append((link, cmd, deadline))


def _about_to_serve(state: PartitionState, p: int, epoch: int) -> bool:
    roles = state.roles
    if roles.mastered.get(p) == epoch:
        return False
    if roles.loading.get(p) == epoch:
        return True
    master, known = _view_master(state, p)
    # The edge knows a newer epoch than this node's view (it will arrive), or the view already
    # makes this node master and the promotion is on its way.
    return epoch > known or (master == state.node_id and epoch == known)


def take_waiting(
    state: PartitionState, partitions: Iterable[int] | None
) -> list[tuple[EdgeLink, pb.EdgeCommand]]:
    """The commands waiting for these partitions (all: None), in order, to handle again: those
    of links still linked."""
    roles, links = state.roles, state.conns.links
    out = []
    for p in list(roles.waiting if partitions is None else partitions):
        queue = roles.waiting.pop(p, None)
        while queue:
            link, cmd, _deadline = queue.popleft()
            if links.get(link.edge_id) is link:
                out.append((link, cmd))
    return out


def expire_waiting(state: PartitionState, p: int, now: float) -> int:
    """Answer UNAVAILABLE the commands waiting for p past their deadline by `now` (monotonic
    seconds); how many. What queued behind the expired ones, only so as not to overtake them,
    is then handled again by the adapter (or waits again, if it too names an epoch still to
    come). Left to expire in turn, it was refused and its edge's resend queued behind the next
    waiting command: a partition two edges wrote to stayed blocked for good."""
    queue = state.roles.waiting.get(p)
    expired = 0
    while queue and queue[0][2] <= now:
        link, cmd, _deadline = queue.popleft()
        expired += 1
        if cmd.request_id:
            event = result(
                cmd.request_id,
                SC.STATUS_CODE_UNAVAILABLE,
                message=f"partition {p} is not served by {state.node_id} yet",
            )
            state.outbox.append(Send(link, event))
    return expired


# ----- promotion and demotion ------------------------------------------------------------


def promote(state: PartitionState, p: int, epoch: int, now_ns: int) -> None:
    """This node masters p from now on, at `epoch`: it is loading until activated."""
    roles = state.roles
    if p in roles.mastered:
        unload(state, [p])  # a new tenure of a partition mastered here already
    roles.loading[p] = epoch
    roles.promoted_at[p] = now_ns


def activate(state: PartitionState, p: int, epoch: int, loaded: StoredPartition, now: int) -> bool:
    """Partition p, promoted at `epoch`, is loaded from Redis (`loaded`): its state goes live
    here. False if it was demoted (or promoted anew) meanwhile, and nothing is done."""
    roles = state.roles
    if roles.loading.get(p) != epoch:
        return False
    del roles.loading[p]
    _activate_sessions(state, p, loaded.sessions, now)
    retained = state.delivery.retained
    for msg in loaded.retained:
        retained.put(p, msg)
    roles.mastered[p] = epoch
    state.qos2.seen.load(p, loaded.seen)
    state.redelivery.load(loaded.handoffs)
    return True


def _activate_sessions(
    state: PartitionState, p: int, stored_sessions: Iterable[StoredSession], now: int
) -> None:
    sessions = state.conns.sessions
    wills = state.wills
    for stored in stored_sessions:
        session = Session(p, stored.record)
        for spec in stored.subscriptions:
            add_subscription(state, session, spec, announce=False)
        for qm in stored.queue:
            session.queue[qm.message_id] = qm
            session.queued_bytes += queued_size(qm)
            session.durable_mid = max(session.durable_mid, qm.message_id)
            # Unknown whether it was sent before (the edge says when it re-attaches): a resend
            # carries DUP.
            session.ever_sent.add(qm.message_id)
        session.q2in = stored.qos2_inbound
        rec = session.record
        if rec.will_due_at_ms:
            wills.schedule(rec.client_id, rec.will_due_at_ms)
        if not rec.disconnected_at_ms:
            # Its connection lives on an edge that will re-attach it, unless that edge went
            # with the old master: then the connection is lost, and so counted.
            session.orphan = rec.connection_id
            rec.disconnected_at_ms = now
            if rec.HasField("will"):
                due = now + WILL_LINK_GRACE_MS + rec.will.delay_interval_s * 1000
                wills.schedule(rec.client_id, due)
        sessions[session.client_id] = session


def serve(state: PartitionState, partitions: Sequence[int], now_ns: int) -> None:
    """Activated partitions start serving: their index goes to the edges (the adapter then
    handles the commands that waited for them)."""
    announce_partitions(state, partitions)
    _record_failovers(state, partitions, now_ns)


def _record_failovers(state: PartitionState, served: Sequence[int], now_ns: int) -> None:
    """A partition.failover span per partition this node took over from another master: from
    the promotion to serving (the Spark job's failover timeline)."""
    roles = state.roles
    for p in served:
        began = roles.promoted_at.pop(p, now_ns)
        previous = roles.previous_master.pop(p, "")
        if not previous:
            continue  # the first view, or this node's own partition back after a restart
        epoch = roles.mastered[p]
        attributes: dict[str, str | int] = {
            telemetry.Attr.PARTITION: p,
            telemetry.Attr.EPOCH: epoch,
            telemetry.Attr.NODE: state.node_id,
            telemetry.Attr.NODE_LOST: previous,
            # The view that made the change: a partition's epoch is the view epoch in which its
            # master changed. The view this node holds now may be later (it applies views that
            # arrive during a load together), and the Spark job files failovers under this
            # epoch.
            telemetry.Attr.VIEW_EPOCH: epoch,
        }
        state.outbox.append(
            RecordSpan(telemetry.SpanName.FAILOVER, began, now_ns, dict(attributes))
        )


def demote(state: PartitionState, partitions: Sequence[int]) -> None:
    """This node no longer masters these partitions: drop their memory state (in one pass over
    the sessions: a node removed from the view drops all its partitions at once)."""
    roles = state.roles
    for p in partitions:
        roles.loading.pop(p, None)
    unload(state, [p for p in partitions if p in roles.mastered])


def unload(state: PartitionState, partitions: Sequence[int]) -> None:
    """Forget these partitions' memory state (the store keeps it, as a follower's), in one pass
    over the sessions, QoS 2 attempts, index references and retained messages (a pass per
    partition made demoting a node's share of 10,000 sessions quadratic)."""
    parts = set(partitions)
    if not parts:
        return
    for p in parts:
        del state.roles.mastered[p]
    sessions = state.conns.sessions
    gone = [s for s in sessions.values() if s.partition in parts]
    cids = set()
    dirty, trie = state.delivery.dirty, state.index.trie
    for session in gone:
        cid = session.client_id
        cids.add(cid)
        del sessions[cid]
        dirty.pop(cid, None)
        state.wills.cancel(cid)
        for filt in session.subscriptions:
            trie.remove(filt, cid)
        session.connection = None  # its pumps and deliveries stop here
    # (A takeover's answer held for a kicked connection's close goes: see takeover.py.)
    answer_takeovers(state, state.conns.takeovers.unload(cids))
    qos2 = state.qos2
    for attempt in [k for k in qos2.attempts if k[0] in cids]:
        del qos2.attempts[attempt]
    for waiter in [k for k in qos2.waiters if k[0] in cids]:
        del qos2.waiters[waiter]
    refs = state.index.refs
    for ref in [k for k in refs if k[0] in parts]:
        del refs[ref]
    state.delivery.retained.unload(parts)
    for p in sorted(parts):
        state.index.shared.unload(p)
        qos2.seen.unload(p)
        state.redelivery.unload(p)
