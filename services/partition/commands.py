"""The partition master's command table: each kind of EdgeCommand and the function that
handles it, in the module that owns its kind of work. A command is a function of (state, link,
command, now): it changes the state at once (so the next command sees it), puts its writes on
the group commit's batch and leaves what the edges may hear as effects, as data
(services/partition/effects.py). Commands of one link are handled in arrival order.

`handle` fences a command by the partitions it addresses first: one that must wait for a
partition about to be served here is given back to the adapter to queue (services/partition/
node.py, which owns the clock its wait is measured by).

`RELEASED` maps the effects that change the state once their batch is released to the
function that does; the adapter carries out the rest (sends, spans, hand-outs by its clock).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition import delivery, qos2_inbound, session_commands, subscriptions, wills
from services.partition.commit_queue import CommitQueue, Scope
from services.partition.effects import (
    AnswerTakeover,
    ConnectionReady,
    MessageDurable,
    Pump,
    SendReleased,
)
from services.partition.fencing import SC, reply
from services.partition.id_source import IdSource
from services.partition.limits import QueueLimits
from services.partition.links import EdgeLink
from services.partition.qos2_seen import SeenOrigins
from services.partition.redelivery import SharedRedelivery
from services.partition.replication import Replicator
from services.partition.roles import command_targets, must_wait
from services.partition.state import PartitionState
from services.partition.tracing import AppendTracer

Command = Callable[[PartitionState, EdgeLink, pb.EdgeCommand, int], None]

COMMANDS: dict[str, Command] = {
    "open_session": session_commands.open_session,
    "attach_session": session_commands.attach_session,
    "close_session": session_commands.close_session,
    "kicked": session_commands.kicked,
    "enqueue_shared": session_commands.enqueue_shared,
    "shared_handoff_done": session_commands.shared_handoff_done,
    "node_stats": session_commands.node_stats,
    "subscribe": subscriptions.subscribe,
    "unsubscribe": subscriptions.unsubscribe,
    "index_ack": subscriptions.index_ack,
    "publish": delivery.publish,
    "delivery_ack": delivery.delivery_ack,
    "retained_query": delivery.retained_query,
    "enqueue_retained": delivery.enqueue_retained,
    "will_published": wills.will_published,
    "qos2_receive": qos2_inbound.qos2_receive,
    "qos2_routed": qos2_inbound.qos2_routed,
    "qos2_release": qos2_inbound.qos2_release,
    "qos2_forget": qos2_inbound.qos2_forget,
}


def new_state(
    node_id: str,
    commit: CommitQueue,
    ids: IdSource,
    replicator: Replicator | None,
    tracer: AppendTracer,
    limits: QueueLimits,
    seen: SeenOrigins | None = None,
) -> PartitionState:
    """A partition master's state, with nothing mastered yet, wired to its commit queue (each
    batch, as it is sealed, gets the records of the sessions its messages changed)."""
    state = PartitionState(node_id, commit, ids, replicator, tracer)
    state.delivery.limits = limits
    if seen is not None:
        state.qos2.seen = seen
    state.redelivery = SharedRedelivery(
        node_id,
        commit,
        state.index.shared,
        state.conns.sessions,
        state.conns.links,
        lambda session, qm: delivery.enqueue(state, session, qm),
        lambda session: delivery.schedule_pump(state, session),
        ids,
        state.outbox,
    )
    commit.add_finisher(lambda batch: delivery.write_dirty(state, batch))
    return state


def handle(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> int | None:
    """Handle `cmd` from `link` at `now` (unix ms). Returns the partition it must wait for
    (it is not handled: the adapter queues it), or None once it is handled."""
    kind = cmd.WhichOneof("command") or ""
    command = COMMANDS.get(kind)
    if command is None:
        reply(state, link, cmd, SC.STATUS_CODE_INVALID, message=f"unknown command {kind!r}")
        return None
    targets = command_targets(cmd, kind)
    if not targets:
        command(state, link, cmd, now)
        return None
    waits_for = must_wait(state, targets)
    if waits_for is not None:
        return waits_for
    # What the command adds to the batch is its own: dropped (and the command answered MOVED)
    # if a partition it wrote is aborted before the batch is released.
    commit = state.commit
    commit.handling(Scope(frozenset(p for p, _ in targets), link.send, cmd.request_id))
    try:
        command(state, link, cmd, now)
    finally:
        commit.handling(None)
    return None


# What a released batch's effects do to the state (the adapter carries them out through this).
RELEASED: dict[type, Callable[[PartitionState, Any], None]] = {
    ConnectionReady: session_commands.connection_ready,
    AnswerTakeover: session_commands.answer_takeover,
    MessageDurable: delivery.message_durable,
    Pump: delivery.pump_after_release,
    SendReleased: delivery.send_released,
}
