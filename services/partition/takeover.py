"""Strict takeover (G5): the answer to an OpenSession that took a session over waits until the
connections it kicked are closed.

A master that kicks a live connection (or one it inherited as an orphan) sends the Kick to that
connection's edge; an edge that offers the kick-acks feature (hexmq/node_protocol.py) answers
with Kicked once it has closed the connection. Until then the new connection's answer (its
CONNACK) and its ConnectionReady are held here, so that a slow old edge cannot leave two live
connections of one client id. A kick stops being waited for when:
- its edge confirms it (`confirmed`),
- its edge's link closes (`link_closed`: that edge's connections are no longer served through
  this master; any that is still open finds its session taken over when it re-attaches),
- KICK_ACK_BOUND_MS passed (`expire`, logged): a takeover never hangs on an edge that is stuck,
- the session's partition is unloaded here (`unload`: this node no longer masters it, so it has
  nothing to hold; the edge re-attaches the connection to the new master, as every connection
  of a demoted master's partitions).
An edge without the feature (an older release) is not waited for: today's behaviour, the Kick
and the answer go out together.

Pure bookkeeping: no I/O, no clock (the node passes `now`, unix ms).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.links import EdgeLink
from services.partition.sessions import LiveConnection, Session

log = logging.getLogger(__name__)

# How long a takeover's answer waits for the old connection's edge to confirm the close. The
# node checks once a second (services/partition/housekeeping.py, sweep): at most about 3 s in all.
KICK_ACK_BOUND_MS = 2_000


@dataclass(slots=True, eq=False)
class HeldAnswer:
    """The OK answer (CONNACK) of the OpenSession that took a session over, and the
    connection it makes ready, until the kicked connections are closed. `durable`: its batch
    was released (the answer may go once nothing is waited for). `superseded`: a newer
    connection took the session over before this one was answered: it is answered TAKEN_OVER
    instead (it never was live, so it gets no Kick, and no DISCONNECT before a CONNACK)."""

    link: EdgeLink
    event: pb.PartitionEvent
    session: Session
    conn: LiveConnection
    durable: bool = False
    superseded: bool = False


@dataclass(slots=True, eq=False)
class _Kick:
    link: EdgeLink
    due_ms: int


class Takeovers:
    def __init__(self) -> None:
        # client id -> kicked connection id -> the kick waited for.
        self._kicks: dict[str, dict[str, _Kick]] = {}
        # client id -> the newest answer held (older ones were superseded).
        self._held: dict[str, HeldAnswer] = {}

    def __len__(self) -> int:
        """Kicks waited for."""
        return sum(len(kicks) for kicks in self._kicks.values())

    def kicked(self, client_id: str, connection_id: str, link: EdgeLink, now: int) -> None:
        """A Kick for `connection_id` goes to `link`'s edge, which will confirm the close."""
        kicks = self._kicks.setdefault(client_id, {})
        kicks[connection_id] = _Kick(link, now + KICK_ACK_BOUND_MS)

    def waits(self, client_id: str) -> bool:
        """Whether a connection of `client_id` kicked may still be live."""
        return client_id in self._kicks

    def hold(self, client_id: str, answer: HeldAnswer) -> HeldAnswer | None:
        """Hold `answer` while the client's kicks are waited for. Returns the answer it
        supersedes, if that one is durable already (to be answered TAKEN_OVER now)."""
        older = self._held.get(client_id)
        self._held[client_id] = answer
        if older is None:
            return None
        older.superseded = True
        return older if older.durable else None

    def holding(self, client_id: str, conn: LiveConnection | None) -> bool:
        """Whether `conn` is the connection of the answer held for `client_id` (not answered
        yet, so never live: a takeover of it needs no Kick)."""
        held = self._held.get(client_id)
        return held is not None and conn is not None and held.conn is conn

    def durable(self, answer: HeldAnswer) -> bool:
        """`answer`'s batch is released: True if it goes now."""
        answer.durable = True
        cid = answer.session.client_id
        if answer.superseded or cid not in self._kicks:
            if self._held.get(cid) is answer:
                del self._held[cid]
            return True
        return False

    def confirmed(self, link: EdgeLink, client_id: str, connection_id: str) -> list[HeldAnswer]:
        """`link`'s edge closed `connection_id`: the answers that may go now."""
        kicks = self._kicks.get(client_id)
        kick = kicks.get(connection_id) if kicks is not None else None
        if kick is None or kick.link is not link:
            return []
        return self._settle(client_id, connection_id)

    def link_closed(self, link: EdgeLink) -> list[HeldAnswer]:
        """`link`'s edge is gone from this master: its kicks are not waited for any more."""
        released: list[HeldAnswer] = []
        for cid, kicks in list(self._kicks.items()):
            for conn_id in [c for c, kick in kicks.items() if kick.link is link]:
                released += self._settle(cid, conn_id)
        return released

    def unload(self, client_ids: set[str]) -> list[HeldAnswer]:
        """The sessions of `client_ids` are no longer mastered here: their kicks are not
        waited for any more (an answer not durable yet goes when its batch is released)."""
        released: list[HeldAnswer] = []
        for cid in client_ids & self._kicks.keys():
            for conn_id in list(self._kicks[cid]):
                released += self._settle(cid, conn_id)
        return released

    def expire(self, now: int) -> list[HeldAnswer]:
        """The kicks unconfirmed past KICK_ACK_BOUND_MS (logged): their answers go."""
        released: list[HeldAnswer] = []
        for cid, kicks in list(self._kicks.items()):
            for conn_id, kick in list(kicks.items()):
                if kick.due_ms <= now:
                    log.warning(
                        "takeover of %s: edge %s did not confirm closing connection %s within "
                        "%d ms; answering the new connection",
                        cid,
                        kick.link.edge_id,
                        conn_id,
                        KICK_ACK_BOUND_MS,
                    )
                    released += self._settle(cid, conn_id)
        return released

    def _settle(self, client_id: str, connection_id: str) -> list[HeldAnswer]:
        kicks = self._kicks[client_id]
        del kicks[connection_id]
        if kicks:
            return []
        del self._kicks[client_id]
        held = self._held.get(client_id)
        if held is None or not held.durable:
            return []  # (not durable yet: it goes when its batch is released)
        del self._held[client_id]
        return [held]
