"""Local requests to change the view (Propose), and when to answer them.

The node's partition service asks for in-sync changes and handovers of the partitions it
masters. Each Propose call becomes a `Ticket`: its requests go to the planner (as
`Observed.requests`) until `request_outcome` says each is done or moot in an agreed view; then
the call is answered with that view's epoch and the partitions whose handover or in-sync
change was not made (moot). Pure: the agent feeds views in and awaits tickets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from hexmq.api.membership.v1 import membership_pb2 as pb
from services.membership.plan import HandoverRequest, InSyncRequest, request_outcome

Request = InSyncRequest | HandoverRequest


class ProposalError(ValueError):
    """A Propose request that cannot be taken: the message says which part and why."""


def requests_from_proto(msg: pb.ProposeRequest, partition_count: int) -> list[Request]:
    """The planner's requests for one ProposeRequest, checked against the view's shape."""
    requests: list[Request] = []
    for change in msg.in_sync:
        where = f"in_sync change of partition {change.partition}"
        _check_partition(change.partition, partition_count, where)
        add, remove = frozenset(change.add), frozenset(change.remove)
        if not add and not remove:
            raise ProposalError(f"{where}: adds and removes nothing")
        if add & remove:
            raise ProposalError(f"{where}: {sorted(add & remove)} both added and removed")
        if "" in add | remove:
            raise ProposalError(f"{where}: an empty node id")
        incarnations = tuple(sorted((n, i) for n, i in change.add_incarnations.items() if n in add))
        try:
            requests.append(
                InSyncRequest(change.partition, change.epoch, add, remove, incarnations)
            )
        except ValueError as exc:  # the planner's own checks (e.g. an epoch of 0)
            raise ProposalError(f"{where}: {exc}") from exc
    for handover in msg.handovers:
        where = f"handover of partition {handover.partition}"
        _check_partition(handover.partition, partition_count, where)
        if not handover.to:
            raise ProposalError(f"{where}: no node to hand over to")
        try:
            requests.append(HandoverRequest(handover.partition, handover.epoch, handover.to))
        except ValueError as exc:
            raise ProposalError(f"{where}: {exc}") from exc
    if not requests:
        raise ProposalError("the request asks for no change")
    return requests


def _check_partition(partition: int, count: int, where: str) -> None:
    if partition >= count:
        raise ProposalError(f"{where}: the view has partitions 0-{count - 1}")


@dataclass(eq=False)
class Ticket:
    """One Propose call waiting for its answer."""

    requests: list[Request]
    reply: asyncio.Future[pb.ProposeReply] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class ProposalBook:
    """The Propose calls waiting for an agreed view."""

    def __init__(self) -> None:
        self._tickets: list[Ticket] = []

    def add(self, requests: Sequence[Request], view: pb.View) -> Ticket:
        """A ticket for these requests; answered at once if `view` settles them already."""
        ticket = Ticket(list(requests))
        self._tickets.append(ticket)
        self.settle(view)
        return ticket

    def drop(self, ticket: Ticket) -> None:
        """Forget a ticket (answered, timed out or cancelled): its requests are not planned any
        more."""
        if ticket in self._tickets:
            self._tickets.remove(ticket)

    def pending(self) -> list[Request]:
        """The requests still to propose, oldest first, each once."""
        seen: list[Request] = []
        for ticket in self._tickets:
            for request in ticket.requests:
                if request not in seen:
                    seen.append(request)
        return seen

    def settle(self, view: pb.View) -> int:
        """Answer every ticket whose requests are all done or moot in `view`; returns how many
        were answered."""
        answered = 0
        for ticket in list(self._tickets):
            outcomes = [(r, request_outcome(r, view)) for r in ticket.requests]
            if any(outcome == "pending" for _, outcome in outcomes):
                continue
            # Every moot request is answered rejected: a handover, an addition, and a removal
            # too. A removal is moot only when the partition moved on (another epoch, its
            # master no member: `request_outcome`), so the master that asked no longer masters
            # it and must not take the follower out of the set whose acknowledgements it
            # counts: seed 4086, a master cut from its agent while the view moved its partition
            # on heard its removals of two followers "made", released entries only the other
            # two had acknowledged, and answered them durable, though the new epoch's master
            # never had them (a QoS 2 message lost). A removal whose follower is already out
            # of the set, in the same epoch, is done, not moot.
            rejected = sorted({r.partition for r, o in outcomes if o == "moot"})
            if not ticket.reply.done():
                ticket.reply.set_result(pb.ProposeReply(view_epoch=view.epoch, rejected=rejected))
            self._tickets.remove(ticket)
            answered += 1
        return answered

    def __len__(self) -> int:
        return len(self._tickets)
