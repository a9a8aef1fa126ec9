"""Wills: the will in its session's record as the partition master sets and clears it, and
handing the due ones to an edge to publish (which are due: WillBoard, will_board.py). Owns the
state's `wills` part (services/partition/state.py).

A session's will lives in its SessionRecord (so it is replicated with the session and survives
the loss of the node that held the connection). When the connection ends without a normal
DISCONNECT the partition sets the record's will_due_at_ms to the end of the Will Delay Interval
(or of the session, if that comes first); a new connection to the session before then cancels
it. A due will is handed to one edge (this node's own if it is linked) as a PublishWill event;
the edge routes it like any PUBLISH and answers WillPublished once every target partition took
it, and only then does the partition forget the will. Without an answer the will is handed out
again (services/partition/handout.py): at least once, as QoS 1 wants.

A will whose session ends at once (clean start takeover, expiry 0) is kept here in memory
until an edge confirms it.
"""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.effects import HandOutWills
from services.partition.links import EdgeLink
from services.partition.sessions import Session
from services.partition.state import PartitionState

# A connection lost with its edge link (or with the old master) may yet be re-attached by its
# edge: its will waits this much longer than its delay, so that a failover or a brief link
# outage does not publish the wills of live clients.
WILL_LINK_GRACE_MS = 5_000


def connection_lost(state: PartitionState, session: Session, stamp: int, grace_ms: int = 0) -> None:
    """The connection ended without a normal DISCONNECT: the will is due after the Will
    Delay Interval, or when the session ends if that is sooner [MQTT-3.1.2-8, 3.1.3-9];
    `grace_ms` more when the edge may yet re-attach the connection. The caller stores the
    record."""
    rec = session.record
    if not rec.HasField("will"):
        return
    delay_s = min(rec.will.delay_interval_s, rec.session_expiry_s)
    rec.will_due_at_ms = stamp + delay_s * 1000 + grace_ms
    state.wills.schedule(rec.client_id, rec.will_due_at_ms)
    if rec.will_due_at_ms <= stamp:
        state.commit.after(HandOutWills())


def clear_will(state: PartitionState, session: Session) -> None:
    session.record.ClearField("will")
    session.record.will_due_at_ms = 0
    state.wills.cancel(session.client_id)


def publish_will_now(state: PartitionState, session: Session) -> None:
    """Hand the session's will out at once, from memory (the record is about to lose it)."""
    state.wills.orphan(session.client_id, session.record.will)
    state.commit.after(HandOutWills())


def hand_out(state: PartitionState, now: int) -> None:
    """Give every due will to an edge to publish (again, if one went unanswered)."""
    sessions = state.conns.sessions
    wills = {cid: sessions[cid].record.will for cid in state.wills.due if cid in sessions}
    state.outbox.extend(state.wills.hand_out(now, state.conns.links, wills))


def will_published(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.will_published
    if not state.wills.confirmed(req.client_id, req.will_id):
        return
    session = state.conns.sessions.get(req.client_id)
    if session is not None:
        session.record.ClearField("will")
        session.record.will_due_at_ms = 0
        state.commit.batch.put_session(session.partition, session.record)
