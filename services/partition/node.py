"""PartitionNode: the partitions this node masters, and how edge commands change them.

Handling a command changes memory at once (so the next command sees it), puts its writes on the
current group-commit batch, and defers everything the edge will hear (results, deliveries, index
updates) until that batch is durable. Commands of one link are handled in arrival order.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from hexmq import telemetry
from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.topics import TopicTrie, topic_matches
from services.partition.index_barrier import IndexBarrier
from services.partition.links import EdgeLink
from services.partition.master_state import SC, _result, now_ms
from services.partition.qos2_inbound import InboundQos2
from services.partition.qos2_seen import SeenOrigins
from services.partition.redelivery import SharedRedelivery
from services.partition.replication import Replicator
from services.partition.sessions import NEVER_EXPIRES, LiveConnection, Session
from services.partition.shared import SharedGroups
from services.partition.store import GroupCommit, RedisStore, WriteBatch
from services.partition.subscriptions import Subscriptions
from services.partition.sysstats import NodeStatsBoard
from services.partition.tracing import AppendTracer, set_carrier
from services.partition.wills import SessionWills, WillBoard

log = logging.getLogger(__name__)

DEFAULT_RECEIVE_MAXIMUM = 65535
DEFAULT_MAX_QUEUED = 100_000
# A session of a connection whose edge link dropped is kept this long for the edge to re-attach
# it, even if its expiry interval is 0.
LINK_GRACE_MS = 30_000
# A connection lost with its edge link may yet be re-attached by that edge: its will waits this
# much longer than its delay, so a brief link outage does not publish the wills of live clients.
WILL_LINK_GRACE_MS = 5_000


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How many QoS >= 1 messages one session may hold (sent and unsent), and which one goes
    when it is full: the newest is not queued (mosquitto's behaviour) or the oldest is dropped."""

    max_queued_messages: int = DEFAULT_MAX_QUEUED
    drop_oldest: bool = False


