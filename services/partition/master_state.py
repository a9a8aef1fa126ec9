"""What every command handler of the partition master shares: the state it works on and how a
command is fenced and answered.

PartitionNode (services/partition/node.py) is put together from one mixin per kind of work
(subscriptions, delivery, inbound QoS 2, wills), each a MasterState. The attributes below are
declared here so that each mixin type-checks on its own; PartitionNode.__init__ builds them and
says what each holds.
"""

from __future__ import annotations

from collections.abc import Callable

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.membership.view import master_of
from hexmq.topics import TopicTrie
from services.partition.commit_queue import CommitQueue
from services.partition.effects import Send
from services.partition.links import EdgeLink
from services.partition.qos2_seen import SeenOrigins
from services.partition.replication import Replicator
from services.partition.sessions import Session
from services.partition.shared import SharedGroups
from services.partition.sources import IdSource
from services.partition.store import RedisStore

SC = pb.StatusCode


def _result(
    request_id: int, status: int = SC.STATUS_CODE_OK, **fields: object
) -> pb.PartitionEvent:
    return pb.PartitionEvent(result=pb.Result(request_id=request_id, status=status, **fields))  # type: ignore[arg-type]


class MasterState:
    node_id: str
    replicator: Replicator | None
    store: RedisStore
    commit: CommitQueue
    view: mpb.View | None
    mastered: dict[int, int]
    sessions: dict[str, Session]
    links: dict[str, EdgeLink]
    trie: TopicTrie[str, pb.SubscriptionSpec]
    shared: SharedGroups
    seen: SeenOrigins
    # services/partition/sources.py: the time for what runs after a batch is durable (handlers
    # are given theirs), and new ids.
    clock: Callable[[], int]
    ids: IdSource
    # The monotonic clock (seconds), for how long commands wait for a partition.
    monotonic: Callable[[], float]

    def master_of(self, p: int) -> str:
        assert self.view is not None
        return master_of(self.view.partitions[p])

    def _reply(
        self, link: EdgeLink, cmd: pb.EdgeCommand, status: int = 0, **fields: object
    ) -> None:
        if not cmd.request_id:
            return
        if status == SC.STATUS_CODE_OK and not fields:
            self.commit.after_ok(link.ok, cmd.request_id)
            return
        event = _result(cmd.request_id, status, **fields)
        self.commit.after(Send(link, event))

    def _check_owner(self, link: EdgeLink, cmd: pb.EdgeCommand, p: int, epoch: int) -> bool:
        """Fencing: refuse (never half-apply) a command routed by another view."""
        current = self.mastered.get(p)
        if current is None:
            known = self.view is not None and p < len(self.view.partitions)
            master = self.master_of(p) if known else ""
            assert self.view is not None
            self._reply(
                link,
                cmd,
                SC.STATUS_CODE_WRONG_MASTER,
                message=f"partition {p} is not mastered by {self.node_id}",
                current_master=master,
                current_epoch=self.view.partitions[p].epoch if known else 0,
            )
            return False
        if epoch != current:
            self._reply(
                link,
                cmd,
                SC.STATUS_CODE_STALE_EPOCH,
                message=f"partition {p} is at epoch {current}, not {epoch}",
                current_master=self.node_id,
                current_epoch=current,
            )
            return False
        replicator = self.replicator
        if replicator is not None and not replicator.accepts_writes(p):
            self._reply(
                link,
                cmd,
                SC.STATUS_CODE_MOVED,
                message=f"partition {p} is being handed over",
                current_epoch=current,
            )
            return False
        return True

    def _live_session(
        self, link: EdgeLink, cmd: pb.EdgeCommand, cid: str, conn_id: str
    ) -> Session | None:
        if not self._check_owner(link, cmd, cmd.partition, cmd.partition_epoch):
            return None
        session = self.sessions.get(cid)
        if session is None or session.partition != cmd.partition:
            self._reply(link, cmd, SC.STATUS_CODE_NOT_FOUND, message=f"no session {cid!r}")
            return None
        if session.connection is None or session.connection.connection_id != conn_id:
            self._reply(link, cmd, SC.STATUS_CODE_TAKEN_OVER, message="connection replaced")
            return None
        return session
