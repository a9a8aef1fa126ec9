"""How a message reaches its subscribers at the partition master: a Publish matched into the
queues of the sessions here (each within its limit, durably), retained messages, and the queues
pumped to their connections as the group commit makes them durable and acknowledgements free
the connections' windows.

Owns the state's `delivery` part (services/partition/state.py). The hot path (publish ->
enqueue -> pump) is plain functions of the state.
"""

from __future__ import annotations

from collections.abc import Iterable

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.topics import topic_matches
from services.partition.effects import MessageDurable, Pump, Send, SendReleased
from services.partition.fencing import check_owner, live_session, reply, result
from services.partition.limits import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_RETAINED_BYTES,
    DEFAULT_MAX_RETAINED_MESSAGES,
    DEFAULT_MAX_SUBSCRIPTIONS,
    LimitCounts,
    QueueLimits,
)
from services.partition.links import EdgeLink
from services.partition.retained import retained_size
from services.partition.sessions import LiveConnection, Session, queued_size
from services.partition.state import PartitionState
from services.partition.tracing import set_carrier
from services.partition.write_batch import WriteBatch

__all__ = [
    "DEFAULT_MAX_QUEUED",
    "DEFAULT_MAX_QUEUED_BYTES",
    "DEFAULT_MAX_RETAINED_BYTES",
    "DEFAULT_MAX_RETAINED_MESSAGES",
    "DEFAULT_MAX_SUBSCRIPTIONS",
    "LimitCounts",
    "QueueLimits",
]


def publish_origin(link: EdgeLink, cmd: pb.EdgeCommand) -> bytes:
    """Who sent a publish, the same in every attempt at it: the edge, its incarnation, and the
    command id it gave it (unique per incarnation, kept when it sends the command again)."""
    return b"%s:%d:%d" % (link.edge_id.encode(), link.incarnation, cmd.command_id)


