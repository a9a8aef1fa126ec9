"""Shared subscriptions: the messages of a member whose connection or session ends go to another
member of the group (MQTT 5.0 4.8.2).

A message queued for a session only because a shared group chose it as the group's member
(QueuedMessage.shared_group) is the group's, not the session's, until its QoS 2 exchange with
the session has begun:

- **Connection ends** (DISCONNECT or a lost connection; not a takeover, where the same client
  goes on; not a dropped edge link, which the edge may re-attach): its QoS 1 messages, sent or
  not, and its QoS 2 ones never sent go to an online member of the group. One in the same
  partition first: moved in one write batch (queued there, deleted here: one atomic, replicated
  log entry). Else through an edge (SharedHandoff), which gives them to a partition with an
  online member (EnqueueShared) and answers once they are stored there; only then are they
  deleted here. With no member online anywhere they stay with the session.
- **Session ends** (expiry, clean start, expiry 0): the same messages go to another member,
  online ones first, else an offline one; until one has them they are kept in hx:{p}:handoff
  (durable and replicated, handed out again after a restart).
- **QoS 2 already sent** (PUBLISH sent or PUBREC received) goes to nobody else: completed with
  the member when it returns [MQTT-4.8.2-4], dropped with its session [MQTT-4.8.2-5].

Moves keep the messages' order. While messages are being handed over the member's deliveries
wait at the first of them (should it come back meanwhile), so that what is given to another
member is never also sent to it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.commit_queue import CommitQueue
from services.partition.effects import Effect, HandoffReady, HandOutShared, Send
from services.partition.handout import HandOutClock, pick_edge
from services.partition.id_source import IdSource
from services.partition.links import EdgeLink
from services.partition.sessions import Session
from services.partition.shared import SharedGroups

log = logging.getLogger(__name__)

# Messages per SharedHandoff (a member may hold many thousands; one event need not carry all).
HANDOFF_MAX_MESSAGES = 1000
# A member whose connection ended is looked at once more this long after: messages that edges
# routed to it before they heard it went offline (index updates take milliseconds) go too.
RECHECK_MS = 1000


def movable(session: Session) -> dict[str, list[int]]:
    """Per group, in queue order, the ids of the session's messages that may go to another
    member: queued for that group alone, QoS 1, or QoS 2 never sent to this session, and not
    being handed over already."""
    out: dict[str, list[int]] = {}
    handing, sent = session.handing, session.ever_sent
    for mid, qm in session.queue.items():
        group = qm.shared_group
        if not group or mid in handing or (qm.qos == 2 and (qm.released or mid in sent)):
            continue
        ids = out.get(group)
        if ids is None:
            ids = out[group] = []
        ids.append(mid)
    return out


@dataclass(slots=True)
class Handoff:
    """Messages given to an edge for another member of their group."""

    event: pb.SharedHandoff
    # The member they were queued for (None: loaded from hx:{p}:handoff, its session gone).
    session: Session | None
    # Their ids in the member's queue (meaningful while that session lives).
    message_ids: list[int]
    # Kept in hx:{p}:handoff: the member's session ended.
    stored: bool
    # Its writes are durable: it may be handed out.
    ready: bool = False


class SharedRedelivery:
    def __init__(
        self,
        node_id: str,
        commit: CommitQueue,
        shared: SharedGroups,
        sessions: dict[str, Session],
        links: dict[str, EdgeLink],
        enqueue: Callable[[Session, pb.QueuedMessage], bool],
        schedule_pump: Callable[[Session], None],
        ids: IdSource,
        outbox: list[Effect],
    ) -> None:
        self.node_id = node_id
        # Where its hand-outs go, to be sent at once (the partition state's outbox).
        self.outbox = outbox
        self.commit = commit
        self.shared = shared
        self.sessions = sessions
        self.links = links
        self._enqueue = enqueue
        self._schedule_pump = schedule_pump
        self.pending: dict[int, Handoff] = {}
        # Members whose connection ended lately: client id -> (session, when).
        self._recheck: dict[str, tuple[Session, int]] = {}
        self._handed_at: HandOutClock[int] = HandOutClock()
        # Unique across restarts: stored handoffs keep their ids.
        self._ids = itertools.count(ids.first_handoff_id())
        # Messages given to another member / dropped because the group had nobody else.
        self.moved = 0
        self.dropped = 0

    # ----- the member's side -------------------------------------------------------------

    def connection_ended(self, session: Session, now_ms: int) -> None:
        """The session's connection ended and the session lives on (it is offline now)."""
        self._recheck[session.client_id] = (session, now_ms)
        self._move_from(session, now_ms)

    def _move_from(self, session: Session, now_ms: int) -> None:
        for group, ids in movable(session).items():
            if not self._give_here(session, group, ids, now_ms):
                self._hand(session, group, ids, online_only=True, stored=False)

    def session_ended(self, session: Session, now_ms: int) -> None:
        """The session is being deleted (offline; its queue goes with it)."""
        batch = self.commit.batch
        for handoff in self.pending.values():
            if handoff.session is session and not handoff.stored:
                # Being handed over since its connection ended: now the only copy.
                handoff.stored = True
                batch.put_handoff(handoff.event.from_partition, handoff.event)
        for group, ids in movable(session).items():
            if not self._give_here(session, group, ids, now_ms):
                self._hand(session, group, ids, online_only=False, stored=True)

    def _give_here(self, session: Session, group: str, ids: list[int], now_ms: int) -> bool:
        """To an online member in the session's own partition: queued there and deleted here in
        the same write batch."""
        queue = session.queue
        messages = [queue[mid].message for mid in ids]
        if not self.give(session.partition, group, messages, True, now_ms):
            return False
        removed = session.acknowledge(ids)
        self.commit.batch.delete_messages(session.partition, session.client_id, removed)
        self.moved += len(removed)
        log.info(
            "handing %d messages of shared group %s over from %s to a member in partition %d",
            len(removed),
            group,
            session.client_id,
            session.partition,
        )
        return True

    def _hand(
        self, session: Session, group: str, ids: list[int], *, online_only: bool, stored: bool
    ) -> None:
        batch = self.commit.batch
        queue = session.queue
        for i in range(0, len(ids), HANDOFF_MAX_MESSAGES):
            chunk = ids[i : i + HANDOFF_MAX_MESSAGES]
            event = pb.SharedHandoff(
                client_id=session.client_id,
                handoff_id=next(self._ids),
                group=group,
                from_partition=session.partition,
                messages=[queue[mid].message for mid in chunk],
                online_only=online_only,
            )
            handoff = Handoff(event, session, chunk, stored)
            self.pending[event.handoff_id] = handoff
            session.handing.update(chunk)
            if stored:
                batch.put_handoff(session.partition, event)
            self.commit.after(HandoffReady(event.handoff_id))

    def ready(self, handoff_id: int, now_ms: int) -> None:
        """The handoff is durable (effects.HandoffReady): it may be handed out."""
        handoff = self.pending.get(handoff_id)
        if handoff is not None:
            handoff.ready = True
        self.hand_out(now_ms)

    def load(self, handoffs: Iterable[pb.SharedHandoff]) -> None:
        """Stored handoffs of a partition being loaded: handed out again."""
        for event in handoffs:
            self.pending[event.handoff_id] = Handoff(event, None, [], stored=True, ready=True)

    def unload(self, p: int) -> None:
        """Partition p is no longer mastered here: its handoffs stay in its store for the new
        master to hand out again; answers to those handed out here go there too."""
        for hid in [h for h, handoff in self.pending.items() if handoff.event.from_partition == p]:
            del self.pending[hid]
            self._handed_at.forget(hid)
        for cid in [c for c, (session, _at) in self._recheck.items() if session.partition == p]:
            del self._recheck[cid]

    def sweep(self, now_ms: int) -> None:
        """Once a second: members whose connection ended RECHECK_MS ago or more are looked at
        once more (if still offline), and handoffs without an answer are handed out again."""
        if self._recheck:
            for cid, (session, at) in list(self._recheck.items()):
                if now_ms - at < RECHECK_MS:
                    continue
                del self._recheck[cid]
                if self.sessions.get(cid) is session and session.connection is None:
                    self._move_from(session, now_ms)
        self.hand_out(now_ms)

    def hand_out(self, now_ms: int) -> int:
        """Give every ready handoff not handed out recently to an edge; how many went."""
        link = pick_edge(self.node_id, self.links)
        if link is None:
            return 0
        sent = 0
        for hid, handoff in self.pending.items():
            if handoff.ready and self._handed_at.due(hid, now_ms):
                self.outbox.append(Send(link, pb.PartitionEvent(shared_handoff=handoff.event)))
                sent += 1
        return sent

    def answered(self, req: pb.SharedHandoffDone, now_ms: int) -> None:
        """An edge's SharedHandoffDone."""
        handoff = self.pending.get(req.handoff_id)
        if handoff is None or req.online_only != handoff.event.online_only:
            return  # answered before, or an answer to an earlier hand-out
        event = handoff.event
        p, hid = event.from_partition, event.handoff_id
        batch = self.commit.batch
        if not req.moved and event.online_only and handoff.stored:
            # Asked for an online member, but the session has ended since: any member will do.
            event.online_only = False
            batch.put_handoff(p, event)
            self._handed_at.forget(hid)
            self.commit.after(HandOutShared())
            return
        del self.pending[hid]
        self._handed_at.forget(hid)
        if handoff.stored:
            batch.delete_handoff(p, hid)
        session = handoff.session
        live = session is not None and self.sessions.get(session.client_id) is session
        if req.moved:
            self.moved += len(event.messages)
            if live:
                assert session is not None
                removed = session.acknowledge(handoff.message_ids)
                batch.delete_messages(p, session.client_id, removed)
        elif event.online_only:
            # No member online anywhere: the messages stay with the member.
            if live:
                assert session is not None
                session.handing.difference_update(handoff.message_ids)
        elif not self.give(p, event.group, list(event.messages), False, now_ms):
            # The member's session has ended and no other partition holds a member: an
            # offline one here, else the group has nobody left to give them to.
            self.dropped += len(event.messages)
            log.info(
                "dropped %d messages of shared group %r: no member left",
                len(event.messages),
                event.group,
            )
        if live:
            assert session is not None
            self._schedule_pump(session)  # its deliveries may be waiting at these messages

    # ----- the receiving side ------------------------------------------------------------

    def give(
        self, p: int, group: str, messages: list[common_pb.Message], online_only: bool, now_ms: int
    ) -> bool:
        """Queue each message (in order) for one member of `group` in partition `p`, in turn,
        online ones first, as the edge's routing to the group alone would have; False (nothing
        done) when the partition holds no member of the group, or with `online_only` no online
        one. Messages whose expiry has passed are dropped on the way."""
        members = self.shared.group(p, group)
        if members is None or not members.members or (online_only and not members.online):
            return False
        for msg in messages:
            if msg.expires_at_ms and msg.expires_at_ms <= now_ms:
                continue
            member = members.pick()
            spec = member.subscriptions[group]
            qos = min(msg.qos, spec.qos)
            qm = pb.QueuedMessage(
                qos=qos,
                message=msg,
                retain=spec.retain_as_published and msg.retain,
                shared_group=group if qos else "",
            )
            if spec.subscription_id:
                qm.subscription_ids.append(spec.subscription_id)
            if qos:
                self._enqueue(member, qm)
            elif member.connection is not None:
                member.enqueue_transient(qm)
                self._schedule_pump(member)
        return True
