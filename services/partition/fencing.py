"""What every command of the partition master shares: how it is fenced (a command routed by
another view is refused, never half-applied) and answered."""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.membership.view import master_of
from services.partition.effects import Send
from services.partition.links import EdgeLink
from services.partition.sessions import Session
from services.partition.state import PartitionState

SC = pb.StatusCode


def result(request_id: int, status: int = SC.STATUS_CODE_OK, **fields: object) -> pb.PartitionEvent:
    return pb.PartitionEvent(result=pb.Result(request_id=request_id, status=status, **fields))  # type: ignore[arg-type]


def reply(
    state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, status: int = 0, **fields: object
) -> None:
    """Answer `cmd` once what it wrote is durable and replicated."""
    if not cmd.request_id:
        return
    if status == SC.STATUS_CODE_OK and not fields:
        state.commit.after_ok(link.ok, cmd.request_id)
        return
    state.commit.after(Send(link, result(cmd.request_id, status, **fields)))


def check_owner(
    state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, p: int, epoch: int
) -> bool:
    """Fencing: refuse (never half-apply) a command routed by another view."""
    current = state.roles.mastered.get(p)
    if current is None:
        view = state.roles.view
        known = view is not None and p < len(view.partitions)
        assert view is not None
        reply(
            state,
            link,
            cmd,
            SC.STATUS_CODE_WRONG_MASTER,
            message=f"partition {p} is not mastered by {state.node_id}",
            current_master=master_of(view.partitions[p]) if known else "",
            current_epoch=view.partitions[p].epoch if known else 0,
        )
        return False
    if epoch != current:
        reply(
            state,
            link,
            cmd,
            SC.STATUS_CODE_STALE_EPOCH,
            message=f"partition {p} is at epoch {current}, not {epoch}",
            current_master=state.node_id,
            current_epoch=current,
        )
        return False
    replicator = state.replicator
    if replicator is not None and not replicator.accepts_writes(p):
        reply(
            state,
            link,
            cmd,
            SC.STATUS_CODE_MOVED,
            message=f"partition {p} is being handed over",
            current_epoch=current,
        )
        return False
    return True


def live_session(
    state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, cid: str, conn_id: str
) -> Session | None:
    """The session `cmd` names, if its partition is mastered here and `conn_id` holds it."""
    if not check_owner(state, link, cmd, cmd.partition, cmd.partition_epoch):
        return None
    session = state.conns.sessions.get(cid)
    if session is None or session.partition != cmd.partition:
        reply(state, link, cmd, SC.STATUS_CODE_NOT_FOUND, message=f"no session {cid!r}")
        return None
    if session.connection is None or session.connection.connection_id != conn_id:
        reply(state, link, cmd, SC.STATUS_CODE_TAKEN_OVER, message="connection replaced")
        return None
    return session
