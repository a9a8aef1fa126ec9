"""Wills: which are due, and handing them to an edge to publish.

A session's will lives in its SessionRecord (so it is replicated with the session and survives
the loss of the node that held the connection). When the connection ends without a normal
DISCONNECT the partition sets the record's will_due_at_ms to the end of the Will Delay Interval
(or of the session, if that comes first); a new connection to the session before then cancels
it. A due will is handed to one edge (this node's own if it is linked) as a PublishWill event;
the edge routes it like any PUBLISH and answers WillPublished once every target partition took
it, and only then does the partition forget the will. Without an answer the will is handed out
again after HAND_OUT_RETRY_MS: at least once, as QoS 1 wants.

A will whose session ends at once (clean start takeover, expiry 0) is kept here in memory
until an edge confirms it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.links import EdgeLink

HAND_OUT_RETRY_MS = 10_000


@dataclass(slots=True)
class HandedOut:
    will_id: int
    at_ms: int


class WillBoard:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        # client id -> when its session's will is due (sessions of partitions mastered here).
        self.due: dict[str, int] = {}
        self.handed: dict[str, HandedOut] = {}
        # will id -> (client id, message) of sessions that ended with their will unsent.
        self.orphans: dict[int, tuple[str, common_pb.Message]] = {}
        self._orphans_handed: dict[int, int] = {}
        self._ids = itertools.count(1)
        self.published = 0

    def schedule(self, client_id: str, due_ms: int) -> None:
        self.due[client_id] = due_ms
        self.handed.pop(client_id, None)

    def cancel(self, client_id: str) -> None:
        self.due.pop(client_id, None)
        self.handed.pop(client_id, None)

    def orphan(self, client_id: str, message: common_pb.Message) -> None:
        """The session ended with this will unsent: publish it now, from memory."""
        kept = common_pb.Message()
        kept.CopyFrom(message)
        self.orphans[next(self._ids)] = (client_id, kept)

    def hand_out(
        self,
        now_ms: int,
        links: dict[str, EdgeLink],
        wills: dict[str, common_pb.Message],
    ) -> int:
        """Send every due will not handed out recently to an edge; `wills` maps the client ids
        of `due` to their will messages. Returns how many went out."""
        link = links.get(self.node_id) or next(
            (links[name] for name in sorted(links) if not links[name].closed), None
        )
        if link is None or link.closed:
            return 0
        sent = 0
        for cid, due in self.due.items():
            if due > now_ms:
                continue
            handed = self.handed.get(cid)
            if handed is not None and now_ms - handed.at_ms < HAND_OUT_RETRY_MS:
                continue
            message = wills.get(cid)
            if message is None:
                continue
            will_id = next(self._ids)
            self.handed[cid] = HandedOut(will_id, now_ms)
            link.send(_event(cid, will_id, message, now_ms))
            sent += 1
        for will_id, (cid, message) in self.orphans.items():
            at = self._orphans_handed.get(will_id)
            if at is not None and now_ms - at < HAND_OUT_RETRY_MS:
                continue
            self._orphans_handed[will_id] = now_ms
            link.send(_event(cid, will_id, message, now_ms))
            sent += 1
        return sent

    def confirmed(self, client_id: str, will_id: int) -> bool:
        """An edge published the will: True if it was the session's current one (the caller
        then clears it from the record)."""
        if self.orphans.pop(will_id, None) is not None:
            self._orphans_handed.pop(will_id, None)
            self.published += 1
            return False
        handed = self.handed.get(client_id)
        if handed is None or handed.will_id != will_id:
            return False
        del self.handed[client_id]
        self.due.pop(client_id, None)
        self.published += 1
        return True


def _event(cid: str, will_id: int, message: common_pb.Message, now_ms: int) -> pb.PartitionEvent:
    event = pb.PartitionEvent(publish_will=pb.PublishWill(client_id=cid, will_id=will_id))
    out = event.publish_will.message
    out.CopyFrom(message)
    out.publisher_id = cid
    out.published_at_ms = now_ms
    return event
