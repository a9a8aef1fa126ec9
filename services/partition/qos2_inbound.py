"""Inbound QoS 2 at the partition master: the claims on a publisher's packet ids (receive,
routed, release) in its session's partition, and, in a target partition, the origin ids of the
routings stored there (forget, sweep). The protocol and why it is built so:
docs/architecture.md, "QoS 2 (exactly once)".
"""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.links import EdgeLink
from services.partition.master_state import SC, MasterState
from services.partition.sessions import Claim, Routed


class InboundQos2(MasterState):
    _q2_attempts: dict[tuple[str, int], tuple[str, EdgeLink]]
    _q2_waiters: dict[tuple[str, int], list[tuple[EdgeLink, pb.EdgeCommand]]]

    def _qos2_receive(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.qos2_receive
        session = self._live_session(link, cmd, req.client_id, req.connection_id)
        if session is None:
            return
        key = (req.client_id, req.packet_id)
        attempt = self._q2_attempts.get(key)
        claim = session.qos2_receive(
            req.packet_id, req.connection_id, attempt[0] if attempt is not None else None, self.ids
        )
        if claim is Claim.WAIT:
            self._q2_waiters.setdefault(key, []).append((link, cmd))
            return
        if claim is Claim.NEW:
            self._q2_attempts[key] = (req.connection_id, link)
            state = session.q2in[req.packet_id]
            self.commit.batch.put_qos2_inbound(
                session.partition, session.client_id, req.packet_id, state
            )
            self._reply(link, cmd, qos2_state=pb.QOS2_STATE_NEW, qos2_origin=state.origin)
            return
        answer = {
            Claim.DUPLICATE: pb.QOS2_STATE_DUPLICATE,
            Claim.IN_PROGRESS: pb.QOS2_STATE_IN_PROGRESS,
        }[claim]
        self._reply(link, cmd, qos2_state=answer)

    def _qos2_routed(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.qos2_routed
        if not self._check_owner(link, cmd, cmd.partition, cmd.partition_epoch):
            return
        key = (req.client_id, req.packet_id)
        attempt = self._q2_attempts.get(key)
        if attempt is not None and attempt[0] == req.connection_id:
            del self._q2_attempts[key]
        session = self.sessions.get(req.client_id)
        if session is None or session.partition != cmd.partition:
            self._reply(link, cmd, SC.STATUS_CODE_NOT_FOUND, message="session ended")
        else:
            change = session.qos2_routed(
                req.packet_id, req.connection_id, req.ok, keep_claim=req.keep_claim
            )
            p, cid = session.partition, session.client_id
            if change is Routed.PUT:
                state = session.q2in[req.packet_id]
                self.commit.batch.put_qos2_inbound(p, cid, req.packet_id, state)
            elif change is Routed.DELETED:
                self.commit.batch.delete_qos2_inbound(p, cid, req.packet_id)
            if req.ok or req.keep_claim or change is Routed.DELETED:
                self._reply(link, cmd)
            else:
                # Asked to drop a claim that is not this attempt's to drop (another attempt
                # took it over, or routed it): the edge must not answer PUBREC 0x80, which
                # would make the packet id a new message while the claim stands.
                self._reply(
                    link, cmd, SC.STATUS_CODE_TAKEN_OVER, message="claim held by another attempt"
                )
        if key not in self._q2_attempts:
            self._q2_wake(key, now)

    def _q2_wake(self, key: tuple[str, int], now: int) -> None:
        """The attempt at a packet id ended: its waiters are answered now, in order."""
        for link, cmd in self._q2_waiters.pop(key, ()):
            if self.links.get(link.edge_id) is link:
                self._qos2_receive(link, cmd, now)

    def _qos2_release(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.qos2_release
        session = self._live_session(link, cmd, req.client_id, req.connection_id)
        if session is None:
            return
        if not session.qos2_release(req.packet_id):
            self._reply(link, cmd, qos2_state=pb.QOS2_STATE_NOT_FOUND)
            return
        self.commit.batch.delete_qos2_inbound(session.partition, session.client_id, req.packet_id)
        self._reply(link, cmd, qos2_state=pb.QOS2_STATE_RELEASED)

    def _qos2_forget(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        """The claims of these origin ids are settled: their targets here forget them. Entries
        for partitions not mastered here at that epoch are left to that master's sweep."""
        for entry in cmd.qos2_forget.origins:
            p = entry.partition
            if self.mastered.get(p) == entry.epoch and self.seen.forget(p, entry.origin):
                self.commit.batch.delete_qos2_seen(p, entry.origin)

    def sweep_qos2_seen(self, now: int) -> int:
        """Forget the origin ids kept past the retention (their forgets never came)."""
        gone = self.seen.sweep(now)
        for p, origin in gone:
            self.commit.batch.delete_qos2_seen(p, origin)
        return len(gone)

    def _qos2_link_closed(self, link: EdgeLink, now: int) -> None:
        """Inbound QoS 2 attempts of that edge can no longer report: whoever waits for one
        gets its answer now (the packet id is routed again: see docs/architecture.md)."""
        ended = [key for key, (_, owner) in self._q2_attempts.items() if owner is link]
        for key in ended:
            del self._q2_attempts[key]
            self._q2_wake(key, now)
