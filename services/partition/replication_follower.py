"""The follower side of a node's replication: joining each master, taking its FeedStarts,
entries and snapshot chunks in order, and acknowledging what its store made durable."""

from __future__ import annotations

from collections.abc import Iterable

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.replication_log import NOWHERE, Entry, Op, op_size, ops_from_pb
from services.partition.replication_state import FollowedPartition, Persist, ReplicaState
from services.partition.snapshot_codec import SnapshotChunkError, chunk_ops


class FollowerSide(ReplicaState):
    def link_open(self, master: str) -> list[pb.PartitionPosition]:
        """This node opened its stream to `master`: the joins its hello carries."""
        self.links.add(master)
        joins = []
        for fd in self.followed.values():
            if fd.master != master:
                continue
            fd.need = 0
            fd.accepting = False
            fd.joined_at = 0
            join = self._join_position(fd)
            if join is not None:
                joins.append(join)
        return joins

    def _join_position(self, fd: FollowedPartition) -> pb.PartitionPosition | None:
        """Where fd joins its master from, or None while writes it accepted are not durable yet
        (it joins once they are: a master counts the join's position as acknowledged)."""
        if fd.loading:
            # Cut off mid-snapshot: what is stored of the partition is partial (and its stored
            # position says so); start over from nothing.
            fd.loading = False
            fd.received = NOWHERE
            fd.history = ()
            if fd.durable != NOWHERE:
                return None  # the clear is still on its way to the store
        if fd.received != fd.durable:
            return None
        fd.joined_at = self.now or 1
        epoch, seq = fd.durable
        return pb.PartitionPosition(
            partition=fd.partition, epoch=epoch, seq=seq, leader_epoch=fd.epoch
        )

    def _join(self, fd: FollowedPartition) -> None:
        """Join fd's master on the open stream (a later join: the view changed)."""
        if fd.master not in self.links:
            return
        join = self._join_position(fd)
        if join is not None:
            self._to_master(fd.master).joins.append(join)

    def link_closed(self, master: str) -> None:
        self.links.discard(master)
        for fd in self.followed.values():
            if fd.master == master:
                fd.accepting = False
                fd.joined_at = 0

    def step_items(self, master: str, items: Iterable[pb.ReplicationItem]) -> None:
        """FeedStarts, entries and snapshot chunks from `master`, in stream order. Raises
        SnapshotChunkError for a chunk it cannot read (the items before it are taken); the
        adapter then ends the stream, and the follower joins again on a new one."""
        persist: Persist | None = None
        limits = self.limits
        for item in items:
            kind = item.WhichOneof("item")
            if kind == "entry":
                e = item.entry
                fd = self.followed.get(e.partition)
                if fd is None or fd.master != master or not fd.accepting or fd.loading:
                    continue
                expected = fd.received[1] + 1
                if e.seq < expected:
                    continue  # already have it (resent after a reconnect or a need)
                if e.seq > expected:
                    if fd.need != expected:
                        fd.need, fd.need_at = expected, self.now
                        self._need(fd)
                    continue
                fd.received = (e.epoch, e.seq)
                fd.need = 0
                if persist is None:
                    persist = self._new_persist()
                ops = ops_from_pb(e.ops)
                persist.ops.extend(ops)
                persist.positions[e.partition] = fd.received
                if not fd.history or fd.history[-1][0] < e.epoch:
                    fd.history = (*fd.history, (e.epoch, e.seq))
                    fd.history_dirty = True
                if fd.history_dirty:
                    persist.histories[e.partition] = fd.history
                    fd.history_dirty = False
                origins = list(e.origins)
                size = sum(op_size(op) for op in ops) + sum(len(o) for o in origins)
                fd.log.append(
                    Entry(e.partition, e.epoch, e.seq, ops, size, item, origins=origins),
                    limits,
                    e.seq + 1,
                )
            elif kind == "start":
                s = item.start
                fd = self.followed.get(s.partition)
                if fd is None or fd.master != master or s.epoch != fd.epoch:
                    continue  # not our master by our view (or our view is older): not taken
                if s.partition in self._deferred:
                    continue
                if s.rejoin:
                    fd.accepting = False
                    fd.joined_at = 0
                    self._join(fd)
                    continue
                fd.accepting = True
                fd.need = 0
                theirs = tuple((h.epoch, h.seq) for h in s.history)
                if s.snapshot:
                    fd.snapshot_history = theirs
                else:
                    # Our history up to from_seq is the master's (it checked our join); what
                    # we took from it after that point (a repeated FeedStart) stays.
                    ours = (h for h in fd.history if s.from_seq <= h[1] <= fd.received[1])
                    fd.history = theirs + tuple(ours)
                    fd.history_dirty = True
            else:
                c = item.snapshot
                fd = self.followed.get(c.partition)
                if fd is None or fd.master != master or not fd.accepting:
                    continue
                try:
                    chunk = chunk_ops(c)
                except SnapshotChunkError:
                    if persist is not None:  # what came before the chunk is taken
                        self._ready.persist.append(persist)
                    raise
                if persist is None:
                    persist = self._new_persist()
                if c.first:
                    fd.loading = True
                    fd.need = 0
                    fd.history = ()
                    fd.received = NOWHERE
                    # Its recent log goes with the state it held: cut off mid-snapshot, the
                    # follower joins from nothing and may be sent the log from seq 1, which
                    # appended to the old entries made a log whose entries[seq - start] is
                    # not entry seq (served wrong entries, or failed, once it was promoted).
                    fd.log.reset(NOWHERE)
                    # Anything this batch held for the partition is superseded.
                    persist.clear.append(c.partition)
                    persist.ops = [op for op in persist.ops if not _in_partition(op, c.partition)]
                    persist.positions[c.partition] = NOWHERE
                    persist.histories.pop(c.partition, None)
                elif not fd.loading:
                    continue
                persist.ops.extend(chunk)
                if c.last:
                    fd.loading = False
                    fd.received = (c.epoch, c.seq)
                    fd.history = fd.snapshot_history
                    fd.log.reset(fd.received)
                    persist.positions[c.partition] = fd.received
                    persist.histories[c.partition] = fd.history
        if persist is not None:
            self._ready.persist.append(persist)

    def _new_persist(self) -> Persist:
        self._persist_seq += 1
        persist = Persist(self._persist_seq)
        self._persisting[persist.id] = persist
        return persist

    def _need(self, fd: FollowedPartition) -> None:
        frame = self._to_master(fd.master)
        frame.needs.append(
            pb.PartitionPosition(partition=fd.partition, seq=fd.need, leader_epoch=fd.epoch)
        )

    def _to_master(self, master: str) -> pb.FollowerFrame:
        frame = self._ready.to_masters.get(master)
        if frame is None:
            frame = self._ready.to_masters[master] = pb.FollowerFrame()
        return frame


def _in_partition(op: Op, p: int) -> bool:
    return op[1].startswith(f"hx:{p}:")
