"""WillBoard: which wills are due, and handing them to an edge to publish (the will in its
session's record, as the partition master sets and clears it: services/partition/wills.py)."""

from __future__ import annotations

import itertools

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.effects import Send
from services.partition.handout import HandOutClock, pick_edge
from services.partition.links import EdgeLink


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
    ) -> list[Send]:
        """Every due will not handed out recently, for an edge; `wills` maps the client ids
        of `due` to their wills."""
        link = pick_edge(self.node_id, links)
        if link is None:
            return []
        sent = []
        for cid, due in self.due.items():
            if due > now_ms:
                continue
            will = wills.get(cid)
            if will is None or not self._handed_at.due(cid, now_ms):
                continue
            will_id = next(self._ids)
            self.handed[cid] = will_id
            sent.append(Send(link, _event(cid, will_id, will, now_ms)))
        for will_id, (cid, will) in self.orphans.items():
            if self._orphans_handed.due(will_id, now_ms):
                sent.append(Send(link, _event(cid, will_id, will, now_ms)))
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