class PartitionNode(Subscriptions, InboundQos2, SessionWills):
    def __init__(
        self,
        node_id: str,
        store: RedisStore,
        commit: GroupCommit,
        tracing: telemetry.Tracing | None = None,
        limits: QueueLimits | None = None,
        replicator: Replicator | None = None,
        seen: SeenOrigins | None = None,
    ) -> None:
        self.node_id = node_id
        # Read for spans only; writes reach it through the group commit.
        self.replicator = replicator
        self.limits = limits or QueueLimits()
        # QoS >= 1 messages not queued for a session (or pushed out of it) by the limit.
        self.dropped_queue_full = 0
        self.tracing = tracing or telemetry.Tracing.disabled()
        self.tracer = AppendTracer(node_id, self.tracing, commit, replicator)
        self.store = store
        self.commit = commit
        self.view: mpb.View | None = None
        # partition -> epoch, for the partitions this node masters and has loaded.
        self.mastered: dict[int, int] = {}
        self.sessions: dict[str, Session] = {}
        # topic -> (partition, message): the retained messages of the partitions mastered here.
        self.retained: dict[str, tuple[int, common_pb.Message]] = {}
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
            store,
            commit,
            self.shared,
            self.sessions,
            self.links,
            self._enqueue,
            self._schedule_pump,
        )
        # Sessions whose record changed in the batch being gathered (written once per batch).
        self._dirty: dict[str, Session] = {}
        commit.add_finisher(self._write_dirty)
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

    # ----- view and loading -------------------------------------------------------------

    async def apply_view(self, view: mpb.View) -> None:
        """Take over the partitions the view makes this node master of. Moving partitions
        between nodes (handover, catch-up) arrives with the cluster data plane."""
        first = self.view is None
        self.view = view
        mine = {a.partition: a.epoch for a in view.partitions if a.replicas[0] == self.node_id}
        if not first and set(mine) != set(self.mastered):
            log.error(
                "view %d moves partitions; live repartitioning is not supported yet", view.epoch
            )
            return
        for p, epoch in sorted(mine.items()):
            for stored in await self.store.load_partition(p):
                session = Session(p, stored.record)
                for spec in stored.subscriptions:
                    self._add_subscription(session, spec, announce=False)
                for qm in stored.queue:
                    session.queue[qm.message_id] = qm
                    session.durable_mid = max(session.durable_mid, qm.message_id)
                    # Unknown whether it was sent before the restart: resend as a duplicate.
                    session.ever_sent.add(qm.message_id)
                session.q2in = stored.qos2_inbound
                rec = session.record
                if rec.will_due_at_ms:
                    self.wills.schedule(rec.client_id, rec.will_due_at_ms)
                if not rec.disconnected_at_ms:
                    # Its connection was lost with the old process; edges re-attach live ones.
                    rec.disconnected_at_ms = now_ms()
                    if rec.HasField("will"):
                        due = rec.disconnected_at_ms + WILL_LINK_GRACE_MS
                        self.wills.schedule(rec.client_id, due + rec.will.delay_interval_s * 1000)
                self.sessions[session.client_id] = session
            for msg in await self.store.load_retained(p):
                self.retained[msg.topic] = (p, msg)
            self.seen.load(p, await self.store.load_qos2_seen(p))
            self.redelivery.load(await self.store.load_handoffs(p))
            self.mastered[p] = epoch
        log.info(
            "view %d: master of %d partitions, %d sessions loaded",
            view.epoch,
            len(self.mastered),
            len(self.sessions),
        )

    # ----- links ------------------------------------------------------------------------

    def open_link(self, hello: pb.Hello) -> EdgeLink:
        old = self.links.get(hello.edge_id)
        if old is not None:
            self.close_link(old)
        link = EdgeLink(hello.edge_id, hello.edge_incarnation)
        self.links[hello.edge_id] = link
        # The edge's routing index for this node: reset, snapshot, done.
        entries = [pb.IndexEntry(partition=p, filter=f, present=True) for (p, f) in self.index_refs]
        entries += self.shared.entries()
        chunk = 4096
        link.send(pb.PartitionEvent(index_update=pb.IndexUpdate(reset=True)))
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

    def close_link(self, link: EdgeLink) -> None:
        """The edge went away: its connections no longer hold their sessions. A session whose
        link dropped is kept until its expiry (plus a grace for the edge to re-attach)."""
        link.close()
        self.index_barrier.link_closed(link)
        self.sys_stats.link_closed(link)
        if self.links.get(link.edge_id) is link:
            del self.links[link.edge_id]
        detached = 0
        stamp = now_ms()
        for session in self.sessions.values():
            if session.connection is not None and session.connection.link is link:
                session.detach(stamp)
                self._connection_lost(session, stamp, grace_ms=WILL_LINK_GRACE_MS)
                if session.record.will_due_at_ms:
                    self.store.put_session(self.commit.batch, session.partition, session.record)
                self._presence(session)
                detached += 1
        self._qos2_link_closed(link)
        log.info("edge %s unlinked; %d sessions detached", link.edge_id, detached)

    # ----- commands ---------------------------------------------------------------------

    def handle(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        kind = cmd.WhichOneof("command")
        handler = self._handlers.get(kind or "")
        if handler is None:
            self._reply(link, cmd, SC.STATUS_CODE_INVALID, message=f"unknown command {kind!r}")
            return
        handler(self, link, cmd)

    def _open_session(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        req = cmd.open_session
        p = cmd.partition
        if not self._check_owner(link, cmd, p, cmd.partition_epoch):
            return
        batch = self.commit.batch
        stamp = now_ms()
        session = self.sessions.get(req.client_id)
        if session is not None and _expired(session, stamp):
            # Past its expiry but not swept yet (the sweep runs once a second): it is gone.
            self._delete_session(session)
            session = None
        if session is not None and session.connection is not None:
            self._kick(session, reason_code=0x8E)
            self._connection_lost(session, stamp)
        if session is not None and req.clean_start:
            self._delete_session(session)
            session = None
        elif session is not None and session.record.will_due_at_ms:
            # A new connection before the will's delay passed: the will is not sent
            # [MQTT-3.1.3-9]; one already due goes out.
            if session.record.will_due_at_ms <= stamp:
                self._publish_will_now(session)
            self._clear_will(session)
        present = session is not None
        if session is None:
            session = Session(p, pb.SessionRecord(client_id=req.client_id, created_at_ms=now_ms()))
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
        self.store.put_session(batch, p, session.record)
        self._reply(link, cmd, session_present=present)
        self.commit.after(functools.partial(self._connection_ready, session, conn))

    def _attach_session(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        req = cmd.attach_session
        if not self._check_owner(link, cmd, cmd.partition, cmd.partition_epoch):
            return
        session = self.sessions.get(req.client_id)
        if session is None:
            self._reply(link, cmd, SC.STATUS_CODE_NOT_FOUND, message="session ended")
            return
        if session.connection is not None and session.connection.connection_id != req.connection_id:
            self._reply(link, cmd, SC.STATUS_CODE_TAKEN_OVER, message="connection replaced")
            return
        conn = LiveConnection(
            link, req.connection_id, req.receive_maximum or DEFAULT_RECEIVE_MAXIMUM
        )
        session.attach(conn)
        self._presence(session)
        if session.record.will_due_at_ms:
            # The connection lives on (its edge re-linked): its will is not due after all.
            session.record.will_due_at_ms = 0
            self.wills.cancel(session.client_id)
        self.store.put_session(self.commit.batch, session.partition, session.record)
        self._reply(link, cmd)
        self.commit.after(functools.partial(self._connection_ready, session, conn))

    def _close_session(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        req = cmd.close_session
        session = self._live_session(link, cmd, req.client_id, req.connection_id)
        if session is None:
            return
        if req.HasField("session_expiry_s"):
            session.record.session_expiry_s = req.session_expiry_s
        stamp = now_ms()
        session.detach(stamp)
        if req.graceful and not req.send_will:
            self._clear_will(session)  # a normal DISCONNECT discards the will [MQTT-3.1.2-8]
        else:
            self._connection_lost(session, stamp)
        self._presence(session)
        if session.record.session_expiry_s == 0:
            self._delete_session(session)
        else:
            self.store.put_session(self.commit.batch, session.partition, session.record)
            if session.shared:
                self.redelivery.connection_ended(session, stamp)
        self._reply(link, cmd)

    def _publish(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        req = cmd.publish
        targets = set()
        shared: list[pb.PartitionTarget] = []
        for target in req.targets:
            if not self._check_owner(link, cmd, target.partition, target.epoch):
                return
            targets.add(target.partition)
            if target.shared:
                shared.append(target)
        has_retained = req.HasField("retained")
        if has_retained and not self._check_owner(
            link, cmd, req.retained.partition, req.retained.epoch
        ):
            return
        if req.qos2_origin:
            # A QoS 2 routing: the partitions that stored this claim's message already (an
            # earlier attempt at it) store nothing again, and answer success all the same.
            origin, stamp = req.qos2_origin, now_ms()
            fresh = self.seen.admit(
                origin, [*targets, req.retained.partition] if has_retained else targets, stamp
            )
            if not fresh:
                self._reply(link, cmd)
                return
            for p in fresh:
                self.store.put_qos2_seen(self.commit.batch, p, origin, stamp)
            targets &= fresh
            shared = [t for t in shared if t.partition in fresh]
            has_retained = has_retained and req.retained.partition in fresh
        self.messages_in += 1
        msg = req.message
        if has_retained:
            self._store_retained(req.retained.partition, msg)
        # partition -> subscriber sessions it delivers this message to (when traced).
        fanout: dict[int, int] = {}
        # partition -> trace carrier of its append span, when this publish is traced.
        carriers = self.tracer.append(msg, req.targets, fanout) if msg.trace.carrier else None
        # One delivery per session at the highest granted QoS, with every matching
        # subscription identifier (MQTT-3.3.4-3/-4/-5).
        matched: dict[str, tuple[int, list[int], bool]] = {}
        for _filter, cid, spec in self.trie.match(msg.topic):
            if spec.no_local and cid == msg.publisher_id:
                continue
            qos, ids, retain = matched.get(cid, (-1, [], False))
            if spec.subscription_id:
                ids.append(spec.subscription_id)
            matched[cid] = (max(qos, spec.qos), ids, retain or spec.retain_as_published)
        # Sessions that get this message only as one shared group's member: client id -> group.
        group_only = self._match_shared(shared, msg.topic, matched) if shared else None
        for cid, (sub_qos, ids, rap) in matched.items():
            session = self.sessions[cid]
            if session.partition not in targets:
                continue
            qos = min(msg.qos, sub_qos)
            if qos == 0:
                if session.connection is not None:
                    transient = pb.QueuedMessage(
                        qos=0, message=msg, subscription_ids=ids, retain=rap and msg.retain
                    )
                    if carriers:
                        set_carrier(transient, carriers[session.partition])
                        fanout[session.partition] = fanout.get(session.partition, 0) + 1
                    session.enqueue_transient(transient)
                    self._schedule_pump(session)
                continue
            qm = pb.QueuedMessage(
                qos=qos, message=msg, subscription_ids=ids, retain=rap and msg.retain
            )
            if group_only and cid in group_only:
                qm.shared_group = group_only[cid]
            if carriers:
                set_carrier(qm, carriers[session.partition])
            if self._enqueue(session, qm) and carriers:
                fanout[session.partition] = fanout.get(session.partition, 0) + 1
        self._reply(link, cmd)

    def _match_shared(
        self,
        targets: list[pb.PartitionTarget],
        topic: str,
        matched: dict[str, tuple[int, list[int], bool]],
    ) -> dict[str, str]:
        """Add to `matched` the one member of each shared group that the edge named for these
        partitions (a session chosen for a group that also has other matching subscriptions
        gets one delivery for all of them, as for overlapping subscriptions). Returns the
        sessions matched by one group and nothing else, with that group."""
        group_only: dict[str, str] = {}
        for target in targets:
            for filt in target.shared:
                if not topic_matches(filt, topic):
                    continue
                session = self.shared.pick(target.partition, filt)
                if session is None:
                    continue  # the group left this partition after the edge routed the message
                spec = session.subscriptions[filt]
                cid = session.client_id
                prior = matched.get(cid)
                if prior is None:
                    group_only[cid] = filt
                    prior = (-1, [], False)
                else:
                    group_only.pop(cid, None)
                qos, ids, retain = prior
                if spec.subscription_id:
                    ids.append(spec.subscription_id)
                matched[cid] = (max(qos, spec.qos), ids, retain or spec.retain_as_published)
        return group_only

    def _enqueue(self, session: Session, qm: pb.QueuedMessage) -> bool:
        """Queue a QoS >= 1 message for `session` (its message id is assigned here), durably,
        within the session's limit; False if the limit turned it away."""
        batch = self.commit.batch
        if len(session.queue) >= self.limits.max_queued_messages:
            self.dropped_queue_full += 1
            if not self.limits.drop_oldest:
                return False  # the newest is not queued for this session
            oldest = next(iter(session.queue))
            session.acknowledge([oldest])
            self.store.delete_messages(batch, session.partition, session.client_id, [oldest])
        qm.message_id = session.next_message_id()
        session.enqueue(qm)
        self.store.put_message(batch, session.partition, session.client_id, qm)
        self._dirty[session.client_id] = session
        self.commit.after(functools.partial(self._durable, session, qm.message_id))
        return True

    def _store_retained(self, p: int, msg: common_pb.Message) -> None:
        """Set (or, with an empty payload, delete) the topic's retained message."""
        if msg.payload:
            kept = common_pb.Message()
            kept.CopyFrom(msg)
            kept.retain = True
            kept.ClearField("trace")
            self.retained[msg.topic] = (p, kept)
            self.store.put_retained(self.commit.batch, p, kept)
        elif self.retained.pop(msg.topic, None) is not None:
            self.store.delete_retained(self.commit.batch, p, msg.topic)

    def _retained_query(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        filters = list(cmd.retained_query.filters)
        now = now_ms()
        found = [
            msg
            for topic, (p, msg) in self.retained.items()
            if p in self.mastered
            and not (msg.expires_at_ms and msg.expires_at_ms <= now)
            and any(topic_matches(f, topic) for f in filters)
        ]
        event = _result(cmd.request_id, retained=found)
        self.commit.after(lambda: link.send(event))

    def _enqueue_retained(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        req = cmd.enqueue_retained
        session = self._live_session(link, cmd, req.client_id, req.connection_id)
        if session is None:
            return
        for qm in req.messages:
            if qm.qos == 0:
                session.enqueue_transient(qm)
            else:
                self._enqueue(session, qm)
        self._schedule_pump(session)
        self._reply(link, cmd)

    def _delivery_ack(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        req = cmd.delivery_ack
        session = self.sessions.get(req.client_id)
        if session is None:
            return
        # PUBACK / PUBCOMP from an earlier connection of the session (its acknowledgement still
        # on the way when the client reconnected elsewhere) still counts: the client has the
        # message, and dropping the ack would only make it come again.
        removed = session.acknowledge(list(req.message_ids))
        if removed:
            self.store.delete_messages(
                self.commit.batch, session.partition, session.client_id, removed
            )
        conn = session.connection
        if conn is None or conn.connection_id != req.connection_id:
            return
        if req.received_ids:
            self._release(session, list(req.received_ids))
        # The window has room again: send at once what is already durable, without waiting
        # for this batch (whose only news is that acknowledged messages are gone).
        self._pump(session)

    def _release(self, session: Session, message_ids: list[int]) -> None:
        """QoS 2 out: the client sent PUBREC for these messages. Each becomes a released stub,
        durably; only then is it sent back to the edge, which sends PUBREL (a PUBREL must never
        be followed by the PUBLISH again, even after a restart)."""
        stubs = session.release(message_ids)
        if not stubs:
            return
        batch = self.commit.batch
        for stub in stubs:
            self.store.put_message(batch, session.partition, session.client_id, stub)
        conn = session.connection
        if conn is None:
            return

        def send() -> None:
            if session.connection is conn and self.sessions.get(session.client_id) is session:
                conn.link.send(
                    pb.PartitionEvent(
                        delivery=pb.Delivery(
                            client_id=session.client_id,
                            connection_id=conn.connection_id,
                            messages=stubs,
                        )
                    )
                )

        self.commit.after(send)

    def _node_stats(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        own = {
            "publish/dropped_queue_full": self.dropped_queue_full,
            "sessions/mastered": len(self.sessions),
            "messages/queued": self.queued_messages(),
        }
        event = _result(cmd.request_id, node_stats=self.sys_stats.answer(link, cmd.node_stats, own))
        self.commit.after(lambda: link.send(event))

    def _enqueue_shared(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        req = cmd.enqueue_shared
        p = cmd.partition
        if not self._check_owner(link, cmd, p, cmd.partition_epoch):
            return
        if self.redelivery.give(p, req.group, list(req.messages), req.online_only):
            self._reply(link, cmd)
            return
        online = "online " if req.online_only else ""
        self._reply(
            link,
            cmd,
            SC.STATUS_CODE_NOT_FOUND,
            message=f"no {online}member of {req.group} in partition {p}",
        )

    def _shared_handoff_done(self, link: EdgeLink, cmd: pb.EdgeCommand) -> None:
        self.redelivery.answered(cmd.shared_handoff_done)

    _handlers: dict[str, Callable[[PartitionNode, EdgeLink, pb.EdgeCommand], None]] = {
        "open_session": _open_session,
        "attach_session": _attach_session,
        "close_session": _close_session,
        "subscribe": Subscriptions._subscribe,
        "unsubscribe": Subscriptions._unsubscribe,
        "publish": _publish,
        "delivery_ack": _delivery_ack,
        "retained_query": _retained_query,
        "enqueue_retained": _enqueue_retained,
        "will_published": SessionWills._will_published,
        "index_ack": Subscriptions._index_ack,
        "qos2_receive": InboundQos2._qos2_receive,
        "qos2_routed": InboundQos2._qos2_routed,
        "qos2_release": InboundQos2._qos2_release,
        "qos2_forget": InboundQos2._qos2_forget,
        "enqueue_shared": _enqueue_shared,
        "shared_handoff_done": _shared_handoff_done,
        "node_stats": _node_stats,
    }

    # ----- helpers ----------------------------------------------------------------------

    def _kick(self, session: Session, reason_code: int) -> None:
        conn = session.connection
        assert conn is not None
        event = pb.PartitionEvent(
            kick=pb.Kick(
                client_id=session.client_id,
                connection_id=conn.connection_id,
                reason_code=reason_code,
            )
        )
        # After the commit, like the result of the connection's own OpenSession: on its link the
        # CONNACK then always comes before the kick (MQTT-3.2.0-1).
        link = conn.link
        self.commit.after(lambda: link.send(event))
        session.detach(now_ms())
        self._presence(session)

    def _durable(self, session: Session, message_id: int) -> None:
        if message_id > session.durable_mid:
            session.durable_mid = message_id
        self._pump(session)

    def _connection_ready(self, session: Session, conn: LiveConnection) -> None:
        """The edge has (or, in this frame, will have) the answer that accepts `conn`."""
        conn.ready = True
        self._pump(session)

    def _schedule_pump(self, session: Session) -> None:
        self.commit.after(lambda: self._pump(session))

    def _pump(self, session: Session) -> None:
        conn = session.connection
        if conn is None or self.sessions.get(session.client_id) is not session:
            return
        messages = session.pump()
        if messages:
            self.messages_out += len(messages)
            conn.link.send(
                pb.PartitionEvent(
                    delivery=pb.Delivery(
                        client_id=session.client_id,
                        connection_id=conn.connection_id,
                        messages=messages,
                    )
                )
            )

    def _delete_session(self, session: Session) -> None:
        if session.shared:
            self.redelivery.session_ended(session)
        if session.record.will_due_at_ms:
            self._publish_will_now(session)  # the session ends before the will's delay
        self.wills.cancel(session.client_id)
        for filt in list(session.subscriptions):
            self._remove_subscription(session, filt)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        self.store.delete_session(self.commit.batch, session.partition, session.client_id)

    def _write_dirty(self, batch: WriteBatch) -> None:
        for cid, session in self._dirty.items():
            if self.sessions.get(cid) is session:
                self.store.put_session(batch, session.partition, session.record)
        self._dirty.clear()

    def hand_out_shared(self) -> None:
        """Shared-subscription messages of members that went offline lately, and those being
        handed over (again, if unanswered), to an edge."""
        self.redelivery.sweep(now_ms())

    # ----- housekeeping -----------------------------------------------------------------

    def queued_messages(self) -> int:
        """QoS 1/2 messages held by the sessions here (one pass over the sessions)."""
        return sum(len(s.queue) for s in self.sessions.values())

    def expire_sessions(self) -> int:
        """Remove sessions whose expiry interval has passed since their connection ended."""
        stamp = now_ms()
        expired = [session for session in self.sessions.values() if _expired(session, stamp)]
        for session in expired:
            self._delete_session(session)
        return len(expired)


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
