"""A partition node without processes: its group commit played by hand (the commit is a method
call; the gathering, the sealing and the release are the node's real CommitQueue, carried out as
GroupCommit carries it out), its edges' links read back as results and deliveries.

    node, commit = make_node()            # masters partition P at EPOCH
    edge = Edge(node, "e1")
    rid = connect(edge, "c", "c1")
    commit.durable()                      # the batch is durable and replicated: answers go out
    results, deliveries = edge.heard()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import Support
from hexmq.pacing import FlushPacer
from services.partition.commit_queue import FULL_COMMIT, CommitQueue
from services.partition.effects import Effect
from services.partition.group_commit import carry_out_released
from services.partition.node import PartitionNode
from services.partition.replication import Entry, Op, Replicator
from services.partition.store import RedisStore

P, EPOCH = 3, 7


def commit_queue() -> CommitQueue:
    """A group commit's core as the service makes it."""
    return CommitQueue(FlushPacer(full=FULL_COMMIT))


class InstantCommit:
    """The group commit without Redis or a task, over the node's CommitQueue `queue`:
    `durable()` plays the commit of the batch gathered so far (the queue seals it: its
    finishers add their writes; the writes are recorded in `written`), then the queue releases
    it and its effects go to `carry_out` (with `aborted`, those of commands that wrote an
    aborted partition are answered MOVED instead). With a `replicator`, that sequences each
    batch as a real commit has it do."""

    def __init__(
        self,
        queue: CommitQueue,
        carry_out: Callable[[Effect], None],
        replicator: Replicator | None = None,
    ) -> None:
        self.queue = queue
        self.carry_out = carry_out
        self.replicator = replicator
        self.written: list[tuple[int, Op]] = []

    def durable(self, aborted: frozenset[int] = frozenset()) -> None:
        queue = self.queue
        # The batch gathered, made if there is none: sealed, it gets its finishers' writes.
        batch = queue.batch
        sealed = queue.seal()
        assert sealed.batch is batch
        for p, ops in batch.ops.items():
            self.written += [(p, op) for op in ops]
        if self.replicator is not None:
            # A real replicator sequences the batch (its recent log, its origins); the release
            # is played here all the same.
            entries, _aborted = self.replicator.propose(batch.ops, batch.origins)
            self.replicator.master_durable(entries, object())
        token = queue.durable(sealed, [], aborted, 0)
        tokens = [(token, aborted)] if token is not None else []
        carry_out_released(queue.release(tokens), self.carry_out)

    @property
    def moved(self) -> int:
        """Commands answered MOVED so far."""
        return self.queue.moved


class Edge:
    """One edge's link, and what it heard. `protocol`: what its hello says it speaks (unset:
    an edge of v0.2.0, no features)."""

    def __init__(self, node: PartitionNode, edge_id: str, protocol: Support | None = None) -> None:
        self.node = node
        hello = pb.Hello(edge_id=edge_id, edge_incarnation=1)
        if protocol is not None:
            hello.protocol.CopyFrom(protocol.to_proto())
        self.link = node.open_link(hello, node.clock())
        self.next_id = 1
        self.link.take()  # the index snapshot
        # Plain OKs the link carried that `events` passed over (`heard` reports them).
        self.oks: list[int] = []

    def command(self, cid: str, *, partition: int = P, epoch: int = EPOCH, **kind: Any) -> int:
        request_id = self.next_id
        self.next_id += 1
        cmd = pb.EdgeCommand(
            request_id=request_id, partition=partition, partition_epoch=epoch, **kind
        )
        self.handle(cmd)
        return request_id

    def handle(self, cmd: pb.EdgeCommand) -> None:
        """`cmd` from this edge, now (the node's clock)."""
        self.node.handle(self.link, cmd, self.node.clock())

    def kicked(self, cid: str, conn: str) -> None:
        """The edge closed connection `conn` that a Kick named, and says so."""
        self.handle(pb.EdgeCommand(kicked=pb.Kicked(client_id=cid, connection_id=conn)))

    def unlink(self) -> None:
        """The edge's link to the node closes."""
        self.node.close_link(self.link, self.node.clock())

    def heard(self) -> tuple[dict[int, pb.Result], list[pb.Delivery]]:
        events, oks = self.link.take()
        oks, self.oks = self.oks + oks, []
        results = {rid: pb.Result(request_id=rid) for rid in oks}
        deliveries = []
        for event in events:
            if event.HasField("result"):
                results[event.result.request_id] = event.result
            elif event.HasField("delivery"):
                deliveries.append(event.delivery)
        return results, deliveries

    def events(self) -> list[pb.PartitionEvent]:
        """Everything the link carried since the last call (results as events only)."""
        events, oks = self.link.take()
        self.oks += oks
        return events


class Clock:
    """A scenario's time (unix ms), moved by hand: the node's `clock`, and the `now` that
    `Edge.command` gives each command."""

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self.now = start_ms

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms

    def monotonic(self) -> float:
        """The node's monotonic clock (seconds), moved with the wall clock here."""
        return self.now / 1000


class CountedIds:
    """Ids that are the same in every run: origin ids b"origin:000000001" and so on
    (services/partition/sources.py IdSource)."""

    def __init__(self) -> None:
        self.origins = 0

    def origin(self) -> bytes:
        self.origins += 1
        return b"origin:%09d" % self.origins

    def first_handoff_id(self) -> int:
        return 1


def make_node() -> tuple[PartitionNode, InstantCommit]:
    queue = commit_queue()
    clock = Clock()
    node = PartitionNode(
        "n1", RedisStore(None), queue, clock=clock, ids=CountedIds(), monotonic=clock.monotonic
    )
    node.mastered[P] = EPOCH
    return node, InstantCommit(queue, node.carry_out)


def connect(
    edge: Edge, cid: str, conn: str, *, partition: int = P, epoch: int = EPOCH, **options: Any
) -> int:
    return edge.command(
        cid,
        partition=partition,
        epoch=epoch,
        open_session=pb.OpenSession(
            client_id=cid,
            connection_id=conn,
            **{"session_expiry_s": 600, "receive_maximum": 10, **options},
        ),
    )


def receive(edge: Edge, cid: str, conn: str, pid: int) -> int:
    return edge.command(
        cid, qos2_receive=pb.Qos2Receive(client_id=cid, connection_id=conn, packet_id=pid)
    )


def routed(edge: Edge, cid: str, conn: str, pid: int, ok: bool = True) -> int:
    return edge.command(
        cid, qos2_routed=pb.Qos2Routed(client_id=cid, connection_id=conn, packet_id=pid, ok=ok)
    )


def no_effects(effect: object) -> None:
    """The carry_out of a group commit in a test that adds no effects, only answers."""
    raise AssertionError(f"an effect to carry out: {effect!r}")


class SequencingReplicator:
    """A stand-in for the replicator's propose: each batch's writes of a partition get the next
    seq, as the real one gives them (for tests of the group commit alone)."""

    def __init__(self) -> None:
        self.seq = 0

    def propose(self, ops: dict[int, list[Op]], origins: object) -> tuple[list[Entry], frozenset]:
        entries = []
        for p, written in ops.items():
            self.seq += 1
            entries.append(Entry(p, 1, self.seq, list(written), 0))
        return entries, frozenset()
