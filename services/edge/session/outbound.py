"""Outbound: one connection's deliveries in flight to the client, and its acknowledgements on
their way to the session's partition.

In flight, by packet id, in one table with the phase each is in: a QoS 1 PUBLISH awaiting
PUBACK, a QoS 2 PUBLISH awaiting PUBREC, a PUBREL awaiting PUBCOMP; counted and sized in an
InflightWindow against the client's Receive Maximum (the partition paces deliveries by that
window; the edge keeps the same count). The table is kept across a re-attach, so that a PUBACK
arriving afterwards still maps to its message, and a re-attach tells the partition what it
holds (services/edge/session/delivery.py).

Acknowledgements: the message ids the client acknowledged (PUBACK, PUBCOMP, a failing PUBREC)
and those it PUBREC'd, gathered per input and sent as one DeliveryAck; each batch is kept,
under a token, until the partition confirms it, since a re-attach must carry what the master
may not have applied. Past MAX_UNCONFIRMED_ACKS batches the oldest are taken as confirmed (a
partition service of an older version never answers them).
"""

from __future__ import annotations

import enum
from collections import OrderedDict

from services.edge.session.window import InflightWindow

MAX_UNCONFIRMED_ACKS = 256


class Phase(enum.IntEnum):
    PUBLISHED = 1  # QoS 1 PUBLISH sent: awaiting PUBACK
    PUBLISHED_QOS2 = 2  # QoS 2 PUBLISH sent: awaiting PUBREC
    RELEASED = 3  # PUBREL sent: awaiting PUBCOMP


# As module constants for the per-message paths (an enum member's lookup costs more).
PUBLISHED = Phase.PUBLISHED
PUBLISHED_QOS2 = Phase.PUBLISHED_QOS2
RELEASED = Phase.RELEASED


class Outbound:
    __slots__ = ("_inflight", "acks", "recs", "unconfirmed", "window")

    def __init__(self, receive_maximum: int) -> None:
        self.window = InflightWindow(receive_maximum)
        # packet id -> (message id, phase, size in bytes)
        self._inflight: dict[int, tuple[int, Phase, int]] = {}
        # To send in the next DeliveryAck: acknowledged message ids, PUBREC'd message ids.
        self.acks: list[int] = []
        self.recs: list[int] = []
        # Sent (or not sendable) and not confirmed: token -> (acknowledged ids, PUBREC'd ids).
        # Keyed by the session's token of the DeliveryAck (or of the re-attach that carries
        # them): its answer confirms them.
        self.unconfirmed: OrderedDict[int, tuple[list[int], list[int]]] = OrderedDict()

    # ----- in flight ----------------------------------------------------------------------

    def sent(self, pid: int, message_id: int, phase: Phase, size: int) -> None:
        """A PUBLISH (or PUBREL) went to the client with packet id `pid`."""
        # (The window's fields directly: this runs once per delivery.)
        window = self.window
        old = self._inflight.get(pid)
        if old is not None:  # sent again (DUP, or PUBREL after PUBLISH): one entry per id
            window.count -= 1
            window.bytes -= old[2]
        self._inflight[pid] = (message_id, phase, size)
        window.count += 1
        window.bytes += size

    def answered(self, pid: int, phase: Phase) -> int | None:
        """The client answered packet id `pid` in `phase` (PUBACK: PUBLISHED, PUBREC:
        PUBLISHED_QOS2, PUBCOMP: RELEASED): its message id, or None when nothing of that phase
        is in flight with that id (a stray or repeated answer)."""
        entry = self._inflight.get(pid)
        if entry is None or entry[1] is not phase:
            return None
        del self._inflight[pid]
        window = self.window
        window.count -= 1
        window.bytes -= entry[2]
        return entry[0]

    def phase(self, pid: int) -> Phase | None:
        """What packet id `pid` awaits from the client, or None when nothing is in flight
        with it."""
        entry = self._inflight.get(pid)
        return entry[1] if entry is not None else None

    def released(self, pid: int, message_id: int, size: int) -> None:
        """The partition recorded the PUBREC: PUBREL (again) until PUBCOMP."""
        self.sent(pid, message_id, RELEASED, size)

    def in_flight_ids(self) -> list[int]:
        """Message ids sent and not acknowledged (QoS 1 PUBLISH, QoS 2 PUBLISH before PUBREC)."""
        return [mid for mid, phase, _ in self._inflight.values() if phase is not RELEASED]

    def released_ids(self) -> list[int]:
        """Message ids whose PUBREL awaits PUBCOMP."""
        return [mid for mid, phase, _ in self._inflight.values() if phase is RELEASED]

    # ----- acknowledgements to the partition ----------------------------------------------

    @property
    def acks_waiting(self) -> bool:
        return bool(self.acks or self.recs)

    def take_acks(self, token: int) -> tuple[list[int], list[int]]:
        """The acknowledgements gathered since the last call, kept unconfirmed under
        `token`."""
        acks, self.acks = self.acks, []
        recs, self.recs = self.recs, []
        unconfirmed = self.unconfirmed
        unconfirmed[token] = (acks, recs)
        if len(unconfirmed) > MAX_UNCONFIRMED_ACKS:
            unconfirmed.popitem(last=False)
        return acks, recs

    def confirmed(self, token: int) -> None:
        self.unconfirmed.pop(token, None)

    def carried(self) -> tuple[list[int], list[int], list[int]]:
        """What a re-attach carries of the acknowledgements not confirmed: (their tokens,
        acknowledged message ids, PUBREC'd message ids)."""
        tokens = list(self.unconfirmed)
        acked = [mid for t in tokens for mid in self.unconfirmed[t][0]]
        received = [mid for t in tokens for mid in self.unconfirmed[t][1]]
        return tokens, acked, received
