"""Inbound QoS 2 at the partition master: the claims on a publisher's packet ids (receive,
routed, release) in its session's partition, and, in a target partition, the origin ids of the
routings stored there (forget, sweep). The protocol and why it is built so:
docs/architecture.md, "QoS 2 (exactly once)".
"""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.fencing import SC, check_owner, live_session, reply
from services.partition.links import EdgeLink
from services.partition.sessions import Claim, Routed
from services.partition.state import PartitionState


def qos2_receive(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.qos2_receive
    session = live_session(state, link, cmd, req.client_id, req.connection_id)
    if session is None:
        return
    key = (req.client_id, req.packet_id)
    attempt = state.qos2.attempts.get(key)
    claim = session.qos2_receive(
        req.packet_id, req.connection_id, attempt[0] if attempt is not None else None, state.ids
    )
    if claim is Claim.WAIT:
        state.qos2.waiters.setdefault(key, []).append((link, cmd))
        return
    if claim is Claim.NEW:
        state.qos2.attempts[key] = (req.connection_id, link)
        q2 = session.q2in[req.packet_id]
        state.commit.batch.put_qos2_inbound(session.partition, session.client_id, req.packet_id, q2)
        reply(state, link, cmd, qos2_state=pb.QOS2_STATE_NEW, qos2_origin=q2.origin)
        return
    answer = {
        Claim.DUPLICATE: pb.QOS2_STATE_DUPLICATE,
        Claim.IN_PROGRESS: pb.QOS2_STATE_IN_PROGRESS,
    }[claim]
    reply(state, link, cmd, qos2_state=answer)


def qos2_routed(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.qos2_routed
    if not check_owner(state, link, cmd, cmd.partition, cmd.partition_epoch):
        return
    key = (req.client_id, req.packet_id)
    attempt = state.qos2.attempts.get(key)
    if attempt is not None and attempt[0] == req.connection_id:
        del state.qos2.attempts[key]
    session = state.conns.sessions.get(req.client_id)
    if session is None or session.partition != cmd.partition:
        reply(state, link, cmd, SC.STATUS_CODE_NOT_FOUND, message="session ended")
    else:
        change = session.qos2_routed(
            req.packet_id, req.connection_id, req.ok, keep_claim=req.keep_claim
        )
        p, cid = session.partition, session.client_id
        if change is Routed.PUT:
            q2 = session.q2in[req.packet_id]
            state.commit.batch.put_qos2_inbound(p, cid, req.packet_id, q2)
        elif change is Routed.DELETED:
            state.commit.batch.delete_qos2_inbound(p, cid, req.packet_id)
        if req.ok or req.keep_claim or change is Routed.DELETED:
            reply(state, link, cmd)
        else:
            # Asked to drop a claim that is not this attempt's to drop (another attempt
            # took it over, or routed it): the edge must not answer PUBREC 0x80, which
            # would make the packet id a new message while the claim stands.
            reply(
                state, link, cmd, SC.STATUS_CODE_TAKEN_OVER, message="claim held by another attempt"
            )
    if key not in state.qos2.attempts:
        _wake(state, key, now)


def _wake(state: PartitionState, key: tuple[str, int], now: int) -> None:
    """The attempt at a packet id ended: its waiters are answered now, in order."""
    for link, cmd in state.qos2.waiters.pop(key, ()):
        if state.conns.links.get(link.edge_id) is link:
            qos2_receive(state, link, cmd, now)


def qos2_release(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.qos2_release
    session = live_session(state, link, cmd, req.client_id, req.connection_id)
    if session is None:
        return
    if not session.qos2_release(req.packet_id):
        reply(state, link, cmd, qos2_state=pb.QOS2_STATE_NOT_FOUND)
        return
    state.commit.batch.delete_qos2_inbound(session.partition, session.client_id, req.packet_id)
    reply(state, link, cmd, qos2_state=pb.QOS2_STATE_RELEASED)


def qos2_forget(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    """The claims of these origin ids are settled: their targets here forget them. Entries
    for partitions not mastered here at that epoch are left to that master's sweep."""
    for entry in cmd.qos2_forget.origins:
        p = entry.partition
        if state.roles.mastered.get(p) == entry.epoch and state.qos2.seen.forget(p, entry.origin):
            state.commit.batch.delete_qos2_seen(p, entry.origin)


def sweep_seen(state: PartitionState, now: int) -> int:
    """Forget the origin ids kept past the retention (their forgets never came)."""
    gone = state.qos2.seen.sweep(now)
    for p, origin in gone:
        state.commit.batch.delete_qos2_seen(p, origin)
    return len(gone)


def link_closed(state: PartitionState, link: EdgeLink, now: int) -> None:
    """Inbound QoS 2 attempts of that edge can no longer report: whoever waits for one
    gets its answer now (the packet id is routed again: see docs/architecture.md)."""
    ended = [key for key, (_, owner) in state.qos2.attempts.items() if owner is link]
    for key in ended:
        del state.qos2.attempts[key]
        _wake(state, key, now)
