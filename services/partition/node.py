"""PartitionNode: the adapter around the partition master's command core.

The core is the state (services/partition/state.py) and the functions that change it: the
commands (services/partition/commands.py maps each EdgeCommand to its function), the roles
(roles.py) and housekeeping steps, with no clock and no I/O. This adapter gives them the time,
keeps the edge links, loads promoted partitions from Redis (promotion.py), and carries out the
effects they leave, as data (effects.py), by one table (`_CARRY_OUT`): those on the state's
outbox as soon as the call that left them returns, those on the group commit's queue when
their batch is durable and replicated (GroupCommit calls `carry_out`).

Its public methods are what the service's other adapters (server.py, housekeeping.py,
view_door.py) and the replication driver (peers.py, as RoleListener) call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import KICK_ACKS, ProtocolError, Support
from services.partition import delivery, qos2_inbound, roles, session_commands, wills
from services.partition.commands import RELEASED, handle, new_state
from services.partition.commit_queue import CommitQueue
from services.partition.effects import (
    AfterIndexed,
    Effect,
    EndAppendSpans,
    HandoffReady,
    HandOutShared,
    HandOutWills,
    RecordSpan,
    Send,
    SendToAll,
)
from services.partition.limits import LimitCounts, QueueLimits
from services.partition.links import EdgeLink
from services.partition.promotion import PartitionReader, PromotionLoader
from services.partition.qos2_seen import SeenOrigins
from services.partition.replication import Replicator
from services.partition.retained import RetainedMessages
from services.partition.sessions import Session
from services.partition.sources import IdSource, RandomIds, wall_ms
from services.partition.state import PartitionState
from services.partition.tracing import AppendTracer


def _stop_on_failure(exc: BaseException) -> None:
    raise exc


class PartitionNode:
    def __init__(
        self,
        node_id: str,
        store: PartitionReader,
        commit: CommitQueue,
        tracing: telemetry.Tracing | None = None,
        limits: QueueLimits | None = None,
        replicator: Replicator | None = None,
        seen: SeenOrigins | None = None,
        on_failure: Callable[[BaseException], None] = _stop_on_failure,
        clock: Callable[[], int] = wall_ms,
        ids: IdSource | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node_id = node_id
        # The time handlers are given (unix ms), and the clock (seconds) commands waiting for
        # a partition are timed by: services/partition/sources.py.
        self.clock = clock
        self.monotonic = monotonic
        self.tracing = tracing or telemetry.Tracing.disabled()
        self.commit = commit
        ids = ids or RandomIds()
        tracer = AppendTracer(node_id, self.tracing, replicator)
        self.state = state = new_state(
            node_id, commit, ids, replicator, tracer, limits or QueueLimits(), seen
        )
        self.tracer = tracer
        self.loader = PromotionLoader(state, store, self._serve, on_failure, clock)
        commit.add_release_hook(self._pump_released)

    # ----- what the service reads (metrics, $SYS, the servicer) ----------------------------

    @property
    def view(self) -> mpb.View | None:
        return self.state.roles.view

    @property
    def mastered(self) -> dict[int, int]:
        return self.state.roles.mastered

    @property
    def sessions(self) -> dict[str, Session]:
        return self.state.conns.sessions

    @property
    def links(self) -> dict[str, EdgeLink]:
        return self.state.conns.links

    @property
    def retained(self) -> RetainedMessages:
        return self.state.delivery.retained

    @property
    def seen(self) -> SeenOrigins:
        return self.state.qos2.seen

    @property
    def limit_counts(self) -> LimitCounts:
        return self.state.delivery.limit_counts

    @property
    def dropped_queue_full(self) -> int:
        return self.state.delivery.dropped_queue_full

    @property
    def resent_publishes(self) -> int:
        return self.state.delivery.resent_publishes

    @property
    def messages_in(self) -> int:
        return self.state.delivery.messages_in

    @property
    def messages_out(self) -> int:
        return self.state.delivery.messages_out

    @property
    def waiting_commands(self) -> int:
        """Commands waiting for a partition this node is about to serve."""
        return sum(len(queue) for queue in self.state.roles.waiting.values())

    def queued_messages(self) -> int:
        """QoS 1/2 messages held by the sessions here (one pass over the sessions)."""
        return session_commands.queued_messages(self.state)

    # ----- links and commands ----------------------------------------------------------------

    def open_link(self, hello: pb.Hello, now: int) -> EdgeLink:
        try:
            kick_acks = KICK_ACKS in Support.from_proto(hello.protocol).features
        except ProtocolError:  # (refused before this: services/partition/hello.py)
            kick_acks = False
        link = EdgeLink(hello.edge_id, hello.edge_incarnation, kick_acks=kick_acks)
        session_commands.link_opened(self.state, link, now)
        self._flush()
        return link

    def close_link(self, link: EdgeLink, now: int) -> None:
        """The edge went away (at `now`, unix ms): see session_commands.close_link."""
        session_commands.close_link(self.state, link, now)
        self._flush()

    def handle(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        """Handle `cmd` from `link` at `now` (unix ms, the adapter's clock: handlers read no
        clock of their own); one for a partition about to be served here waits for it, up to
        roles.WAIT_S on the monotonic clock."""
        p = handle(self.state, link, cmd, now)
        if p is not None:
            roles.hold(self.state, p, link, cmd, self.monotonic() + roles.WAIT_S)
        self._flush()

    # ----- the view and roles (main.py; peers.py's RoleListener) -------------------------------

    def apply_view(self, view: mpb.View) -> None:
        """The agreed view: who masters what (for fencing answers); the commands that waited
        for it are handled again."""
        roles.apply_view(self.state, view, time.time_ns())
        self._flush()
        self.retry_waiting()

    def promoted(self, p: int) -> None:
        """This node masters p from now on: load it, then serve it."""
        replicator = self.state.replicator
        assert replicator is not None
        roles.promote(self.state, p, replicator.mastered[p].epoch, time.time_ns())
        self._flush()
        self.loader.load(p)

    def demoted(self, p: int) -> None:
        """This node no longer masters p: drop its memory state."""
        self.demoted_all([p])

    def demoted_all(self, partitions: Sequence[int]) -> None:
        """This node no longer masters these partitions: drop their memory state."""
        self.loader.drop(partitions)
        roles.demote(self.state, partitions)
        self._flush()
        self.retry_waiting(partitions)

    def _serve(self, partitions: Sequence[int]) -> None:
        roles.serve(self.state, partitions, time.time_ns())
        self._flush()
        self.retry_waiting(partitions)

    def retry_waiting(self, partitions: Iterable[int] | None = None) -> None:
        """Handle again, in order, the commands waiting for these partitions (all: None)."""
        now = self.clock()
        for link, cmd in roles.take_waiting(self.state, partitions):
            self.handle(link, cmd, now)

    def expire_waiting(self, now: float) -> int:
        """Answer UNAVAILABLE the commands that waited past WAIT_S by `now` (the monotonic
        clock, seconds: a jump of the wall clock must not hold them longer); their edges ask
        again."""
        expired = 0
        for p in list(self.state.roles.waiting):
            expired_here = roles.expire_waiting(self.state, p, now)
            self._flush()
            if expired_here:
                expired += expired_here
                self.retry_waiting([p])
        return expired

    # ----- housekeeping (main.py's sweep, once a second) -----------------------------------

    def settle_takeovers(self, now: int) -> int:
        """Answer the takeovers whose kicked connections were not confirmed closed within
        KICK_ACK_BOUND_MS; how many kicks are still waited for."""
        waited = session_commands.settle_takeovers(self.state, now)
        self._flush()
        return waited

    def expire_sessions(self, now: int) -> int:
        """Remove sessions whose expiry interval has passed since their connection ended."""
        expired = session_commands.expire_sessions(self.state, now)
        self._flush()
        return expired

    def hand_out_wills(self, now: int) -> None:
        """Give every due will to an edge to publish (again, if one went unanswered)."""
        wills.hand_out(self.state, now)
        self._flush()

    def hand_out_shared(self, now: int) -> None:
        """Shared-subscription messages of members that went offline lately, and those being
        handed over (again, if unanswered), to an edge."""
        self.state.redelivery.sweep(now)
        self._flush()

    def sweep_qos2_seen(self, now: int) -> int:
        """Forget the origin ids kept past the retention (their forgets never came)."""
        return qos2_inbound.sweep_seen(self.state, now)

    # ----- effects -------------------------------------------------------------------------

    def carry_out(self, effect: Effect) -> None:
        """Carry out what a command left for when its batch is durable and replicated
        (GroupCommit.release calls this, in order)."""
        _CARRY_OUT[type(effect)](self, effect)
        self._flush()

    def _flush(self) -> None:
        """Carry out, in order, what was put on the outbox to go at once (and what carrying it
        out puts there). Each round takes the outbox's entries off it first, so that a flush
        from inside one (an index barrier released at once sends through `_send_now`) never
        carries out an effect twice."""
        out = self.state.outbox
        while out:
            taken = out.copy()
            out.clear()
            for effect in taken:
                _CARRY_OUT[type(effect)](self, effect)

    def _pump_released(self) -> None:
        delivery.pump_released(self.state)
        self._flush()

    def _after_indexed(self, e: AfterIndexed) -> None:
        self.state.index.barrier.wait(
            e.seq, list(self.state.conns.links.values()), lambda: self._send_now(e.link, e.event)
        )

    def _send_now(self, link: EdgeLink, event: pb.PartitionEvent) -> None:
        self.state.outbox.append(Send(link, event))
        self._flush()

    def _end_append_spans(self, e: EndAppendSpans) -> None:
        self.tracer.durable(e, self.commit.releasing)

    def _record_span(self, e: RecordSpan) -> None:
        self.tracing.record(e.name, e.start_ns, e.end_ns, e.attributes)


def _send(node: PartitionNode, e: Send) -> None:
    e.link.send(e.event)


def _send_to_all(node: PartitionNode, e: SendToAll) -> None:
    for link in e.links:
        link.send(e.event)


def _on_state(
    change: Callable[[PartitionState, Any], None],
) -> Callable[[PartitionNode, Any], None]:
    return lambda node, e: change(node.state, e)


def _hand_out_shared(node: PartitionNode, e: HandOutShared) -> None:
    node.state.redelivery.hand_out(node.clock())


_CARRY_OUT: dict[type, Callable[[PartitionNode, Any], None]] = {
    Send: _send,
    SendToAll: _send_to_all,
    RecordSpan: PartitionNode._record_span,
    EndAppendSpans: PartitionNode._end_append_spans,
    AfterIndexed: PartitionNode._after_indexed,
    **{kind: _on_state(change) for kind, change in RELEASED.items()},
    HandOutWills: lambda n, e: wills.hand_out(n.state, n.clock()),
    HandoffReady: lambda n, e: n.state.redelivery.ready(e.handoff_id, n.clock()),
    HandOutShared: _hand_out_shared,
}
