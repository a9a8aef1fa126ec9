"""PartitionCommands: what the edge sends to partition masters, and what it holds while a
partition has no master that can take it (a failover, a restart, a link that is down).

Pure: no asyncio, no I/O. The clock is passed in (`now`, in seconds) and every call returns
what to do as data (Send, Answer, Log); services/edge/dispatch.py carries it out over the
partition links. Its rules, per partition, are docs/failover.md's "The edge's command core":
a partition's commands go at once while it is open, are held (in order) while it is not,
and are refused past the failover hold; a caller may withdraw a request.
"""

from __future__ import annotations

import itertools

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.in_flight import InFlight
from services.edge.index_gate import IndexGate
from services.edge.partition_hold import SEND_AGAIN, PartitionHold
from services.edge.route_table import RouteTable
from services.edge.tickets import (
    OK_RESULT,
    SC,
    Effect,
    Kind,
    Route,
    Send,
    Ticket,
    address,
    answer,
    publish_part,
    split_publish,
)


class PartitionCommands:
    def __init__(self, hold: float) -> None:
        if not hold > 0:
            raise ValueError(f"the failover hold must be more than 0 seconds, not {hold!r}")
        self.hold = hold
        self._command_ids = itertools.count(1)
        # Tickets are keyed by serial: a whole command's is its command id; a part of a split
        # publish (which shares its command's id) gets a negative one of its own.
        self._part_serials = itertools.count(-1, -1)
        self._parts: list[PartitionHold] = []
        # Where each partition's commands go (services/edge/route_table.py); its routes list,
        # read on every send, under a name of its own.
        self.table = RouteTable()
        self._routes = self.table.routes
        # Requests in flight.
        self._flight = InFlight(self._parts, self._routes)
        # Partitions with held commands.
        self._holding: set[int] = set()
        # Publishes waiting for every partition's subscription index (GATE tickets).
        self._index = IndexGate()
        # Counters: commands held now; refused past the bound; QoS 0 publish parts dropped.
        self.held = 0
        self.refused = 0
        self.dropped_qos0 = 0

    # ----- what the adapter asks ----------------------------------------------------------

    def route(self, p: int) -> Route | None:
        """Where partition p's commands go now (None: no master with a link up)."""
        return self._routes[p] if p < len(self._routes) else None

    def open(self, p: int, now: float) -> bool:
        """A command for p would be sent now (nothing held, nothing waited for)."""
        if p >= len(self._parts):
            return False
        st = self._parts[p]
        return not st.held and st.sendable(self._routes[p], now, Kind.REQUEST)

    def ack_route(self, p: int) -> Route | None:
        """Where a delivery acknowledgement for p goes now: the view's live master, unless the
        partition is moving away from it. (Acknowledgements are not held: a re-attach carries
        those that were not confirmed.)"""
        route = self.route(p)
        if route is None or self._parts[p].min_epoch > route.epoch:
            return None
        return route

    def next_command_id(self) -> int:
        return next(self._command_ids)

    def unsettled(self) -> set[int]:
        """The partitions whose live connections may wait for their master (services/edge/
        unreachable.py): no route, something held, a re-attach or answers from an earlier
        route due, or an epoch newer than the view's to wait for. A connection whose session
        is not attached at its partition's route has a re-attach held or in flight, so its
        partition is among these; the others' connections need not be looked at."""
        routes = self._routes
        found = set()
        for p, st in enumerate(self._parts):
            route = routes[p]
            if route is None or st.held or st.attaching or st.stale or st.min_epoch > route.epoch:
                found.add(p)
        return found

    @property
    def waiting(self) -> bool:
        """Something waits for time to pass (a bound, a retry pause): tick() has work."""
        return bool(self.held or self._index.waiters)

    # ----- events -------------------------------------------------------------------------

    @property
    def view_epoch(self) -> int:
        return self.table.view_epoch

    def set_view(self, view: mpb.View) -> set[int]:
        """A newer view. Returns the partitions whose route changed (their live connections
        re-attach: the adapter submits those, then calls pump_all). Requests in flight to nodes
        that left the view are taken back at once."""
        count = len(view.partitions)
        if len(self._parts) < count:
            self._parts += [PartitionHold() for _ in range(count - len(self._parts))]
        changed = self._rerouted(self.table.set_view(view))
        members = self.table.members
        for node in [n for n in self._flight.by_node if n not in members]:
            self._take_back(node)
        return changed

    def link_up(self, node: str, session: int) -> set[int]:
        """The link to `node` is up again (its index snapshot arrived). Returns the partitions
        whose route changed; the adapter re-attaches their connections, then calls pump_all."""
        return self._rerouted(self.table.link_up(node, session))

    def link_down(self, node: str) -> set[int]:
        """The link to `node` broke: its requests in flight are held again, in order."""
        changed = self._rerouted(self.table.link_down(node))
        self._take_back(node)
        return changed

    def saw_epoch(self, p: int, epoch: int) -> None:
        """Something (an index reset) showed partition p at an epoch newer than the view's:
        nothing more goes to it until the view has that epoch."""
        if p < len(self._parts) and epoch > self.table.epochs[p]:
            st = self._parts[p]
            st.min_epoch = max(st.min_epoch, epoch)

    def send_at_once(self, ticket: Ticket, now: float) -> Route | None:
        """The hot path of `submit` for a single-partition REQUEST: when its partition is open,
        it is sent (recorded in flight) and its route returned, no effects needed; else None
        and nothing changed (the caller submits it)."""
        p = ticket.partitions[0]
        st = self._parts[p]
        route = self._routes[p]
        if (
            route is None
            or st.held
            or st.attaching
            or st.stale
            or st.min_epoch > route.epoch
            or now < st.retry_at
        ):
            return None
        ticket.submitted = now
        ticket.serial = ticket.command_id = command_id = next(self._command_ids)
        cmd = ticket.command
        assert cmd is not None
        cmd.command_id = command_id
        if not ticket.addressed:
            address(cmd, p, route.epoch)
        st.refusing = False
        ticket.attempt = 1
        ticket.routes = (route,)
        self._flight.add(ticket, route)
        return route

    def answered_ok(self, ticket: Ticket, attempt: int) -> bool:
        """The hot path of `answered` for an OK answer: True when the caller may hand the
        answer to the ticket's caller itself (a whole request, answered, with nothing of its
        partitions held); False and nothing changed otherwise (the caller uses `answered`)."""
        if ticket.parent is not None or not ticket.in_flight or ticket.attempt != attempt:
            return False
        parts = self._parts
        for p in ticket.partitions:
            if parts[p].held:
                return False
        self._flight.remove(ticket)
        return True

    def submit(self, ticket: Ticket, now: float) -> list[Effect]:
        """A new command (or gate): sent now if its partitions are open, else held."""
        ticket.submitted = now
        ticket.serial = ticket.command_id = next(self._command_ids)
        if ticket.command is not None:
            ticket.command.command_id = ticket.command_id
        effects: list[Effect] = []
        partitions = ticket.partitions
        if len(partitions) == 1:
            p = partitions[0]
            st = self._parts[p]
            if not st.held and st.sendable(self._routes[p], now, ticket.kind):
                if st.refusing:
                    st.refusing = False  # the partition is open: its refusal burst is over
                self._send(ticket, effects)
                return effects
            self._hold(ticket)
            if ticket.kind is Kind.ATTACH:
                effects += self._pump(p, now)  # an attach may pass the held ones
            return effects
        if self._whole_open(partitions, now):
            self._send(ticket, effects)
            return effects
        for part in split_publish(ticket, self._part_serials):
            p = part.partitions[0]
            st = self._parts[p]
            if not st.held and st.sendable(self._routes[p], now, part.kind):
                self._send(part, effects)
            else:
                self._hold(part)
        return effects

    def submit_qos0(self, ticket: Ticket, now: float) -> list[Effect]:
        """A QoS 0 publish (ONEWAY): sent to the open partitions, dropped (and counted) for the
        others, never held."""
        ticket.submitted = now
        ticket.serial = ticket.command_id = next(self._command_ids)
        assert ticket.command is not None
        ticket.command.command_id = ticket.command_id
        effects: list[Effect] = []
        if self._whole_open(ticket.partitions, now):
            self._send(ticket, effects)
            return effects
        for p in ticket.partitions:
            if self.open(p, now):
                part = Ticket(Kind.ONEWAY, (p,), publish_part(ticket.command, p), None)
                part.command_id = ticket.command_id
                part.serial = next(self._part_serials)
                self._send(part, effects)
            else:
                self.dropped_qos0 += 1
        return effects

    def withdraw(self, ticket: Ticket, now: float) -> list[Effect]:
        """The caller gives up on a request of one partition: held, it is dropped (what it
        held back may go now); in flight, it will not be sent again (docs/failover.md). Its
        caller hears nothing more, but an answer that applied it (OK) or refused it."""
        assert ticket.parent is None, "a whole request, not a part of one"
        assert len(ticket.partitions) == 1, "a request of one partition"
        ticket.withdrawn = True
        if ticket.in_flight:
            return []
        (p,) = ticket.partitions
        held = self._parts[p].held
        if ticket not in held:
            return []  # answered already
        held.remove(ticket)
        self.held -= 1
        return self._pump(p, now)

    def answered(self, ticket: Ticket, attempt: int, result: pb.Result, now: float) -> list[Effect]:
        """The answer to a request's send number `attempt` (an answer to an earlier send, or
        to a request taken back, is ignored)."""
        if not ticket.in_flight or ticket.attempt != attempt:
            return []
        self._flight.remove(ticket)
        effects: list[Effect] = []
        if result.status in SEND_AGAIN:
            self._mark(ticket, result, now)
            if not ticket.withdrawn:  # given up by its caller: not sent again, nobody told
                self._requeue(ticket)
        else:
            answer(ticket, result, effects)
        for p in ticket.partitions:
            if self._parts[p].held:
                effects += self._pump(p, now)
        return effects

    def pump_all(self, now: float) -> list[Effect]:
        """Send what every open partition holds (after a view or link change)."""
        effects: list[Effect] = []
        for p in sorted(self._holding):
            effects += self._pump(p, now)
        return effects

    def tick(self, now: float) -> list[Effect]:
        """Refuse what was held past the bound (in the order it came: a client hears its
        refusals in the order of its packets); send what a pause held back."""
        effects: list[Effect] = []
        deadline = now - self.hold
        refused: list[tuple[Ticket, pb.Result]] = []
        for p in sorted(self._holding):
            st = self._parts[p]
            expired = st.expire(deadline)
            if expired:
                self.held -= len(expired)
                self.refused += len(expired)
                refusal = st.refusal(p, self.hold, self._why(p, now), effects)
                refused += [(t, refusal) for t in expired]
                if not st.held:
                    self._holding.discard(p)
            effects += self._pump(p, now)
        refused.sort(key=lambda pair: pair[0].command_id)
        for ticket, refusal in refused:
            answer(ticket, refusal, effects)
        if self._index.waiters:
            effects += self._index.refuse_held_since(deadline, self.hold)
        return effects

    def await_index(self, ticket: Ticket, now: float) -> list[Effect]:
        """A GATE answered once every partition's subscription index has arrived (at once if
        they have), or refused past the bound."""
        ticket.serial = ticket.command_id = next(self._command_ids)
        ticket.submitted = now
        return self._index.wait(ticket)

    @property
    def index_complete(self) -> bool:
        return self._index.complete

    def index_completed(self) -> list[Effect]:
        """Every partition's subscription index has arrived (for good: it stays complete)."""
        return self._index.completed()

    # ----- internals ----------------------------------------------------------------------

    def _rerouted(self, changed: set[int]) -> set[int]:
        """These partitions have a new route: everything in flight went to an earlier one."""
        parts = self._parts
        for p in changed:
            st = parts[p]
            st.stale = st.in_flight
        return changed

    def _whole_open(self, partitions: tuple[int, ...], now: float) -> bool:
        """Every partition open, with one master: the command may go whole."""
        node = None
        for p in partitions:
            st = self._parts[p]
            if st.held or not st.sendable(self._routes[p], now, Kind.REQUEST):
                return False
            route = self._routes[p]
            assert route is not None
            if node is None:
                node = route.node
            elif route.node != node:
                return False
        return True

    def _send(self, ticket: Ticket, effects: list[Effect]) -> None:
        partitions = ticket.partitions
        route = self._routes[partitions[0]]
        assert route is not None
        ticket.attempt += 1
        if ticket.kind is Kind.GATE:
            ticket.routes = (route,)
            answer(ticket, OK_RESULT, effects)
            return
        cmd = ticket.command
        assert cmd is not None
        if len(partitions) == 1:
            ticket.routes = (route,)
            if not ticket.addressed:
                address(cmd, partitions[0], route.epoch)
        else:
            routes = []
            for p in partitions:
                p_route = self._routes[p]
                assert p_route is not None
                if not ticket.addressed:
                    address(cmd, p, p_route.epoch)
                routes.append(p_route)
            ticket.routes = tuple(routes)
        if ticket.kind is not Kind.ONEWAY:
            self._flight.add(ticket, route)
        effects.append(Send(ticket, route, ticket.attempt))

    def _take_back(self, node: str) -> None:
        """Requests in flight to `node` are held again (it left the view, or its link broke);
        any answer that still comes for them is ignored."""
        for ticket in self._flight.take(node):
            if not ticket.withdrawn:
                self._requeue(ticket)

    def _requeue(self, ticket: Ticket) -> None:
        """Back among the held commands of its partitions, in its original place. A copy of
        the command goes on: the old one may still sit in a live link's queue."""
        if len(ticket.partitions) > 1:
            for part in split_publish(ticket, self._part_serials):
                self._hold(part)
            return
        assert ticket.command is not None
        cmd = pb.EdgeCommand()
        cmd.CopyFrom(ticket.command)
        ticket.command = cmd
        self._hold(ticket)

    def _hold(self, ticket: Ticket) -> None:
        p = ticket.partitions[0]
        self._parts[p].hold(ticket)
        self._holding.add(p)
        self.held += 1

    def _pump(self, p: int, now: float) -> list[Effect]:
        st = self._parts[p]
        batch = st.releasable(self._routes[p], now)
        if not st.held:
            self._holding.discard(p)
        if not batch:
            return []
        self.held -= len(batch)
        effects: list[Effect] = []
        for ticket in batch:
            self._send(ticket, effects)
        return effects

    def _mark(self, ticket: Ticket, result: pb.Result, now: float) -> None:
        """What an answer that sends the command again says about its partition."""
        status = result.status
        sent = ticket.sent_to
        assert sent is not None
        if len(ticket.partitions) > 1:
            # Which of its partitions the answer is about is unknown: each part, sent alone,
            # will say. A node without a role answers UNAVAILABLE for all of them.
            if status == SC.STATUS_CODE_UNAVAILABLE:
                for p in ticket.partitions:
                    self._parts[p].pause(now, f"{sent.node} answered: {result.message}")
            return
        p = ticket.partitions[0]
        self._parts[p].mark(result, sent, self.table.epochs[p], self._routes[p], now)

    def why(self, p: int, now: float) -> str:
        """Why partition p holds its commands (or its sessions' re-attaches), for the log."""
        return self._why(p, now)

    def _why(self, p: int, now: float) -> str:
        """Why partition p holds its commands, for refusals and the log."""
        unreachable = self.table.unreachable(p)
        if unreachable is not None:
            return unreachable
        return self._parts[p].blocked_why(self.table.epochs[p], now)
