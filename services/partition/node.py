"""PartitionNode: the partitions this node masters, and how edge commands change them.

Handling a command changes memory at once (so the next command sees it), puts its writes on the
current group-commit batch, and defers everything the edge will hear (results, deliveries, index
updates) until that batch is durable. Commands of one link are handled in arrival order.

This module holds the edge links, session open/attach/close and expiry, and the one command
table. Each other kind of work is a mixin PartitionNode inherits, a MasterState (master_state.py:
the shared state, fencing and replies): PartitionRoles (roles.py: the view, promotion and
demotion, commands waiting for a partition), Subscriptions (subscriptions.py), MessageDelivery
(delivery.py: publish, queues, retained, acks), InboundQos2 (qos2_inbound.py), SessionWills
(wills.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import KICK_ACKS, ProtocolError, Support
from hexmq.topics import TopicTrie
from services.partition.commit_queue import CommitQueue, Scope
from services.partition.delivery import LimitCounts, MessageDelivery, QueueLimits
from services.partition.effects import (
    AfterIndexed,
    AnswerTakeover,
    ConnectionReady,
    Effect,
    HandoffReady,
    HandOutShared,
    HandOutWills,
    MessageDurable,
    Pump,
    Send,
    SendReleased,
)
from services.partition.index_barrier import IndexBarrier
from services.partition.links import EdgeLink
from services.partition.master_state import SC, _result
from services.partition.qos2_inbound import InboundQos2
from services.partition.qos2_seen import SeenOrigins
from services.partition.redelivery import SharedRedelivery
from services.partition.replication import Replicator
from services.partition.retained import RetainedMessages
from services.partition.roles import (
    WILL_LINK_GRACE_MS,
    PartitionRoles,
    Waiting,
    command_targets,
)
from services.partition.sessions import NEVER_EXPIRES, LiveConnection, Session
from services.partition.shared import SharedGroups
from services.partition.sources import IdSource, RandomIds, wall_ms
from services.partition.store import RedisStore
from services.partition.subscriptions import Subscriptions
from services.partition.sysstats import NodeStatsBoard
from services.partition.takeover import HeldAnswer, Takeovers
from services.partition.tracing import AppendTracer
from services.partition.wills import SessionWills, WillBoard

log = logging.getLogger(__name__)

DEFAULT_RECEIVE_MAXIMUM = 65535
# A session of a connection whose edge link dropped is kept this long for the edge to re-attach
# it, even if its expiry interval is 0.
LINK_GRACE_MS = 30_000


def _stop_on_failure(exc: BaseException) -> None:
    raise exc


class PartitionNode(PartitionRoles, Subscriptions, MessageDelivery, InboundQos2, SessionWills):
    def __init__(
        self,
        node_id: str,
        store: RedisStore,
        commit: CommitQueue,
        tracing: telemetry.Tracing | None = None,
        limits: QueueLimits | None = None,
        replicator: Replicator | None = None,
        seen: SeenOrigins | None = None,
        on_failure: Callable[[BaseException], None] = _stop_on_failure,
        clock: Callable[[], int] = wall_ms,
        ids: IdSource | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        self.clock = clock
        self.monotonic = monotonic
        self.ids = ids or RandomIds()
        self.on_failure = on_failure
        # Partitions promoted here and being loaded (partition -> epoch), the commands waiting
        # for a partition this node is about to serve, and the loads under way.
        self.loading: dict[int, int] = {}
        self._waiting: dict[int, Waiting] = {}
        self._to_load: set[int] = set()
        self._loader: asyncio.Task[None] | None = None
        self._promoted_at: dict[int, int] = {}
        self._previous_master: dict[int, str] = {}
        self._catching_up: dict[int, int] = {}
        # Read for spans only; writes reach it through the group commit.
        self.replicator = replicator
        self.limits = limits or QueueLimits()
        # QoS >= 1 messages not queued for a session (or pushed out of it) by the limit.
        self.dropped_queue_full = 0
        # What each limit turned away (issue 25): queues, subscriptions, retained messages.
        self.limit_counts = LimitCounts()
        self.resent_publishes = 0
        self.tracing = tracing or telemetry.Tracing.disabled()
        self.tracer = AppendTracer(node_id, self.tracing, commit, replicator)
        self.store = store
        self.commit = commit
        self.view: mpb.View | None = None
        # partition -> epoch, for the partitions this node masters and has loaded.
        self.mastered: dict[int, int] = {}
        self.sessions: dict[str, Session] = {}
        # Takeovers whose answer waits for the kicked connection's edge to close it (G5).
        self.takeovers = Takeovers()
        # The retained messages of the partitions mastered here, indexed by topic level.
        self.retained = RetainedMessages()
        self.links: dict[str, EdgeLink] = {}
        self.wills = WillBoard(node_id)
        self.sys_stats = NodeStatsBoard(node_id)
        self.index_barrier = IndexBarrier()
        # Every non-shared subscription of every session here: filter -> client id -> spec.
        self.trie: TopicTrie[str, pb.SubscriptionSpec] = TopicTrie()
        # How many sessions of a partition use a (non-shared) filter; 0 <-> 1 changes go to
        # every edge.
        self.index_refs: dict[tuple[int, str], int] = {}
        # Shared subscriptions: the members of each group per partition (not in the trie: the
        # edge names the groups a partition serves for each message).
        self.shared = SharedGroups()
        # Messages of members whose connection or session ended, for other members.
        self.redelivery = SharedRedelivery(
            node_id,
            commit,
            self.shared,
            self.sessions,
            self.links,
            self._enqueue,
            self._schedule_pump,
            self.ids,
        )
        # Sessions whose record changed in the batch being gathered (written once per batch).
        self._dirty: dict[str, Session] = {}
        commit.add_finisher(self._write_dirty)
        self._released_pumps: dict[int, Session] = {}
        commit.add_release_hook(self._pump_released)
        # Inbound QoS 2 attempts that are routing now: (client id, packet id) -> the claiming
        # connection and its edge link; and the Qos2Receive commands of other connections
        # waiting for such an attempt to report (memory only: an attempt whose link is gone
        # cannot report, see close_link).
        self._q2_attempts: dict[tuple[str, int], tuple[str, EdgeLink]] = {}
        self._q2_waiters: dict[tuple[str, int], list[tuple[EdgeLink, pb.EdgeCommand]]] = {}
        # Inbound QoS 2 as a target: the origin ids of the routings stored here.
        self.seen = seen or SeenOrigins()
        self.messages_in = 0
        self.messages_out = 0

    # ----- links ------------------------------------------------------------------------

    def open_link(self, hello: pb.Hello, now: int) -> EdgeLink:
        old = self.links.get(hello.edge_id)
        if old is not None:
            self.close_link(old, now)
        try:
            kick_acks = KICK_ACKS in Support.from_proto(hello.protocol).features
        except ProtocolError:  # (refused before this by the adapter: services/partition/hello.py)
            kick_acks = False
        link = EdgeLink(hello.edge_id, hello.edge_incarnation, kick_acks=kick_acks)
        self.links[hello.edge_id] = link
        # The edge's routing index for the partitions mastered here: reset each (at its epoch),
        # snapshot, done.
        entries = self._index_entries(self.mastered)
        chunk = 4096
        resets = [pb.PartitionEpoch(partition=p, epoch=e) for p, e in sorted(self.mastered.items())]
        link.send(pb.PartitionEvent(index_update=pb.IndexUpdate(reset_partitions=resets)))
        for i in range(0, len(entries), chunk):
            link.send(
                pb.PartitionEvent(index_update=pb.IndexUpdate(entries=entries[i : i + chunk]))
            )
        link.send(
            pb.PartitionEvent(
                index_update=pb.IndexUpdate(snapshot_done=True, seq=self.index_barrier.seq)
            )
        )
        log.info("edge %s linked (incarnation %d)", hello.edge_id, hello.edge_incarnation)
        return link

    def close_link(self, link: EdgeLink, now: int) -> None:
        """The edge went away (at `now`, unix ms): its connections no longer hold their
        sessions. A session whose link dropped is kept until its expiry (plus a grace for the
        edge to re-attach)."""
        link.close()
        self.index_barrier.link_closed(link)
        self.sys_stats.link_closed(link)
        if self.links.get(link.edge_id) is link:
            del self.links[link.edge_id]
        detached = 0
        for session in self.sessions.values():
            if session.connection is not None and session.connection.link is link:
                session.detach(now)
                self._connection_lost(session, now, grace_ms=WILL_LINK_GRACE_MS)
                if session.record.will_due_at_ms:
                    self.commit.batch.put_session(session.partition, session.record)
                self._presence(session)
                detached += 1
        self._qos2_link_closed(link, now)
        # Its connections are no longer served through this master: takeovers waiting for it
        # to close one are answered.
        self._answer_takeovers(self.takeovers.link_closed(link))
        log.info("edge %s unlinked; %d sessions detached", link.edge_id, detached)

    # ----- commands ---------------------------------------------------------------------

    def handle(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        """Handle `cmd` from `link` at `now` (unix ms, the adapter's clock: handlers read no
        clock of their own)."""
        kind = cmd.WhichOneof("command") or ""
        handler = self._handlers.get(kind)
        if handler is None:
            self._reply(link, cmd, SC.STATUS_CODE_INVALID, message=f"unknown command {kind!r}")
            return
        targets = command_targets(cmd, kind)
        if not targets:
            handler(self, link, cmd, now)
            return
        if self._holds(link, cmd, targets):
            return
        # What the command adds to the batch is its own: dropped (and the command answered
        # MOVED) if a partition it wrote is aborted before the batch is released.
        commit = self.commit
        commit.handling(Scope(frozenset(p for p, _ in targets), link.send, cmd.request_id))
        try:
            handler(self, link, cmd, now)
        finally:
            commit.handling(None)

    def _open_session(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.open_session
        p = cmd.partition
        if not self._check_owner(link, cmd, p, cmd.partition_epoch):
            return
        batch = self.commit.batch
        session = self.sessions.get(req.client_id)
        # The same connection's OpenSession again: its edge re-sent it to this (new) master
        # after the first one's answer was lost with the old master. Not a takeover.
        again = session is not None and session.record.connection_id == req.connection_id
        if session is not None and _expired(session, now) and not again:
            # Past its expiry but not swept yet (the sweep runs once a second): it is gone.
            self._delete_session(session, now)
            session = None
        if session is not None and session.connection is not None and not again:
            if self.takeovers.holding(req.client_id, session.connection):
                # Its connection was never answered (its answer waits for an older kick): it
                # is answered TAKEN_OVER, never live, so no Kick (takeover.HeldAnswer).
                session.detach(now)
                self._presence(session)
            else:
                self._kick(session, pb.KICK_REASON_TAKEN_OVER, now)
            self._connection_lost(session, now)
        elif session is not None and session.orphan and not again:
            # Live on an edge that has not re-attached it to this new master yet. (An edge
            # with no link here cannot be told, nor waited for: the answer goes as before.)
            kicked = self._kick_orphan(session, pb.KICK_REASON_TAKEN_OVER)
            if kicked is not None and kicked[1].kick_acks:
                self.takeovers.kicked(req.client_id, kicked[0], kicked[1], now)
            self._connection_lost(session, now)
        if (
            session is not None
            and not again
            and (req.clean_start or _ends_with_connection(session))
        ):
            # Clean Start 1 discards the session [MQTT-3.1.2-4]; a session of Session Expiry 0
            # (3.1.1: Clean Session 1) ended with the connection this one replaces [MQTT-3.1.2-6
            # (3.1.1), 5.0 3.1.2.11.2], so the new one starts afresh: Session Present 0
            # [MQTT-3.2.2-1]. The session ends, so its will goes out now, whatever its delay
            # ("the Will Delay Interval has passed or the Session ends, whichever happens
            # first", 5.0 3.1.3.2.2). A new connection "to this Session" cancels the will
            # [MQTT-3.1.3-9]; these connections start another one.
            self._delete_session(session, now)
            session = None
        elif session is not None and session.record.will_due_at_ms:
            # A new connection before the will's delay passed: the will is not sent
            # [MQTT-3.1.3-9]; one already due goes out.
            if session.record.will_due_at_ms <= now:
                self._publish_will_now(session)
            self._clear_will(session)
        present = session is not None and session.record.created_by != req.connection_id
        if session is None:
            record = pb.SessionRecord(
                client_id=req.client_id, created_at_ms=now, created_by=req.connection_id
            )
            session = Session(p, record)
            self.sessions[req.client_id] = session
        session.record.session_expiry_s = req.session_expiry_s
        session.record.protocol_version = req.protocol_version
        if req.HasField("will"):
            session.record.will.CopyFrom(req.will)
        else:
            session.record.ClearField("will")
        conn = LiveConnection(
            link, req.connection_id, req.receive_maximum or DEFAULT_RECEIVE_MAXIMUM
        )
        session.attach(conn)
        self._presence(session)
        batch.put_session(p, session.record)
        if self.takeovers.waits(req.client_id):
            # A connection kicked may still be live: this one's CONNACK waits until it is
            # closed (G5, services/partition/takeover.py).
            event = _result(cmd.request_id, session_present=present)
            answer = HeldAnswer(link, event, session, conn)
            superseded = self.takeovers.hold(req.client_id, answer)
            if superseded is not None:
                self._answer_held(superseded)
            self.commit.after(AnswerTakeover(answer))
            return
        self._reply(link, cmd, session_present=present)
        self.commit.after(ConnectionReady(session, conn))

    def _attach_session(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.attach_session
        if not self._check_owner(link, cmd, cmd.partition, cmd.partition_epoch):
            return
        session = self.sessions.get(req.client_id)
        if session is None or session.partition != cmd.partition:
            self._reply(link, cmd, SC.STATUS_CODE_NOT_FOUND, message="session ended")
            return
        conn = session.connection
        holder = (
            conn.connection_id
            if conn is not None
            else (session.orphan or session.record.connection_id)
        )
        if holder != req.connection_id:
            self._reply(link, cmd, SC.STATUS_CODE_TAKEN_OVER, message="connection replaced")
            return
        # What the edge knows and this master may not: acknowledgements and PUBRECs it sent
        # that never got here (lost with the old master), and what its client has in flight.
        if req.acked_ids:
            removed = session.acknowledge(list(req.acked_ids))
            if removed:
                self.commit.batch.delete_messages(session.partition, session.client_id, removed)
        conn = LiveConnection(
            link, req.connection_id, req.receive_maximum or DEFAULT_RECEIVE_MAXIMUM
        )
        session.attach(conn, inflight=[*req.inflight_ids, *req.released_ids, *req.received_ids])
        # PUBREL went out for these: released stubs from now on (they are, unless the write of
        # the stub was lost with the old master), not sent again.
        self._release(session, list(req.released_ids), send=False)
        # PUBREC'd, PUBREL not sent yet: released, then sent as PUBREL once stored.
        self._release(session, list(req.received_ids))
        self._presence(session)
        # The connection lives on (its edge re-linked, or re-attached it to this new master):
        # its will is not due after all (a promoted master schedules the wills of the
        # connections it inherits, in case their edge went with the old master).
        session.record.will_due_at_ms = 0
        self.wills.cancel(session.client_id)
        self.commit.batch.put_session(session.partition, session.record)
        self._reply(link, cmd)
        self.commit.after(ConnectionReady(session, conn))

    def _close_session(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.close_session
        if not self._check_owner(link, cmd, cmd.partition, cmd.partition_epoch):
            return
        session = self.sessions.get(req.client_id)
        if (
            session is not None
            and session.connection is None
            and session.record.connection_id == req.connection_id
        ):
            # Its edge lost the link (or the old master) before this close got through: the
            # connection it closes is still the session's last one, so the close counts (a
            # graceful one must not publish the will).
            session.orphan = ""
            self.wills.cancel(session.client_id)
            session.record.will_due_at_ms = 0
        else:
            session = self._live_session(link, cmd, req.client_id, req.connection_id)
            if session is None:
                return
        if req.HasField("session_expiry_s"):
            session.record.session_expiry_s = req.session_expiry_s
        session.detach(now)
        if req.graceful and not req.send_will:
            self._clear_will(session)  # a normal DISCONNECT discards the will [MQTT-3.1.2-8]
        else:
            self._connection_lost(session, now)
        self._presence(session)
        if session.record.session_expiry_s == 0:
            self._delete_session(session, now)
        else:
            self.commit.batch.put_session(session.partition, session.record)
            if session.shared:
                self.redelivery.connection_ended(session, now)
        self._reply(link, cmd)

    def _kicked(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.kicked
        self._answer_takeovers(self.takeovers.confirmed(link, req.client_id, req.connection_id))

    def _node_stats(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        own = {
            "publish/dropped_queue_full": self.dropped_queue_full,
            "sessions/mastered": len(self.sessions),
            "messages/queued": self.queued_messages(),
            "retained/stored": len(self.retained),
            **self.limit_counts.counters(),
        }
        event = _result(cmd.request_id, node_stats=self.sys_stats.answer(link, cmd.node_stats, own))
        self.commit.after(Send(link, event))

    def _enqueue_shared(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.enqueue_shared
        p = cmd.partition
        if not self._check_owner(link, cmd, p, cmd.partition_epoch):
            return
        if self.redelivery.give(p, req.group, list(req.messages), req.online_only, now):
            self._reply(link, cmd)
            return
        online = "online " if req.online_only else ""
        self._reply(
            link,
            cmd,
            SC.STATUS_CODE_NOT_FOUND,
            message=f"no {online}member of {req.group} in partition {p}",
        )

    def _shared_handoff_done(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        self.redelivery.answered(cmd.shared_handoff_done, now)

    _handlers: dict[str, Callable[[PartitionNode, EdgeLink, pb.EdgeCommand, int], None]] = {
        "open_session": _open_session,
        "attach_session": _attach_session,
        "close_session": _close_session,
        "subscribe": Subscriptions._subscribe,
        "unsubscribe": Subscriptions._unsubscribe,
        "publish": MessageDelivery._publish,
        "delivery_ack": MessageDelivery._delivery_ack,
        "retained_query": MessageDelivery._retained_query,
        "enqueue_retained": MessageDelivery._enqueue_retained,
        "will_published": SessionWills._will_published,
        "index_ack": Subscriptions._index_ack,
        "qos2_receive": InboundQos2._qos2_receive,
        "qos2_routed": InboundQos2._qos2_routed,
        "qos2_release": InboundQos2._qos2_release,
        "qos2_forget": InboundQos2._qos2_forget,
        "enqueue_shared": _enqueue_shared,
        "shared_handoff_done": _shared_handoff_done,
        "node_stats": _node_stats,
        "kicked": _kicked,
    }

    # ----- helpers ----------------------------------------------------------------------

    def _kick(self, session: Session, reason: pb.KickReason.ValueType, now: int) -> None:
        conn = session.connection
        assert conn is not None
        link = conn.link
        event = pb.PartitionEvent(
            kick=pb.Kick(
                client_id=session.client_id,
                connection_id=conn.connection_id,
                reason=reason,
                confirm=link.kick_acks,
            )
        )
        # After the commit, like the result of the connection's own OpenSession: on its link the
        # CONNACK then always comes before the kick (MQTT-3.2.0-1).
        self.commit.after(Send(link, event))
        if link.kick_acks:
            # Its edge confirms the close; the connection taking over waits for that (G5).
            self.takeovers.kicked(session.client_id, conn.connection_id, link, now)
        session.detach(now)
        self._presence(session)

    def _delete_session(self, session: Session, now: int) -> None:
        if session.shared:
            self.redelivery.session_ended(session, now)
        if session.record.will_due_at_ms:
            self._publish_will_now(session)  # the session ends before the will's delay
        self.wills.cancel(session.client_id)
        for filt in list(session.subscriptions):
            self._remove_subscription(session, filt)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        self.commit.batch.delete_session(session.partition, session.client_id)

    def hand_out_shared(self, now: int) -> None:
        """Shared-subscription messages of members that went offline lately, and those being
        handed over (again, if unanswered), to an edge."""
        self.redelivery.sweep(now)

    # ----- effects, once their batch is released ------------------------------------------

    def carry_out(self, effect: Effect) -> None:
        """Carry out what a command left for when its batch is durable and replicated
        (services/partition/effects.py; GroupCommit.release calls this, in order)."""
        carry = _CARRY_OUT.get(type(effect))
        if carry is None:
            assert callable(effect)
            effect()  # (tracing's spans)
        else:
            carry(self, effect)

    def _connection_ready(self, e: ConnectionReady) -> None:
        e.conn.ready = True
        self._pump(e.session)

    def _answer_takeover(self, e: AnswerTakeover) -> None:
        if self.takeovers.durable(e.answer):
            self._answer_held(e.answer)

    def _answer_takeovers(self, answers: list[HeldAnswer]) -> None:
        for answer in answers:
            self._answer_held(answer)

    def _answer_held(self, answer: HeldAnswer) -> None:
        """Send a takeover's held answer (durable, and nothing kicked is live any more)."""
        if answer.superseded:
            rid = answer.event.result.request_id
            answer.link.send(
                _result(
                    rid,
                    SC.STATUS_CODE_TAKEN_OVER,
                    message="another connection took the session over before this one was accepted",
                )
            )
            return
        answer.link.send(answer.event)
        answer.conn.ready = True
        self._pump(answer.session)

    def settle_takeovers(self, now: int) -> int:
        """Answer the takeovers whose kicked connections were not confirmed closed within
        KICK_ACK_BOUND_MS (services/partition/takeover.py; logged there). Returns how many kicks
        are still waited for."""
        self._answer_takeovers(self.takeovers.expire(now))
        return len(self.takeovers)

    def _after_indexed(self, e: AfterIndexed) -> None:
        link, event = e.link, e.event
        self.index_barrier.wait(e.seq, list(self.links.values()), lambda: link.send(event))

    # ----- housekeeping -----------------------------------------------------------------

    def queued_messages(self) -> int:
        """QoS 1/2 messages held by the sessions here (one pass over the sessions)."""
        return sum(len(s.queue) for s in self.sessions.values())

    def expire_sessions(self, now: int) -> int:
        """Remove sessions whose expiry interval has passed since their connection ended."""
        expired = [session for session in self.sessions.values() if _expired(session, now)]
        for session in expired:
            self._delete_session(session, now)
        return len(expired)


