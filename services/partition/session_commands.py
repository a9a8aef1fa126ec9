"""Sessions at the partition master: the edge links, session open (and takeover), attach and
close, expiry, and the commands of shared-group redelivery.

Owns the state's `conns` part (links, sessions, takeovers) and `redelivery`
(services/partition/state.py).
"""

from __future__ import annotations

import logging

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.delivery import pump, release
from services.partition.effects import AnswerTakeover, ConnectionReady, Send
from services.partition.fencing import SC, check_owner, live_session, reply, result
from services.partition.links import EdgeLink
from services.partition.qos2_inbound import link_closed as qos2_link_closed
from services.partition.sessions import NEVER_EXPIRES, LiveConnection, Session
from services.partition.state import PartitionState
from services.partition.subscriptions import index_snapshot, presence, remove_subscription
from services.partition.takeover import HeldAnswer
from services.partition.wills import (
    WILL_LINK_GRACE_MS,
    clear_will,
    connection_lost,
    publish_will_now,
)

log = logging.getLogger(__name__)

DEFAULT_RECEIVE_MAXIMUM = 65535
# A session of a connection whose edge link dropped is kept this long for the edge to re-attach
# it, even if its expiry interval is 0.
LINK_GRACE_MS = 30_000


# ----- links ---------------------------------------------------------------------------


def link_opened(state: PartitionState, link: EdgeLink, now: int) -> None:
    """An edge linked (replacing its old link, if any): it gets the index of the partitions
    mastered here."""
    old = state.conns.links.get(link.edge_id)
    if old is not None:
        close_link(state, old, now)
    state.conns.links[link.edge_id] = link
    index_snapshot(state, link)
    log.info("edge %s linked (incarnation %d)", link.edge_id, link.incarnation)


def close_link(state: PartitionState, link: EdgeLink, now: int) -> None:
    """The edge went away (at `now`, unix ms): its connections no longer hold their sessions.
    A session whose link dropped is kept until its expiry (plus a grace for the edge to
    re-attach)."""
    link.close()
    state.index.barrier.link_closed(link)
    state.sys_stats.link_closed(link)
    links = state.conns.links
    if links.get(link.edge_id) is link:
        del links[link.edge_id]
    detached = 0
    for session in state.conns.sessions.values():
        if session.connection is not None and session.connection.link is link:
            session.detach(now)
            connection_lost(state, session, now, grace_ms=WILL_LINK_GRACE_MS)
            if session.record.will_due_at_ms:
                state.commit.batch.put_session(session.partition, session.record)
            presence(state, session)
            detached += 1
    qos2_link_closed(state, link, now)
    # Its connections are no longer served through this master: takeovers waiting for it to
    # close one are answered.
    answer_takeovers(state, state.conns.takeovers.link_closed(link))
    log.info("edge %s unlinked; %d sessions detached", link.edge_id, detached)


# ----- commands ------------------------------------------------------------------------