def publish(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.publish
    targets = set()
    shared: list[pb.PartitionTarget] = []
    for target in req.targets:
        if not check_owner(state, link, cmd, target.partition, target.epoch):
            return
        targets.add(target.partition)
        if target.shared:
            shared.append(target)
    has_retained = req.HasField("retained")
    if has_retained and not check_owner(
        state, link, cmd, req.retained.partition, req.retained.epoch
    ):
        return
    if req.qos2_origin:
        # A QoS 2 routing: the partitions that stored this claim's message already (an
        # earlier attempt at it) store nothing again, and answer success all the same.
        origin, stamp = req.qos2_origin, now
        fresh = state.qos2.seen.admit(
            origin, [*targets, req.retained.partition] if has_retained else targets, stamp
        )
        if not fresh:
            reply(state, link, cmd)
            return
        for p in fresh:
            state.commit.batch.put_qos2_seen(p, origin, stamp)
        targets &= fresh
        shared = [t for t in shared if t.partition in fresh]
        has_retained = has_retained and req.retained.partition in fresh
        origin = b""
    else:
        origin = publish_origin(link, cmd) if cmd.request_id and cmd.command_id else b""
        if origin and state.replicator is not None:
            # Sent again after a failover or a link outage: partitions whose recent log
            # holds it store nothing again, but answer only once an entry carrying its
            # origin again (with no writes) is on every in-sync replica, so that the
            # first write is too.
            wrote = state.replicator.wrote
            batch = state.commit.batch
            written = {p for p in targets if wrote(p, origin)}
            if has_retained and wrote(req.retained.partition, origin):
                written.add(req.retained.partition)
                has_retained = False
            if written:
                for p in written:
                    batch.add_origin(p, origin)
                state.delivery.resent_publishes += 1
                targets -= written
                shared = [t for t in shared if t.partition in targets]
                if not targets and not has_retained:
                    reply(state, link, cmd)
                    return
    state.delivery.messages_in += 1
    msg = req.message
    retained_refusal = None
    if has_retained:
        retained_refusal = _store_retained(state, req.retained.partition, msg)
    # partition -> subscriber sessions it delivers this message to (when traced).
    fanout: dict[int, int] = {}
    # partition -> trace carrier of its append span, when this publish is traced.
    traced = state.tracer.append(msg, req.targets, fanout) if msg.trace.carrier else None
    carriers = None
    if traced is not None:
        carriers, spans = traced
        state.commit.after(spans)
    # One delivery per session at the highest granted QoS, with every matching
    # subscription identifier (MQTT-3.3.4-3/-4/-5).
    matched: dict[str, tuple[int, list[int], bool]] = {}
    for _filter, cid, spec in state.index.trie.match(msg.topic):
        if spec.no_local and cid == msg.publisher_id:
            continue
        qos, ids, retain = matched.get(cid, (-1, [], False))
        if spec.subscription_id:
            ids.append(spec.subscription_id)
        matched[cid] = (max(qos, spec.qos), ids, retain or spec.retain_as_published)
    # Sessions that get this message only as one shared group's member: client id -> group.
    group_only = _match_shared(state, shared, msg.topic, matched) if shared else None
    for cid, (sub_qos, ids, rap) in matched.items():
        session = state.conns.sessions[cid]
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
                schedule_pump(state, session)
            continue
        qm = pb.QueuedMessage(qos=qos, message=msg, subscription_ids=ids, retain=rap and msg.retain)
        if group_only and cid in group_only:
            qm.shared_group = group_only[cid]
        if carriers:
            set_carrier(qm, carriers[session.partition])
        if enqueue(state, session, qm) and carriers:
            fanout[session.partition] = fanout.get(session.partition, 0) + 1
    if origin:
        # Remembered where it wrote (the entry's origins), for a resend to find.
        batch = state.commit.batch
        for p in targets:
            if p in batch.ops:
                batch.add_origin(p, origin)
        if has_retained and req.retained.partition not in targets:
            batch.add_origin(req.retained.partition, origin)
    if retained_refusal is not None:
        # Stored for its subscribers, not as the topic's retained message: the edge
        # answers a 5.0 publisher 0x97 Quota exceeded with this reason.
        reply(state, link, cmd, retained_refused=True, message=retained_refusal)
        return
    reply(state, link, cmd)


def _match_shared(
    state: PartitionState,
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
            session = state.index.shared.pick(target.partition, filt)
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


def enqueue(state: PartitionState, session: Session, qm: pb.QueuedMessage) -> bool:
    """Queue a QoS >= 1 message for `session` (its message id is assigned here), durably,
    within the session's limit; False if the limit turned it away."""
    batch = state.commit.batch
    limits = state.delivery.limits
    size = queued_size(qm)
    if (
        len(session.queue) >= limits.max_queued_messages
        or session.queued_bytes + size > limits.max_queued_bytes
    ):
        counts = state.delivery.limit_counts
        if len(session.queue) >= limits.max_queued_messages:
            counts.queued_messages += 1
        else:
            counts.queued_bytes += 1
        state.delivery.dropped_queue_full += 1
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
    state.delivery.dirty[session.client_id] = session
    state.commit.after(MessageDurable(session, qm.message_id))
    return True


def _store_retained(state: PartitionState, p: int, msg: common_pb.Message) -> str | None:
    """Set (or, with an empty payload, delete) the topic's retained message; why not, when
    the cluster's retained messages are at their cap."""
    retained = state.delivery.retained
    if msg.payload:
        refusal = _retained_refusal(state, msg)
        if refusal is not None:
            return refusal
        kept = common_pb.Message()
        kept.CopyFrom(msg)
        kept.retain = True
        kept.ClearField("trace")
        retained.put(p, kept)
        state.commit.batch.put_retained(p, kept)
    elif retained.delete(msg.topic):
        state.commit.batch.delete_retained(p, msg.topic)
    return None


def _retained_refusal(state: PartitionState, msg: common_pb.Message) -> str | None:
    """Whether storing `msg` would take this node past its share of the cluster's retained
    messages (--max-retained-messages, --max-retained-bytes): the share of the partitions
    it masters (topics spread evenly over partitions, so the nodes fill up together). A
    message replacing a topic's own needs room only for what it adds. The broker's own
    $SYS/ topics (a few dozen per node) neither count nor are refused."""
    if msg.topic.startswith("$SYS/"):
        return None
    limits = state.delivery.limits
    view = state.roles.view
    partitions = view.partition_count if view is not None and view.partition_count else 1
    share = min(1.0, len(state.roles.mastered) / partitions)
    retained = state.delivery.retained
    old = retained.get(msg.topic)
    held = retained.size - retained.sys_size
    count = retained.count - retained.sys_count + (old is None)
    size = held + retained_size(msg) - (retained_size(old[1]) if old else 0)
    if count > limits.max_retained_messages * share and old is None:
        state.delivery.limit_counts.retained_messages += 1
        return (
            f"not retained: the cluster holds its maximum of "
            f"{limits.max_retained_messages} retained messages"
        )
    if size > limits.max_retained_bytes * share and size > held:
        state.delivery.limit_counts.retained_bytes += 1
        return (
            f"not retained: the cluster's retained messages would exceed "
            f"{limits.max_retained_bytes} bytes"
        )
    return None


def retained_query(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    # Walks only the branches of the topic tree the filters can match (issue 25).
    found = state.delivery.retained.match(cmd.retained_query.filters, now, state.roles.mastered)
    event = result(cmd.request_id, retained=found)
    state.commit.after(Send(link, event))


def enqueue_retained(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.enqueue_retained
    session = live_session(state, link, cmd, req.client_id, req.connection_id)
    if session is None:
        return
    for qm in req.messages:
        if qm.qos == 0:
            session.enqueue_transient(qm)
        else:
            enqueue(state, session, qm)
    schedule_pump(state, session)
    reply(state, link, cmd)


def delivery_ack(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.delivery_ack
    session = state.conns.sessions.get(req.client_id)
    if session is None or session.partition not in state.roles.mastered:
        if cmd.request_id and state.roles.mastered.get(cmd.partition) != cmd.partition_epoch:
            # Not mastered here (any more): the edge gives them to the new master when it
            # re-attaches the connection (AttachSession.acked_ids).
            check_owner(state, link, cmd, cmd.partition, cmd.partition_epoch)
        else:
            reply(state, link, cmd)
        return
    # Answered once the removals are durable: the edge then forgets these acknowledgements.
    # Nothing else waits on them (the window has room at once, below): a batch of these
    # alone may wait for company (hexmq/pacing.py); PUBRECs to release are not lazy. Removals
    # of QoS 1 messages alone are deferred: they wait longer, for the next write, since losing
    # one with this master costs only a redelivery; a PUBCOMP's waits only the lazy linger.
    queue = session.queue
    deferred = not req.received_ids and all(
        qm.qos == 1 for mid in req.message_ids if (qm := queue.get(mid)) is not None
    )
    if cmd.request_id:
        state.commit.after_ok(link.ok, cmd.request_id, lazy=True, deferred=deferred)
    # PUBACK / PUBCOMP from an earlier connection of the session (its acknowledgement still
    # on the way when the client reconnected elsewhere) still counts: the client has the
    # message, and dropping the ack would only make it come again.
    removed = session.acknowledge(list(req.message_ids))
    if removed:
        batch = state.commit.deferred_batch if deferred else state.commit.lazy_batch
        batch.delete_messages(session.partition, session.client_id, removed)
    conn = session.connection
    if conn is None or conn.connection_id != req.connection_id:
        return
    if req.received_ids:
        release(state, session, list(req.received_ids))
    # The window has room again: send at once what is already durable, without waiting
    # for this batch (whose only news is that acknowledged messages are gone).
    pump(state, session)


def release(
    state: PartitionState, session: Session, message_ids: list[int], *, send: bool = True
) -> None:
    """QoS 2 out: the client sent PUBREC for these messages. Each becomes a released stub,
    durably; only then is it sent back to the edge, which sends PUBREL (a PUBREL must never
    be followed by the PUBLISH again, even after a restart). With `send` False the edge
    has sent the PUBREL already."""
    stubs = session.release(message_ids)
    if not stubs:
        return
    batch = state.commit.batch
    for stub in stubs:
        batch.put_message(session.partition, session.client_id, stub)
    conn = session.connection
    if conn is None or not send:
        return
    state.commit.after(SendReleased(session, conn, tuple(stubs)))


def schedule_pump(state: PartitionState, session: Session) -> None:
    state.commit.after(Pump(session))


# ----- effects, once their batch is released (PartitionNode.carry_out) ------------------


def message_durable(state: PartitionState, e: MessageDurable) -> None:
    session = e.session
    if e.message_id > session.durable_mid:
        session.durable_mid = e.message_id
    state.delivery.released_pumps[id(session)] = session


def pump_after_release(state: PartitionState, e: Pump) -> None:
    state.delivery.released_pumps[id(e.session)] = e.session


def send_released(state: PartitionState, e: SendReleased) -> None:
    session, conn = e.session, e.conn
    if session.connection is conn and state.conns.sessions.get(session.client_id) is session:
        _send_delivery(state, session, conn, e.stubs)


def pump_released(state: PartitionState) -> None:
    """Once per release of committed batches: each session that got messages in them is
    pumped once, so its new messages leave in one Delivery, not one each."""
    pumps = state.delivery.released_pumps
    if pumps:
        state.delivery.released_pumps = {}
        for session in pumps.values():
            pump(state, session)


def pump(state: PartitionState, session: Session) -> None:
    conn = session.connection
    if conn is None or state.conns.sessions.get(session.client_id) is not session:
        return
    messages = session.pump()
    if messages:
        state.delivery.messages_out += len(messages)
        _send_delivery(state, session, conn, messages)


def write_dirty(state: PartitionState, batch: WriteBatch) -> None:
    for cid, session in state.delivery.dirty.items():
        if state.conns.sessions.get(cid) is session:
            batch.put_session(session.partition, session.record)
    state.delivery.dirty.clear()


def _send_delivery(
    state: PartitionState,
    session: Session,
    conn: LiveConnection,
    messages: Iterable[pb.QueuedMessage],
) -> None:
    """Messages for the session's live connection, to the edge holding it (now)."""
    delivery = pb.Delivery(
        client_id=session.client_id, connection_id=conn.connection_id, messages=messages
    )
    state.outbox.append(Send(conn.link, pb.PartitionEvent(delivery=delivery)))
