"""One partition's side of the PartitionCommands core (services/edge/hold.py): its held
commands, in order; what it has in flight; and what keeps it from sending (an epoch to wait
for, a retry pause, answers still due from an earlier route, a re-attach on its way). The core
holds one per partition and keeps what spans partitions (routes, requests in flight per node,
counters). Pure: no asyncio, no I/O; `now` in seconds."""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.tickets import SC, Effect, Kind, Log, Route, Ticket

# Answers after which the command was not applied (or never will be acknowledged): held and
# sent again.
SEND_AGAIN = frozenset(
    {
        SC.STATUS_CODE_MOVED,
        SC.STATUS_CODE_WRONG_MASTER,
        SC.STATUS_CODE_STALE_EPOCH,
        SC.STATUS_CODE_UNAVAILABLE,
    }
)
# A node that answered UNAVAILABLE, or that is behind the edge's view, is asked again after this.
RETRY_PAUSE = 0.25


def _order(ticket: Ticket) -> tuple[int, int]:
    return (0 if ticket.kind is Kind.ATTACH else 1, ticket.command_id)


@dataclass(slots=True)
class PartitionHold:
    # Held commands, single-partition only, in order (ATTACH first, then by command id).
    held: list[Ticket] = field(default_factory=list)
    # Requests sent and not answered (the tickets are kept per node, to take back).
    in_flight: int = 0
    # How many of those went to an earlier route than the current one: newer commands wait.
    stale: int = 0
    # ATTACH tickets in flight: the partition's other commands wait.
    attaching: int = 0
    # The view's epoch for the partition must reach this before anything is sent (an answer
    # or an index update showed a newer one, or MOVED showed the current one ending).
    min_epoch: int = 0
    # Not before this (a node answered UNAVAILABLE or is behind the view), and why.
    retry_at: float = 0.0
    retry_why: str = ""
    # A refusal burst is under way (logged once).
    refusing: bool = False

    def sendable(self, route: Route | None, now: float, kind: Kind) -> bool:
        """A command of `kind` may go by `route` now (held ones aside)."""
        return (
            route is not None
            and self.min_epoch <= route.epoch
            and now >= self.retry_at
            and (kind is Kind.ATTACH or not (self.attaching or self.stale))
        )

    def hold(self, ticket: Ticket) -> None:
        ticket.addressed = False  # sent later, maybe under another view: stamped then
        bisect.insort(self.held, ticket, key=_order)

    def releasable(self, route: Route | None, now: float) -> list[Ticket]:
        """Take the held commands that may go by `route` now, in order: re-attaches and what
        follows them, up to the first that must wait (behind a re-attach in flight, or answers
        due from an earlier route)."""
        held = self.held
        if not held or route is None or self.min_epoch > route.epoch or now < self.retry_at:
            return []
        n = 0
        attaching = self.attaching
        for ticket in held:
            if ticket.kind is Kind.ATTACH:
                attaching += 1
            elif attaching or self.stale:
                break
            n += 1
        if not n:
            return []
        batch = held[:n]
        del held[:n]
        self.refusing = False
        return batch

    def expire(self, deadline: float) -> list[Ticket]:
        """Take the held commands submitted at or before `deadline`."""
        expired = [t for t in self.held if t.submitted <= deadline]
        if expired:
            self.held = [t for t in self.held if t.submitted > deadline]
        return expired

    def refusal(self, p: int, hold: float, why: str, effects: list[Effect]) -> pb.Result:
        """The answer to this partition's commands held past `hold` seconds, because `why`;
        the first of a burst of refusals is logged (into `effects`)."""
        if not self.refusing:
            self.refusing = True
            effects.append(
                Log(
                    logging.WARNING, f"partition {p}: refusing commands held over {hold:g} s: {why}"
                )
            )
        return pb.Result(
            status=SC.STATUS_CODE_UNAVAILABLE,
            message=f"partition {p} has no master that can take it (held {hold:g} s: {why})",
        )

    def pause(self, now: float, why: str) -> None:
        self.retry_at = now + RETRY_PAUSE
        self.retry_why = why

    def mark(
        self, result: pb.Result, sent: Route, view_epoch: int, route: Route | None, now: float
    ) -> None:
        """What an answer that sends a command of this partition again says about it: `sent`
        is where the command went, `view_epoch` and `route` the partition's by the view now."""
        status = result.status
        answered_epoch = result.current_epoch
        if status == SC.STATUS_CODE_MOVED:
            # The epoch it was sent under (or the one the answer names) is ending.
            self.min_epoch = max(self.min_epoch, max(answered_epoch, sent.epoch) + 1)
        elif status == SC.STATUS_CODE_UNAVAILABLE:
            self.pause(now, f"{sent.node} answered: {result.message}")
        elif answered_epoch > view_epoch:
            # Newer than the view: wait for the view to have it, never jump to the node named.
            self.min_epoch = max(self.min_epoch, answered_epoch)
        elif route == sent:
            # The view sends it where it went: that node is behind the view.
            self.pause(now, f"{sent.node} is behind the view: {result.message}")
        # else the view has moved on since it was sent: it goes again by the view.

    def blocked_why(self, view_epoch: int, now: float) -> str:
        """Why the partition holds its commands though its master is reachable."""
        if self.min_epoch > view_epoch:
            return (
                f"it is moving to a new master (epoch {self.min_epoch} or newer; the view has "
                f"{view_epoch})"
            )
        if now < self.retry_at:
            return self.retry_why
        if self.stale:
            return "waiting for its previous master's answers"
        if self.attaching:
            return "re-attaching its sessions"
        return self.retry_why or "waiting"
