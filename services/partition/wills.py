"""Wills: which are due, and handing them to an edge to publish (WillBoard); the will in its
session's record as the partition master sets and clears it (SessionWills, a mixin of
PartitionNode).

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

import itertools

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.effects import HandOutWills
from services.partition.handout import HandOutClock, pick_edge
from services.partition.links import EdgeLink
from services.partition.master_state import MasterState
from services.partition.sessions import Session


class WillBoard:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        # client id -> when its session's will is due (sessions of partitions mastered here).
        self.due: dict[str, int] = {}
        # client id -> the will id of its will's last hand-out.
        self.handed: dict[str, int] = {}
        self._handed_at: HandOutClock[str] = HandOutClock()
        # will id -> (client id, will) of sessions that ended with their will unsent.
        self.orphans: dict[int, tuple[str, pb.Will]] = {}
        self._orphans_handed: HandOutClock[int] = HandOutClock()
        self._ids = itertools.count(1)
        self.published = 0

    def schedule(self, client_id: str, due_ms: int) -> None:
        self.due[client_id] = due_ms
        self._unhand(client_id)

    def cancel(self, client_id: str) -> None:
        self.due.pop(client_id, None)
        self._unhand(client_id)

    def _unhand(self, client_id: str) -> None:
        self.handed.pop(client_id, None)
        self._handed_at.forget(client_id)

    def orphan(self, client_id: str, will: pb.Will) -> None:
        """The session ended with this will unsent: publish it now, from memory."""
        kept = pb.Will()
        kept.CopyFrom(will)
        self.orphans[next(self._ids)] = (client_id, kept)

    def hand_out(
        self,
        now_ms: int,
        links: dict[str, EdgeLink],
        wills: dict[str, pb.Will],
    ) -> int:
        """Send every due will not handed out recently to an edge; `wills` maps the client ids
        of `due` to their wills. Returns how many went out."""
        link = pick_edge(self.node_id, links)
        if link is None:
            return 0
        sent = 0
        for cid, due in self.due.items():
            if due > now_ms:
                continue
            will = wills.get(cid)
            if will is None or not self._handed_at.due(cid, now_ms):
                continue
            will_id = next(self._ids)
            self.handed[cid] = will_id
            link.send(_event(cid, will_id, will, now_ms))
            sent += 1
        for will_id, (cid, will) in self.orphans.items():
            if self._orphans_handed.due(will_id, now_ms):
                link.send(_event(cid, will_id, will, now_ms))
                sent += 1
        return sent

    def confirmed(self, client_id: str, will_id: int) -> bool:
        """An edge published the will: True if it was the session's current one (the caller
        then clears it from the record)."""
        if self.orphans.pop(will_id, None) is not None:
            self._orphans_handed.forget(will_id)
            self.published += 1
            return False
        if self.handed.get(client_id) != will_id:
            return False
        self._unhand(client_id)
        self.due.pop(client_id, None)
        self.published += 1
        return True


def _event(cid: str, will_id: int, will: pb.Will, now_ms: int) -> pb.PartitionEvent:
    event = pb.PartitionEvent(
        publish_will=pb.PublishWill(
            client_id=cid, will_id=will_id, owner_recorded=will.owner_recorded
        )
    )
    publish = event.publish_will
    if will.HasField("username"):
        # The owner, for the ACL check when the edge publishes it (as the ACL is then).
        publish.username = will.username
    out = publish.message
    out.CopyFrom(will.message)
    out.publisher_id = cid
    out.published_at_ms = now_ms
    return event


class SessionWills(MasterState):
    wills: WillBoard

    def _connection_lost(self, session: Session, stamp: int, grace_ms: int = 0) -> None:
        """The connection ended without a normal DISCONNECT: the will is due after the Will
        Delay Interval, or when the session ends if that is sooner [MQTT-3.1.2-8, 3.1.3-9];
        `grace_ms` more when the edge may yet re-attach the connection. The caller stores the
        record."""
        rec = session.record
        if not rec.HasField("will"):
            return
        delay_s = min(rec.will.delay_interval_s, rec.session_expiry_s)
        rec.will_due_at_ms = stamp + delay_s * 1000 + grace_ms
        self.wills.schedule(rec.client_id, rec.will_due_at_ms)
        if rec.will_due_at_ms <= stamp:
            self.commit.after(HandOutWills())

    def _clear_will(self, session: Session) -> None:
        session.record.ClearField("will")
        session.record.will_due_at_ms = 0
        self.wills.cancel(session.client_id)

    def _publish_will_now(self, session: Session) -> None:
        """Hand the session's will out at once, from memory (the record is about to lose it)."""
        self.wills.orphan(session.client_id, session.record.will)
        self.commit.after(HandOutWills())

    def hand_out_wills(self, now: int) -> None:
        """Give every due will to an edge to publish (again, if one went unanswered)."""
        sessions = self.sessions
        wills = {cid: sessions[cid].record.will for cid in self.wills.due if cid in sessions}
        self.wills.hand_out(now, self.links, wills)

    def _will_published(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.will_published
        if not self.wills.confirmed(req.client_id, req.will_id):
            return
        session = self.sessions.get(req.client_id)
        if session is not None:
            session.record.ClearField("will")
            session.record.will_due_at_ms = 0
            self.commit.batch.put_session(session.partition, session.record)
