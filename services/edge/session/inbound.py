"""Qos2Claims: one connection's inbound QoS 2 packet ids, from PUBLISH to PUBCOMP.

The exactly-once decision for a packet id is the session partition's (the claim, docs/
architecture.md "QoS 2"); the connection keeps only where each of its own packet ids stands:

- routing: claimed (Qos2Receive sent) or being routed, its PUBREC not sent yet (with its
  payload size, which the inbound window counts until then);
- unrecorded: stored at every target, but the session's partition had no master within the
  failover bound to record it (recorded again on re-attach, and only then PUBREC);
- received: answered PUBREC, awaiting PUBREL (they count against our Receive Maximum until
  PUBCOMP, MQTT-4.9).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from services.edge.qos2_origins import RoutedOrigin


@dataclass(frozen=True, slots=True)
class Unrecorded:
    """A routing stored everywhere whose record waits for the session's partition."""

    size: int
    reason: int
    span: Span | None
    routed: RoutedOrigin | None


class Qos2Claims:
    __slots__ = ("received", "routing", "unrecorded")

    def __init__(self) -> None:
        self.routing: dict[int, int] = {}  # packet id -> payload size
        self.unrecorded: dict[int, Unrecorded] = {}
        self.received: set[int] = set()

    def in_progress(self, pid: int) -> bool:
        """A PUBLISH with this packet id is being stored (a resend: its PUBREC follows)."""
        return pid in self.routing or pid in self.unrecorded

    def settled(self, pid: int) -> int | None:
        """No longer being stored (answered, refused or abandoned): its size, None if it was
        not being stored."""
        size = self.routing.pop(pid, None)
        pending = self.unrecorded.pop(pid, None)
        return size if pending is None else pending.size

    def wait_for_record(self, pid: int, pending: Unrecorded) -> None:
        self.routing.pop(pid, None)
        self.unrecorded[pid] = pending

    def take_unrecorded(self) -> dict[int, Unrecorded]:
        """The routings to record again (the connection is attached again): routing anew."""
        taken, self.unrecorded = self.unrecorded, {}
        for pid, pending in taken.items():
            self.routing[pid] = pending.size
        return taken
