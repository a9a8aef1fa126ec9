"""How a message reaches its subscribers at the partition master: a Publish matched into the
queues of the sessions here (each within its limit, durably), retained messages, and the queues
pumped to their connections as the group commit makes them durable and acknowledgements free
the connections' windows.

The hot path (_publish -> _enqueue -> _pump) is all here, as plain methods that PartitionNode
inherits: a message costs no more calls or attribute hops than if they were defined on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.topics import topic_matches
from services.partition.effects import MessageDurable, Pump, Send, SendReleased
from services.partition.links import EdgeLink
from services.partition.master_state import MasterState, _result
from services.partition.replication import Replicator
from services.partition.retained import RetainedMessages, retained_size
from services.partition.sessions import LiveConnection, Session, queued_size
from services.partition.tracing import AppendTracer, set_carrier
from services.partition.write_batch import WriteBatch

# A session's queue (issue 25): 1,000 messages as mosquitto's and EMQX's default, and a byte
# cap besides (a 16 KB message each time is 16 MB; a count alone let 1 MB messages grow one
# offline session to a gigabyte on every replica).
DEFAULT_MAX_QUEUED = 1_000
DEFAULT_MAX_QUEUED_BYTES = 16 * 1024 * 1024
# Subscriptions one session may hold (a client's 20,000 filters cost every edge and replica).
DEFAULT_MAX_SUBSCRIPTIONS = 1_000
# Retained messages of the whole cluster: each is held in memory and Redis on RF nodes.
DEFAULT_MAX_RETAINED_MESSAGES = 1_000_000
DEFAULT_MAX_RETAINED_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class QueueLimits:
    """How many QoS >= 1 messages one session may hold (sent and unsent), and how many bytes
    (payload and topic), and which one goes when it is full: the newest is not queued
    (mosquitto's behaviour) or the oldest ones are dropped. Also the other limits a partition
    master keeps: subscriptions per session, and the cluster's retained messages (by count
    and bytes, shared among the nodes as their share of the partitions they master)."""

    max_queued_messages: int = DEFAULT_MAX_QUEUED
    drop_oldest: bool = False
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    max_subscriptions: int = DEFAULT_MAX_SUBSCRIPTIONS
    max_retained_messages: int = DEFAULT_MAX_RETAINED_MESSAGES
    max_retained_bytes: int = DEFAULT_MAX_RETAINED_BYTES


@dataclass(slots=True)
class LimitCounts:
    """What the limits turned away, for $SYS and metrics (hexmq_limit_refusals_total)."""

    queued_messages: int = 0
    queued_bytes: int = 0
    subscriptions: int = 0
    retained_messages: int = 0
    retained_bytes: int = 0

    def counters(self) -> dict[str, int]:
        return {f"limits/{name}": getattr(self, name) for name in self.__slots__}


def publish_origin(link: EdgeLink, cmd: pb.EdgeCommand) -> bytes:
    """Who sent a publish, the same in every attempt at it: the edge, its incarnation, and the
    command id it gave it (unique per incarnation, kept when it sends the command again)."""
    return b"%s:%d:%d" % (link.edge_id.encode(), link.incarnation, cmd.command_id)


class MessageDelivery(MasterState):
    limits: QueueLimits
    replicator: Replicator | None
    # QoS 1 publishes sent again that found their writes made already.
    resent_publishes: int
    dropped_queue_full: int
    limit_counts: LimitCounts
    tracer: AppendTracer
    retained: RetainedMessages
    _dirty: dict[str, Session]
    # Sessions to pump when the release under way ends (by identity: a session replaced in
    # the meantime is not pumped, see _pump).
    _released_pumps: dict[int, Session]
    messages_in: int
    messages_out: int

    def _publish(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
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
            origin, stamp = req.qos2_origin, now
            fresh = self.seen.admit(
                origin, [*targets, req.retained.partition] if has_retained else targets, stamp
            )
            if not fresh:
                self._reply(link, cmd)
                return
            for p in fresh:
                self.commit.batch.put_qos2_seen(p, origin, stamp)
            targets &= fresh
            shared = [t for t in shared if t.partition in fresh]
            has_retained = has_retained and req.retained.partition in fresh
            origin = b""
        else:
            origin = publish_origin(link, cmd) if cmd.request_id and cmd.command_id else b""
            if origin and self.replicator is not None:
                # Sent again after a failover or a link outage: partitions whose recent log
                # holds it store nothing again, but answer only once an entry carrying its
                # origin again (with no writes) is on every in-sync replica, so that the
                # first write is too.
                wrote = self.replicator.wrote
                batch = self.commit.batch
                written = {p for p in targets if wrote(p, origin)}
                if has_retained and wrote(req.retained.partition, origin):
                    written.add(req.retained.partition)
                    has_retained = False
                if written:
                    for p in written:
                        batch.add_origin(p, origin)
                    self.resent_publishes += 1
                    targets -= written
                    shared = [t for t in shared if t.partition in targets]
                    if not targets and not has_retained:
                        self._reply(link, cmd)
                        return
        self.messages_in += 1
        msg = req.message
        retained_refusal = None
        if has_retained:
            retained_refusal = self._store_retained(req.retained.partition, msg)
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
        if origin:
            # Remembered where it wrote (the entry's origins), for a resend to find.
            batch = self.commit.batch
            for p in targets:
                if p in batch.ops:
                    batch.add_origin(p, origin)
            if has_retained and req.retained.partition not in targets:
                batch.add_origin(req.retained.partition, origin)
        if retained_refusal is not None:
            # Stored for its subscribers, not as the topic's retained message: the edge
            # answers a 5.0 publisher 0x97 Quota exceeded with this reason.
            self._reply(link, cmd, retained_refused=True, message=retained_refusal)
            return
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
        limits = self.limits
        size = queued_size(qm)
        if (
            len(session.queue) >= limits.max_queued_messages
            or session.queued_bytes + size > limits.max_queued_bytes
        ):
            counts = self.limit_counts
            if len(session.queue) >= limits.max_queued_messages:
                counts.queued_messages += 1
            else:
                counts.queued_bytes += 1
            self.dropped_queue_full += 1
            if not limits.drop_oldest or size > limits.max_queued_bytes:
                return False  # the newest is not queued for this session
            # The oldest go until the new one fits, by count and by bytes.
            dropped = []
            count, queued = len(session.queue), session.queued_bytes
            for mid, old in session.queue.items():
                if count < limits.max_queued_messages and queued + size <= limits.max_queued_bytes:
                    break
                dropped.append(mid)
                count -= 1
                queued -= queued_size(old)
            session.acknowledge(dropped)
            batch.delete_messages(session.partition, session.client_id, dropped)
        qm.message_id = session.next_message_id()
        session.enqueue(qm)
        batch.put_message(session.partition, session.client_id, qm)
        self._dirty[session.client_id] = session
        self.commit.after(MessageDurable(session, qm.message_id))
        return True

    def _store_retained(self, p: int, msg: common_pb.Message) -> str | None:
        """Set (or, with an empty payload, delete) the topic's retained message; why not, when
        the cluster's retained messages are at their cap."""
        retained = self.retained
        if msg.payload:
            refusal = self._retained_refusal(msg)
            if refusal is not None:
                return refusal
            kept = common_pb.Message()
            kept.CopyFrom(msg)
            kept.retain = True
            kept.ClearField("trace")
            retained.put(p, kept)
            self.commit.batch.put_retained(p, kept)
        elif retained.delete(msg.topic):
            self.commit.batch.delete_retained(p, msg.topic)
        return None

    def _retained_refusal(self, msg: common_pb.Message) -> str | None:
        """Whether storing `msg` would take this node past its share of the cluster's retained
        messages (--max-retained-messages, --max-retained-bytes): the share of the partitions
        it masters (topics spread evenly over partitions, so the nodes fill up together). A
        message replacing a topic's own needs room only for what it adds. The broker's own
        $SYS/ topics (a few dozen per node) neither count nor are refused."""
        if msg.topic.startswith("$SYS/"):
            return None
        limits = self.limits
        view = self.view
        partitions = view.partition_count if view is not None and view.partition_count else 1
        share = min(1.0, len(self.mastered) / partitions)
        retained = self.retained
        old = retained.get(msg.topic)
        held = retained.size - retained.sys_size
        count = retained.count - retained.sys_count + (old is None)
        size = held + retained_size(msg) - (retained_size(old[1]) if old else 0)
        if count > limits.max_retained_messages * share and old is None:
            self.limit_counts.retained_messages += 1
            return (
                f"not retained: the cluster holds its maximum of "
                f"{limits.max_retained_messages} retained messages"
            )
        if size > limits.max_retained_bytes * share and size > held:
            self.limit_counts.retained_bytes += 1
            return (
                f"not retained: the cluster's retained messages would exceed "
                f"{limits.max_retained_bytes} bytes"
            )
        return None

    def _retained_query(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        # Walks only the branches of the topic tree the filters can match (issue 25).
        found = self.retained.match(cmd.retained_query.filters, now, self.mastered)
        event = _result(cmd.request_id, retained=found)
        self.commit.after(Send(link, event))

    def _enqueue_retained(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
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

    def _delivery_ack(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.delivery_ack
        session = self.sessions.get(req.client_id)
        if session is None or session.partition not in self.mastered:
            if cmd.request_id and self.mastered.get(cmd.partition) != cmd.partition_epoch:
                # Not mastered here (any more): the edge gives them to the new master when it
                # re-attaches the connection (AttachSession.acked_ids).
                self._check_owner(link, cmd, cmd.partition, cmd.partition_epoch)
            else:
                self._reply(link, cmd)
            return
        # Answered once the removals are durable: the edge then forgets these acknowledgements.
        # Nothing else waits on them (the window has room at once, below): a batch of these
        # alone may wait for company (hexmq/pacing.py); PUBRECs to release are not lazy.
        if cmd.request_id:
            self.commit.after_ok(link.ok, cmd.request_id, lazy=True)
        # PUBACK / PUBCOMP from an earlier connection of the session (its acknowledgement still
        # on the way when the client reconnected elsewhere) still counts: the client has the
        # message, and dropping the ack would only make it come again.
        removed = session.acknowledge(list(req.message_ids))
        if removed:
            self.commit.lazy_batch.delete_messages(session.partition, session.client_id, removed)
        conn = session.connection
        if conn is None or conn.connection_id != req.connection_id:
            return
        if req.received_ids:
            self._release(session, list(req.received_ids))
        # The window has room again: send at once what is already durable, without waiting
        # for this batch (whose only news is that acknowledged messages are gone).
        self._pump(session)

    def _release(self, session: Session, message_ids: list[int], *, send: bool = True) -> None:
        """QoS 2 out: the client sent PUBREC for these messages. Each becomes a released stub,
        durably; only then is it sent back to the edge, which sends PUBREL (a PUBREL must never
        be followed by the PUBLISH again, even after a restart). With `send` False the edge
        has sent the PUBREL already."""
        stubs = session.release(message_ids)
        if not stubs:
            return
        batch = self.commit.batch
        for stub in stubs:
            batch.put_message(session.partition, session.client_id, stub)
        conn = session.connection
        if conn is None or not send:
            return
        self.commit.after(SendReleased(session, conn, tuple(stubs)))

    def _schedule_pump(self, session: Session) -> None:
        self.commit.after(Pump(session))

    # ----- effects, once their batch is released (PartitionNode.carry_out) ----------------

    def _message_durable(self, e: MessageDurable) -> None:
        session = e.session
        if e.message_id > session.durable_mid:
            session.durable_mid = e.message_id
        self._released_pumps[id(session)] = session

    def _pump_after_release(self, e: Pump) -> None:
        self._released_pumps[id(e.session)] = e.session

    def _send_released(self, e: SendReleased) -> None:
        session, conn = e.session, e.conn
        if session.connection is conn and self.sessions.get(session.client_id) is session:
            _send_delivery(session, conn, e.stubs)

    def _pump_released(self) -> None:
        """Once per release of committed batches: each session that got messages in them is
        pumped once, so its new messages leave in one Delivery, not one each."""
        pumps = self._released_pumps
        if pumps:
            self._released_pumps = {}
            for session in pumps.values():
                self._pump(session)

    def _pump(self, session: Session) -> None:
        conn = session.connection
        if conn is None or self.sessions.get(session.client_id) is not session:
            return
        messages = session.pump()
        if messages:
            self.messages_out += len(messages)
            _send_delivery(session, conn, messages)

    def _write_dirty(self, batch: WriteBatch) -> None:
        for cid, session in self._dirty.items():
            if self.sessions.get(cid) is session:
                batch.put_session(session.partition, session.record)
        self._dirty.clear()


def _send_delivery(
    session: Session, conn: LiveConnection, messages: Iterable[pb.QueuedMessage]
) -> None:
    """Messages for the session's live connection, to the edge holding it."""
    conn.link.send(
        pb.PartitionEvent(
            delivery=pb.Delivery(
                client_id=session.client_id, connection_id=conn.connection_id, messages=messages
            )
        )
    )