def _ends_with_connection(session: Session) -> bool:
    """Session Expiry 0: the session ends when its connection closes, so a connection that
    takes it over (or comes while it waits only for its edge to re-attach it) finds none."""
    return session.record.session_expiry_s == 0


def _expired(session: Session, stamp: int) -> bool:
    """Without a connection for longer than its Session Expiry Interval. An interval of 0 waits
    LINK_GRACE_MS (its connection may have been lost only with its edge's link, and that edge
    may yet re-attach it; a normal close with interval 0 deletes the session at once)."""
    rec = session.record
    if session.connection is not None or rec.session_expiry_s == NEVER_EXPIRES:
        return False
    deadline = rec.disconnected_at_ms + rec.session_expiry_s * 1000
    if rec.session_expiry_s == 0:
        deadline += LINK_GRACE_MS
    return stamp >= deadline


def _send(node: PartitionNode, e: Send) -> None:
    e.link.send(e.event)


def _hand_out_wills(node: PartitionNode, e: HandOutWills) -> None:
    node.hand_out_wills(node.clock())


def _handoff_ready(node: PartitionNode, e: HandoffReady) -> None:
    node.redelivery.ready(e.handoff_id, node.clock())


def _hand_out_shared(node: PartitionNode, e: HandOutShared) -> None:
    node.redelivery.hand_out(node.clock())


_CARRY_OUT: dict[type, Callable[[PartitionNode, Any], None]] = {
    Send: _send,
    AfterIndexed: PartitionNode._after_indexed,
    ConnectionReady: PartitionNode._connection_ready,
    AnswerTakeover: PartitionNode._answer_takeover,
    MessageDurable: PartitionNode._message_durable,
    Pump: PartitionNode._pump_after_release,
    SendReleased: PartitionNode._send_released,
    HandOutWills: _hand_out_wills,
    HandoffReady: _handoff_ready,
    HandOutShared: _hand_out_shared,
}
