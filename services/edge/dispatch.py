"""Dispatcher: the edge's one way to send commands to partitions, carrying out what
services/edge/hold.py (pure) decides, over the partition links.

Connections, wills, shared-subscription hand-offs and $SYS submit their commands here, by
partition; the core says what to send where now and what to hold, and answers arrive as plain
callbacks, as before (no future per message). Effects run in the order the core produced them,
also when an answer's callback submits more (they queue behind), so nothing overtakes a command
already decided. A timer ticks the core while anything is held (the failover bound, retry
pauses).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.hold import PartitionCommands
from services.edge.links import PartitionLink
from services.edge.tickets import (
    Answer,
    Effect,
    Kind,
    ResultCallback,
    Route,
    Send,
    Ticket,
    publish_partitions,
)

log = logging.getLogger("hexmq.edge.dispatch")

# How often the core is ticked while anything is held.
TICK = 0.1

OK = pb.StatusCode.STATUS_CODE_OK
# What a command sent on a link that turned out to be down is answered (held and sent again).
_LINK_DOWN = pb.Result(status=pb.StatusCode.STATUS_CODE_UNAVAILABLE, message="link down")


def _ignore(result: pb.Result) -> None:
    pass


class Dispatcher:
    def __init__(
        self,
        links: Mapping[str, PartitionLink],
        hold: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = PartitionCommands(hold)
        self._links = links
        self.clock = clock
        self._effects: deque[Effect] = deque()
        self._busy = False
        self._timer: asyncio.TimerHandle | None = None

    # ----- commands -----------------------------------------------------------------------

    def request(self, p: int, cmd: pb.EdgeCommand, on_result: ResultCallback) -> Ticket:
        """A command for partition p that wants a Result (held while p has no master)."""
        ticket = Ticket(Kind.REQUEST, (p,), cmd, on_result)
        self._submit_request(ticket)
        return ticket

    def _submit_request(self, ticket: Ticket) -> None:
        now = self.clock()
        # The fast path sends at once, so only when no decided effect is still to be carried
        # out (an answer's callback submitting while sends wait in the queue: it must not pass
        # them).
        route = None if self._busy else self.core.send_at_once(ticket, now)
        if route is None:
            self._run(self.core.submit(ticket, now))
            return
        attempt = ticket.attempt
        link = self._links.get(route.node)
        cmd = ticket.command
        assert cmd is not None
        if link is None or not link.track(
            cmd, lambda result: self._answered(ticket, attempt, result)
        ):
            self._answered(ticket, attempt, _LINK_DOWN)

    def withdraw(self, ticket: Ticket) -> None:
        """The caller gives a request up: never sent again (PartitionCommands.withdraw)."""
        self._run(self.core.withdraw(ticket, self.clock()))

    def attach(self, p: int, cmd: pb.EdgeCommand, on_result: ResultCallback) -> Ticket:
        """AttachSession: ahead of p's held commands, and p's other commands wait for it."""
        ticket = Ticket(Kind.ATTACH, (p,), cmd, on_result)
        self._run(self.core.submit(ticket, self.clock()))
        return ticket

    def oneway(self, p: int, cmd: pb.EdgeCommand) -> None:
        """A command without a Result that must not be lost while p has no master."""
        self._run(self.core.submit(Ticket(Kind.ONEWAY, (p,), cmd, None), self.clock()))

    def gate(self, p: int, on_result: ResultCallback) -> None:
        """`on_result(OK)` once p takes commands, in turn with its held ones (a refusal past
        the bound)."""
        self._run(self.core.submit(Ticket(Kind.GATE, (p,), None, on_result), self.clock()))

    def publish(self, cmd: pb.EdgeCommand, on_result: ResultCallback) -> None:
        """A QoS >= 1 Publish for one master's partitions: one answer once every partition
        has one (split per partition if some are held)."""
        # Its targets carry the epochs of the view the router just routed it by.
        ticket = Ticket(Kind.REQUEST, publish_partitions(cmd), cmd, on_result, addressed=True)
        if len(ticket.partitions) == 1:
            self._submit_request(ticket)
        else:
            self._run(self.core.submit(ticket, self.clock()))

    def publish_qos0(self, cmd: pb.EdgeCommand) -> None:
        """A QoS 0 Publish: to the partitions that take commands now, dropped for the rest."""
        ticket = Ticket(Kind.ONEWAY, publish_partitions(cmd), cmd, None, addressed=True)
        self._run(self.core.submit_qos0(ticket, self.clock()))

    def after_index(self, on_result: ResultCallback) -> None:
        """`on_result(OK)` once every partition's subscription index has arrived (at once if
        it has), a refusal past the bound."""
        ticket = Ticket(Kind.GATE, (), None, on_result)
        self._run(self.core.await_index(ticket, self.clock()))

    def acknowledge(
        self, p: int, cmd: pb.EdgeCommand, on_result: ResultCallback, *, lazy: bool = False
    ) -> bool:
        """A DeliveryAck, ahead of queued commands; `on_result` hears its answer, if one
        comes. False when p's master cannot take it now: not sent (the connection's next
        re-attach carries its ids). `lazy`: it may wait for company (PartitionLink.track)."""
        route = self.core.ack_route(p)
        link = self._links.get(route.node) if route is not None else None
        if route is None or link is None:
            return False
        cmd.command_id = self.core.next_command_id()
        cmd.partition = p
        cmd.partition_epoch = route.epoch
        return link.track(cmd, on_result, urgent=True, expendable=True, lazy=lazy)

    def forget_origins(self, origins: Mapping[int, list[bytes]]) -> None:
        """Qos2Forget: one command per master node for the partitions that take commands now;
        one held command per partition for the others."""
        now = self.clock()
        by_node: dict[str, list[pb.SeenOrigin]] = {}
        for p, ids in origins.items():
            route = self.core.route(p)
            if route is not None and self.core.open(p, now):
                entries = by_node.setdefault(route.node, [])
                entries.extend(pb.SeenOrigin(partition=p, epoch=route.epoch, origin=o) for o in ids)
            else:
                held = [pb.SeenOrigin(partition=p, origin=o) for o in ids]
                self.oneway(p, pb.EdgeCommand(qos2_forget=pb.Qos2Forget(origins=held)))
        for node, entries in by_node.items():
            cmd = pb.EdgeCommand(qos2_forget=pb.Qos2Forget(origins=entries))
            cmd.command_id = self.core.next_command_id()
            self._links[node].send(cmd)

    def open(self, p: int) -> bool:
        """Partition p takes commands now (nothing of it is held)."""
        return self.core.open(p, self.clock())

    def route(self, p: int) -> Route | None:
        return self.core.route(p)

    def why(self, p: int) -> str:
        """Why partition p cannot take commands now (its master unreachable, or moving)."""
        return self.core.why(p, self.clock())

    @property
    def held(self) -> int:
        return self.core.held

    # ----- events -------------------------------------------------------------------------

    def set_view(self, view: mpb.View) -> set[int]:
        """A newer view: the partitions whose route changed. The caller re-attaches their
        connections, then calls pump()."""
        return self.core.set_view(view)

    def link_up(self, link: PartitionLink) -> set[int]:
        """The link is ready again: the partitions whose route changed (then, as set_view)."""
        return self.core.link_up(link.node_id, link.session)

    def link_down(self, link: PartitionLink) -> None:
        self.core.link_down(link.node_id)
        if self.core.held:
            log.info(
                "holding %d commands for partitions without a reachable master", self.core.held
            )
        self._arm()

    def saw_epoch(self, p: int, epoch: int) -> None:
        self.core.saw_epoch(p, epoch)

    def index_completed(self) -> None:
        if not self.core.index_complete:
            self._run(self.core.index_completed())

    def pump(self) -> None:
        """Send what the partitions that opened hold."""
        before = self.core.held
        self._run(self.core.pump_all(self.clock()))
        sent = before - self.core.held
        if sent > 0:
            log.info("sent %d held commands; %d still held", sent, self.core.held)

    # ----- effects ------------------------------------------------------------------------

    def _answered(self, ticket: Ticket, attempt: int, result: pb.Result) -> None:
        if result.status == OK and self.core.answered_ok(ticket, attempt):
            on_result = ticket.on_result
            if on_result is not None:
                if self._busy:
                    self._effects.append(Answer(ticket, result))  # in turn
                else:
                    on_result(result)
            return
        self._run(self.core.answered(ticket, attempt, result, self.clock()))

    def _run(self, effects: list[Effect]) -> None:
        if self._busy:
            self._effects.extend(effects)  # the outer call runs them, after its own, in order
            return
        self._busy = True
        try:
            for effect in effects:
                self._do(effect)
            queue = self._effects
            while queue:
                self._do(queue.popleft())
        finally:
            self._busy = False
        if self._timer is None and self.core.waiting:
            self._arm()

    def _do(self, effect: Effect) -> None:
        try:
            if isinstance(effect, Send):
                self._send(effect)
            elif isinstance(effect, Answer):
                on_result = effect.ticket.on_result
                if on_result is not None:
                    on_result(effect.result)
            else:
                log.log(effect.level, "%s", effect.message)
        except Exception:
            log.exception("failed to carry out %s", type(effect).__name__)

    def _send(self, effect: Send) -> None:
        ticket, route = effect.ticket, effect.route
        cmd = ticket.command
        assert cmd is not None
        link = self._links.get(route.node)
        if ticket.kind is Kind.ONEWAY:
            if link is not None:
                link.send(cmd)
            return
        attempt = effect.attempt
        if link is None or not link.track(
            cmd, lambda result: self._answered(ticket, attempt, result)
        ):
            self._answered(ticket, attempt, _LINK_DOWN)

    def _arm(self) -> None:
        if self._timer is None and self.core.waiting:
            self._timer = asyncio.get_running_loop().call_later(TICK, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self._run(self.core.tick(self.clock()))

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


@dataclass(frozen=True, slots=True)
class SessionRoute:
    """A live connection's session partition: its commands go there through the dispatcher."""

    partition: int
    dispatcher: Dispatcher

    def request(self, cmd: pb.EdgeCommand, callback: ResultCallback) -> Ticket:
        return self.dispatcher.request(self.partition, cmd, callback)

    def request_ignored(self, cmd: pb.EdgeCommand) -> None:
        """A request whose answer nobody needs, but which must reach the partition (sent again
        if its link breaks)."""
        self.dispatcher.request(self.partition, cmd, _ignore)
