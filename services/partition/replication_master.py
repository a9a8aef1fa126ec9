"""The master side of a node's replication: sequencing writes, streaming them to each follower
(from the log or by snapshot), counting followers in the in-sync set through the view, and
releasing batches once every counted follower holds them. What it reports of its followers
is read in replication_status.py."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import ZLIB_SNAPSHOTS
from services.partition.replication_log import (
    Entry,
    Op,
    Position,
    history_to_pb,
    on_history,
    op_size,
)
from services.partition.replication_state import (
    FollowerProgress,
    FollowerState,
    HandoverReady,
    InSync,
    InSyncChange,
    MasteredPartition,
    ReplicaState,
    SnapshotRead,
)
from services.partition.snapshot_codec import ChunkSent, fill_chunk


class MasterSide(ReplicaState):
    def accepts_writes(self, p: int) -> bool:
        """The partition is mastered here and not being handed over."""
        m = self.mastered.get(p)
        return m is not None and not m.handover_to

    def pending_writes(self, p: int) -> bool:
        """Writes of p proposed here are not released yet."""
        return any(p in parts for _token, parts, _aborted in self._pending)

    def propose(
        self,
        writes: Mapping[int, Sequence[Op]],
        origins: Mapping[int, Sequence[bytes]] | None = None,
    ) -> tuple[list[Entry], frozenset[int]]:
        """Sequence one batch's writes: one entry per partition, with the origins of the QoS 1
        publishes it holds (`origins`; a partition with origins and no writes gets an entry
        all the same: the barrier of a publish written before, see `wrote`). The caller makes
        the entries durable (with the position, and the history where an entry carries one)
        and then calls `master_durable`. Writes of partitions no longer mastered here are not
        made (returned as aborted: the commands that made them must not be acknowledged)."""
        entries = []
        aborted = []
        parts = list(writes)
        if origins:
            parts += [p for p in origins if p not in writes]
        for p in parts:
            ops = writes.get(p, ())
            m = self.mastered.get(p)
            if m is None:
                aborted.append(p)
                continue
            ors = origins.get(p, ()) if origins else ()
            if not ops and not ors:
                continue
            m.seq += 1
            size = sum(op_size(op) for op in ops) + sum(len(o) for o in ors)
            entry = Entry(p, m.epoch, m.seq, list(ops), size, origins=ors)
            if m.history_unwritten:
                entry.history = m.history
                m.history_unwritten = False
            entries.append(entry)
        return entries, frozenset(aborted)

    def wrote(self, p: int, origin: bytes) -> bool:
        """Whether the recent log of p, mastered here, holds a publish from `origin` (written by
        this node as master, or received while it followed p): a publish sent again after a
        failover or a link outage, not to be written twice."""
        m = self.mastered.get(p)
        return m is not None and origin in m.log.by_origin

    def _pinned(self, m: MasteredPartition) -> int:
        """A follower taking a snapshot needs the entries after the snapshot's position."""
        return min(
            (
                fp.snapshot_at[1] + 1
                for fp in m.followers.values()
                if fp.state == FollowerState.SNAPSHOT
            ),
            default=m.durable + 1,
        )

    def feed_open(
        self, follower: str, joins: Iterable[pb.PartitionPosition], incarnation: int = 0
    ) -> None:
        """A follower opened its stream (replacing any earlier one); its hello's joins."""
        self.feeds[follower] = incarnation
        for m in self.mastered.values():
            fp = m.followers.get(follower)
            if fp is not None:
                self._lose_stream(fp)
        self.step_joins(follower, joins)

    def step_joins(self, follower: str, joins: Iterable[pb.PartitionPosition]) -> None:
        """The follower starts following these partitions from these positions."""
        for join in joins:
            m = self.mastered.get(join.partition)
            fp = m.followers.get(follower) if m is not None else None
            if m is None or fp is None or fp.departed or join.leader_epoch != m.epoch:
                continue  # not ours at that epoch (one of us has not seen the view yet)
            self._accept_join(m, fp, (join.epoch, join.seq))
        self._advance()

    def _accept_join(self, m: MasteredPartition, fp: FollowerProgress, pos: Position) -> None:
        if fp.state == FollowerState.SNAPSHOT and fp.last_join == pos:
            return  # the same join again, on the same stream: its snapshot is under way
        fp.last_join = pos
        fp.snapshot_started = False
        fp.joined = True
        if on_history(m.history, m.durable, pos) and m.log.reaches(pos[1] + 1):
            fp.state = FollowerState.LIVE if pos[1] == m.durable else FollowerState.LOG
            fp.next, fp.acked = pos[1] + 1, pos[1]
            if fp.state == FollowerState.LIVE:
                fp.caught_up_at = self.now
            self._out(fp.node).append(self._start_item(m, pos[1] + 1, snapshot=False))
            self._send(m, fp)
            self._consider_adding(m, fp)
            return
        # Off this master's history (a tail it never had), or behind its log: the follower's
        # copy is replaced by a snapshot, once the view no longer counts it in sync.
        fp.acked = 0
        if fp.counted:
            fp.state = FollowerState.WAITING
            self._ask_removal(m, fp)
        else:
            self._start_snapshot(m, fp)

    def _start_item(
        self, m: MasteredPartition, from_seq: int, *, snapshot: bool
    ) -> pb.ReplicationItem:
        history = [h for h in m.history if h[1] < from_seq] if not snapshot else list(m.history)
        return pb.ReplicationItem(
            start=pb.FeedStart(
                partition=m.partition,
                epoch=m.epoch,
                from_seq=from_seq,
                snapshot=snapshot,
                history=history_to_pb(tuple(history)),
            )
        )

    def feed_closed(self, follower: str) -> None:
        self.feeds.pop(follower, None)
        for m in self.mastered.values():
            fp = m.followers.get(follower)
            if fp is not None:
                self._lose_stream(fp)
        self._advance()

    def _lose_stream(self, fp: FollowerProgress) -> None:
        if fp.state != FollowerState.DOWN:
            fp.down_since = self.now
        fp.state = FollowerState.DOWN
        fp.snapshot_started = False
        fp.last_join = None

    def _streaming_to(
        self, follower: str, pos: pb.PartitionPosition
    ) -> tuple[MasteredPartition, FollowerProgress] | None:
        """The partition of `pos` and `follower`'s progress in it, when this node masters it and
        streams its log to that follower in the epoch `pos` names (else None: an
        acknowledgement or a gap report from an older stream or epoch, ignored)."""
        m = self.mastered.get(pos.partition)
        fp = m.followers.get(follower) if m is not None else None
        if (
            m is None
            or fp is None
            or fp.state not in (FollowerState.LOG, FollowerState.LIVE)
            or pos.leader_epoch != m.epoch
        ):
            return None
        return m, fp

    def step_acks(self, follower: str, acks: Iterable[pb.PartitionPosition]) -> None:
        now = self.now
        for ack in acks:
            streaming = self._streaming_to(follower, ack)
            if streaming is None:
                continue
            m, fp = streaming
            if ack.seq > fp.acked:
                fp.acked = min(ack.seq, m.durable)
            if fp.acked >= m.durable:
                fp.caught_up_at = now
                fp.state = FollowerState.LIVE
                self._consider_adding(m, fp)
            self._send(m, fp)
        self._advance()

    def step_needs(self, follower: str, needs: Iterable[pb.PartitionPosition]) -> None:
        """The follower met a gap: resend from the seq it expected, or snapshot."""
        for need in needs:
            streaming = self._streaming_to(follower, need)
            if streaming is None:
                continue
            m, fp = streaming
            fp.acked = min(fp.acked, need.seq - 1)
            if m.log.reaches(need.seq) and need.seq <= m.durable + 1:
                fp.state, fp.next = FollowerState.LOG, need.seq
                self._send(m, fp)
            elif fp.counted:
                fp.state = FollowerState.WAITING
                self._ask_removal(m, fp)
            else:
                self._start_snapshot(m, fp)
        self._advance()

    def snapshot_chunk(self, read: SnapshotRead, ops: list[Op], last: bool) -> ChunkSent | None:
        """One chunk of a snapshot read, and how it went out; None if that snapshot is no
        longer wanted (the stream broke or a newer one started): the reader stops."""
        follower, p, at = read.follower, read.partition, read.at
        m = self.mastered.get(p)
        fp = m.followers.get(follower) if m is not None else None
        if (
            m is None
            or fp is None
            or fp.state != FollowerState.SNAPSHOT
            or fp.snapshot_id != read.id
        ):
            return None
        chunk = pb.SnapshotChunk(
            partition=p,
            epoch=at[0],
            seq=at[1],
            first=not fp.snapshot_started,
            last=last,
        )
        sent = fill_chunk(chunk, ops, packed=self.protocol.uses(ZLIB_SNAPSHOTS))
        out = self._out(follower)
        if not fp.snapshot_started:
            out.append(self._start_item(m, at[1] + 1, snapshot=True))
        fp.snapshot_started = True
        fp.snapshot_sent += sum(op_size(op) for op in ops)
        out.append(pb.ReplicationItem(snapshot=chunk))
        if last:
            fp.state, fp.next, fp.acked = FollowerState.LOG, at[1] + 1, 0
            self._send(m, fp)
        return sent

    def snapshot_lost(self, read: SnapshotRead) -> None:
        """A snapshot read ended without its last chunk for a reason other than the stream or
        a newer snapshot (the adapter's read failed): if that snapshot is still wanted, start
        it again, since the follower's repeated joins no longer do."""
        m = self.mastered.get(read.partition)
        fp = m.followers.get(read.follower) if m is not None else None
        if (
            m is None
            or fp is None
            or fp.state != FollowerState.SNAPSHOT
            or fp.snapshot_id != read.id
        ):
            return
        self._start_snapshot(m, fp)

    def _start_snapshot(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        fp.state = FollowerState.SNAPSHOT
        fp.snapshot_started = False
        fp.snapshot_sent = 0
        fp.snapshot_at = (m.durable_epoch, m.durable)
        fp.acked = 0
        self._snapshot_ids += 1
        fp.snapshot_id = self._snapshot_ids
        self._ready.snapshot_reads.append(
            SnapshotRead(fp.node, m.partition, fp.snapshot_at, fp.snapshot_id)
        )

    def _send(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        if fp.next <= m.durable and not m.log.reaches(fp.next):
            # The log no longer reaches back to it.
            if fp.counted:
                fp.state = FollowerState.WAITING
                self._ask_removal(m, fp)
            else:
                self._start_snapshot(m, fp)
            return
        limit = min(m.durable, fp.acked + self.limits.window)
        if fp.next > limit:
            return
        out = self._out(fp.node)
        entries, start = m.log.entries, m.log.start
        for seq in range(fp.next, limit + 1):
            out.append(entries[seq - start].item())
        fp.next = limit + 1

    # ----- the in-sync set (through the view) ---------------------------------------------

    def _consider_adding(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        if (
            fp.isr == InSync.OUT
            and fp.state == FollowerState.LIVE
            and fp.acked >= m.durable
            and not fp.departed
        ):
            fp.isr = InSync.ADDING
            incarnation = self.feeds.get(fp.node, 0)
            self._ready.in_sync_changes.append(
                InSyncChange(m.partition, m.epoch, fp.node, True, incarnation)
            )

    def _ask_removal(self, m: MasteredPartition, fp: FollowerProgress) -> None:
        if fp.isr in (InSync.IN, InSync.ADDING):
            fp.isr = InSync.REMOVING
            self._ready.in_sync_changes.append(InSyncChange(m.partition, m.epoch, fp.node, False))

    def in_sync_settled(self, change: InSyncChange, *, made: bool) -> None:
        """The agent's answer to a change: made (it holds in an agreed view), or not made (an
        addition it will not make; any change once the partition moved on). A removal not
        made leaves the follower counted (REMOVING, not asked again): the partition moved on,
        so nothing more is released in this epoch until the view demotes this master, and
        nothing only some followers acknowledged is answered durable (seed 4086)."""
        m = self.mastered.get(change.partition)
        fp = m.followers.get(change.follower) if m is not None else None
        if m is None or fp is None or m.epoch != change.epoch:
            return
        if change.add:
            if fp.isr == InSync.ADDING:
                fp.isr = InSync.IN if made and not fp.departed else InSync.OUT
        elif fp.isr == InSync.REMOVING:
            if not made:
                return
            fp.isr = InSync.OUT
            if fp.state == FollowerState.WAITING:
                self._start_snapshot(m, fp)
        if fp.departed and fp.isr != InSync.REMOVING:
            if fp.isr == InSync.IN:
                # Added as it left: ask for its removal (it is no replica any more).
                self._ask_removal(m, fp)
            else:
                del m.followers[fp.node]
        else:
            self._consider_adding(m, fp)
        self._advance()

    def in_sync_failed(self, change: InSyncChange) -> None:
        """The agent could not be asked (unreachable): ask again."""
        m = self.mastered.get(change.partition)
        fp = m.followers.get(change.follower) if m is not None else None
        if m is None or fp is None or m.epoch != change.epoch:
            return
        if (change.add and fp.isr == InSync.ADDING) or (
            not change.add and fp.isr == InSync.REMOVING
        ):
            self._ready.in_sync_changes.append(change)

    def set_lease(self, valid: bool) -> None:
        if valid != self.lease:
            self.lease = valid
            self._advance()

    def handover_settled(self, ready: HandoverReady) -> None:
        """The agent answered a handover without making it (the view moved on): the partition
        takes writes again until the view asks anew."""
        m = self.mastered.get(ready.partition)
        if m is not None and m.epoch == ready.epoch:
            m.handover_asked = False

    def _releasable(self, parts: dict[int, tuple[int, int]]) -> bool:
        for p, (epoch, seq) in parts.items():
            m = self.mastered.get(p)
            if m is None or m.epoch != epoch:
                continue  # aborted: released without it
            counted = False
            for fp in m.followers.values():
                if fp.counted:
                    if fp.acked < seq:
                        return False
                    counted = True
            if not counted and m.replicated and not self.lease:
                return False
        return True

    def _advance(self) -> None:
        pending = self._pending
        committed = self._ready.committed
        while pending:
            token, parts, aborted = pending[0]
            if not self._releasable(parts):
                break
            pending.popleft()
            gone = [
                p
                for p, (epoch, _seq) in parts.items()
                if (m := self.mastered.get(p)) is None or m.epoch != epoch
            ]
            committed.append((token, aborted.union(gone) if gone else aborted))
        for m in self.mastered.values():
            if m.handover_to and not m.handover_asked and not self.pending_writes(m.partition):
                m.handover_asked = True
                self._ready.handovers.append(HandoverReady(m.partition, m.epoch, m.handover_to))

    def _out(self, follower: str) -> list[pb.ReplicationItem]:
        out = self._ready.to_followers.get(follower)
        if out is None:
            out = self._ready.to_followers[follower] = []
        return out