def open_session(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.open_session
    p = cmd.partition
    if not check_owner(state, link, cmd, p, cmd.partition_epoch):
        return
    batch = state.commit.batch
    session = state.conns.sessions.get(req.client_id)
    # The same connection's OpenSession again: its edge re-sent it to this (new) master
    # after the first one's answer was lost with the old master. Not a takeover.
    again = session is not None and session.record.connection_id == req.connection_id
    if session is not None and _expired(session, now) and not again:
        # Past its expiry but not swept yet (the sweep runs once a second): it is gone.
        delete_session(state, session, now)
        session = None
    if session is not None and session.connection is not None and not again:
        if state.conns.takeovers.holding(req.client_id, session.connection):
            # Its connection was never answered (its answer waits for an older kick): it
            # is answered TAKEN_OVER, never live, so no Kick (takeover.HeldAnswer).
            session.detach(now)
            presence(state, session)
        else:
            _kick(state, session, pb.KICK_REASON_TAKEN_OVER, now)
        connection_lost(state, session, now)
    elif session is not None and session.orphan and not again:
        # Live on an edge that has not re-attached it to this new master yet. (An edge
        # with no link here cannot be told, nor waited for: the answer goes as before.)
        kicked = _kick_orphan(state, session, pb.KICK_REASON_TAKEN_OVER)
        if kicked is not None and kicked[1].kick_acks:
            state.conns.takeovers.kicked(req.client_id, kicked[0], kicked[1], now)
        connection_lost(state, session, now)
    if session is not None and not again and (req.clean_start or _ends_with_connection(session)):
        # Clean Start 1 discards the session [MQTT-3.1.2-4]; a session of Session Expiry 0
        # (3.1.1: Clean Session 1) ended with the connection this one replaces [MQTT-3.1.2-6
        # (3.1.1), 5.0 3.1.2.11.2], so the new one starts afresh: Session Present 0
        # [MQTT-3.2.2-1]. The session ends, so its will goes out now, whatever its delay
        # ("the Will Delay Interval has passed or the Session ends, whichever happens
        # first", 5.0 3.1.3.2.2). A new connection "to this Session" cancels the will
        # [MQTT-3.1.3-9]; these connections start another one.
        delete_session(state, session, now)
        session = None
    elif session is not None and session.record.will_due_at_ms:
        # A new connection before the will's delay passed: the will is not sent
        # [MQTT-3.1.3-9]; one already due goes out.
        if session.record.will_due_at_ms <= now:
            publish_will_now(state, session)
        clear_will(state, session)
    present = session is not None and session.record.created_by != req.connection_id
    if session is None:
        record = pb.SessionRecord(
            client_id=req.client_id, created_at_ms=now, created_by=req.connection_id
        )
        session = Session(p, record)
        state.conns.sessions[req.client_id] = session
    session.record.session_expiry_s = req.session_expiry_s
    session.record.protocol_version = req.protocol_version
    if req.HasField("will"):
        session.record.will.CopyFrom(req.will)
    else:
        session.record.ClearField("will")
    conn = LiveConnection(link, req.connection_id, req.receive_maximum or DEFAULT_RECEIVE_MAXIMUM)
    session.attach(conn)
    presence(state, session)
    batch.put_session(p, session.record)
    if state.conns.takeovers.waits(req.client_id):
        # A connection kicked may still be live: this one's CONNACK waits until it is
        # closed (G5, services/partition/takeover.py).
        event = result(cmd.request_id, session_present=present)
        answer = HeldAnswer(link, event, session, conn)
        superseded = state.conns.takeovers.hold(req.client_id, answer)
        if superseded is not None:
            answer_held(state, superseded)
        state.commit.after(AnswerTakeover(answer))
        return
    reply(state, link, cmd, session_present=present)
    state.commit.after(ConnectionReady(session, conn))


def attach_session(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.attach_session
    if not check_owner(state, link, cmd, cmd.partition, cmd.partition_epoch):
        return
    session = state.conns.sessions.get(req.client_id)
    if session is None or session.partition != cmd.partition:
        reply(state, link, cmd, SC.STATUS_CODE_NOT_FOUND, message="session ended")
        return
    conn = session.connection
    holder = (
        conn.connection_id if conn is not None else (session.orphan or session.record.connection_id)
    )
    if holder != req.connection_id:
        reply(state, link, cmd, SC.STATUS_CODE_TAKEN_OVER, message="connection replaced")
        return
    # What the edge knows and this master may not: acknowledgements and PUBRECs it sent
    # that never got here (lost with the old master), and what its client has in flight.
    if req.acked_ids:
        removed = session.acknowledge(list(req.acked_ids))
        if removed:
            state.commit.batch.delete_messages(session.partition, session.client_id, removed)
    conn = LiveConnection(link, req.connection_id, req.receive_maximum or DEFAULT_RECEIVE_MAXIMUM)
    session.attach(conn, inflight=[*req.inflight_ids, *req.released_ids, *req.received_ids])
    # PUBREL went out for these: released stubs from now on (they are, unless the write of
    # the stub was lost with the old master), not sent again.
    release(state, session, list(req.released_ids), send=False)
    # PUBREC'd, PUBREL not sent yet: released, then sent as PUBREL once stored.
    release(state, session, list(req.received_ids))
    presence(state, session)
    # The connection lives on (its edge re-linked, or re-attached it to this new master):
    # its will is not due after all (a promoted master schedules the wills of the
    # connections it inherits, in case their edge went with the old master).
    session.record.will_due_at_ms = 0
    state.wills.cancel(session.client_id)
    state.commit.batch.put_session(session.partition, session.record)
    reply(state, link, cmd)
    state.commit.after(ConnectionReady(session, conn))


def close_session(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.close_session
    if not check_owner(state, link, cmd, cmd.partition, cmd.partition_epoch):
        return
    session = state.conns.sessions.get(req.client_id)
    if (
        session is not None
        and session.connection is None
        and session.record.connection_id == req.connection_id
    ):
        # Its edge lost the link (or the old master) before this close got through: the
        # connection it closes is still the session's last one, so the close counts (a
        # graceful one must not publish the will).
        session.orphan = ""
        state.wills.cancel(session.client_id)
        session.record.will_due_at_ms = 0
    else:
        session = live_session(state, link, cmd, req.client_id, req.connection_id)
        if session is None:
            return
    if req.HasField("session_expiry_s"):
        session.record.session_expiry_s = req.session_expiry_s
    session.detach(now)
    if req.graceful and not req.send_will:
        clear_will(state, session)  # a normal DISCONNECT discards the will [MQTT-3.1.2-8]
    else:
        connection_lost(state, session, now)
    presence(state, session)
    if session.record.session_expiry_s == 0:
        delete_session(state, session, now)
    else:
        state.commit.batch.put_session(session.partition, session.record)
        if session.shared:
            state.redelivery.connection_ended(session, now)
    reply(state, link, cmd)


def kicked(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.kicked
    answer_takeovers(state, state.conns.takeovers.confirmed(link, req.client_id, req.connection_id))


def node_stats(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    own = {
        "publish/dropped_queue_full": state.delivery.dropped_queue_full,
        "sessions/mastered": len(state.conns.sessions),
        "messages/queued": queued_messages(state),
        "retained/stored": len(state.delivery.retained),
        **state.delivery.limit_counts.counters(),
    }
    event = result(
        cmd.request_id, node_stats=state.sys_stats.answer(link, cmd.node_stats, own, now)
    )
    state.commit.after(Send(link, event))


def enqueue_shared(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.enqueue_shared
    p = cmd.partition
    if not check_owner(state, link, cmd, p, cmd.partition_epoch):
        return
    if state.redelivery.give(p, req.group, list(req.messages), req.online_only, now):
        reply(state, link, cmd)
        return
    online = "online " if req.online_only else ""
    reply(
        state,
        link,
        cmd,
        SC.STATUS_CODE_NOT_FOUND,
        message=f"no {online}member of {req.group} in partition {p}",
    )


def shared_handoff_done(
    state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int
) -> None:
    state.redelivery.answered(cmd.shared_handoff_done, now)


# ----- helpers -------------------------------------------------------------------------


def _kick(
    state: PartitionState, session: Session, reason: pb.KickReason.ValueType, now: int
) -> None:
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
    state.commit.after(Send(link, event))
    if link.kick_acks:
        # Its edge confirms the close; the connection taking over waits for that (G5).
        state.conns.takeovers.kicked(session.client_id, conn.connection_id, link, now)
    session.detach(now)
    presence(state, session)


def _kick_orphan(
    state: PartitionState, session: Session, reason: pb.KickReason.ValueType
) -> tuple[str, EdgeLink] | None:
    """Close the connection a promoted master inherited for the session (on whichever edge
    holds it), before another connection takes the session over (G5). Returns the connection
    kicked and its edge's link (None: that edge has no link to this master, so it cannot be
    told)."""
    conn_id, session.orphan = session.orphan, ""
    link = state.conns.links.get(conn_id.split(".", 1)[0])
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
    state.commit.after(Send(link, event))
    return conn_id, link


def delete_session(state: PartitionState, session: Session, now: int) -> None:
    if session.shared:
        state.redelivery.session_ended(session, now)
    if session.record.will_due_at_ms:
        publish_will_now(state, session)  # the session ends before the will's delay
    state.wills.cancel(session.client_id)
    for filt in list(session.subscriptions):
        remove_subscription(state, session, filt)
    if state.conns.sessions.get(session.client_id) is session:
        del state.conns.sessions[session.client_id]
    state.commit.batch.delete_session(session.partition, session.client_id)


def connection_ready(state: PartitionState, e: ConnectionReady) -> None:
    e.conn.ready = True
    pump(state, e.session)


def answer_takeover(state: PartitionState, e: AnswerTakeover) -> None:
    if state.conns.takeovers.durable(e.answer):
        answer_held(state, e.answer)


def answer_takeovers(state: PartitionState, answers: list[HeldAnswer]) -> None:
    for answer in answers:
        answer_held(state, answer)


def answer_held(state: PartitionState, answer: HeldAnswer) -> None:
    """Send a takeover's held answer (durable, and nothing kicked is live any more)."""
    if answer.superseded:
        rid = answer.event.result.request_id
        event = result(
            rid,
            SC.STATUS_CODE_TAKEN_OVER,
            message="another connection took the session over before this one was accepted",
        )
        state.outbox.append(Send(answer.link, event))
        return
    state.outbox.append(Send(answer.link, answer.event))
    answer.conn.ready = True
    pump(state, answer.session)


def settle_takeovers(state: PartitionState, now: int) -> int:
    """Answer the takeovers whose kicked connections were not confirmed closed within
    KICK_ACK_BOUND_MS (services/partition/takeover.py; logged there). Returns how many kicks
    are still waited for."""
    answer_takeovers(state, state.conns.takeovers.expire(now))
    return len(state.conns.takeovers)


def expire_sessions(state: PartitionState, now: int) -> int:
    """Remove sessions whose expiry interval has passed since their connection ended."""
    expired = [session for session in state.conns.sessions.values() if _expired(session, now)]
    for session in expired:
        delete_session(state, session, now)
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


def queued_messages(state: PartitionState) -> int:
    """QoS 1/2 messages held by the sessions here (one pass over the sessions)."""
    return sum(len(s.queue) for s in state.conns.sessions.values())
