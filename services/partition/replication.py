"""Replication of a node's partitions: a deterministic state machine with no I/O.

Every partition has a master and followers, as the agreed view says (services/membership; the
view names each partition's master epoch, replicas and in-sync set). The master sequences the
writes of each group-commit batch per partition (one LogEntry per partition and batch, seq =
previous + 1), makes them durable in its own Redis first and only then streams them to its
followers; a batch's results are released (`Ready.committed`) once every follower the master
counts as in sync has acknowledged, durably, the entry it needs.

The in-sync set changes only through the view (docs/failover.md): the master asks for a
follower to be added once it has caught up and counts it from that moment; it asks for a
lagging or lost one to be removed and keeps counting it until the view (the agent's answer)
confirms. So the view's in-sync set always holds every acknowledged write, and any member of
it may be promoted.

Epochs and histories (after Kafka's KIP-101/279): each replica keeps the partition's epoch
history, (epoch, first seq) per master tenure. A follower joins its master per partition with
the (epoch, seq) of its last entry; the master answers with a `FeedStart` at its epoch, then the
log from there if that position lies on its own history (and its in-memory log reaches back),
or else a snapshot of its state, which replaces the follower's copy: a position off the
master's history is a tail the master never had, hence never acknowledged. A follower that is in
the in-sync set is taken out of it through the view before its copy is replaced. Followers keep
the same in-memory log of recent entries as masters, so that a promoted follower can serve its
followers from the log.

Fencing: a follower takes a partition's items only after a FeedStart whose epoch is its view's
epoch for the partition, on the stream from its view's master; a master takes joins, acks and
needs only of its current epoch. A deposed master therefore commits nothing that needs a
follower; one whose in-sync set is itself alone commits only while its liveness lease holds.

The adapters (services/partition/peers.py) feed inputs in and carry `ready()` out: gRPC
streams between nodes, the follower's Redis writes, the master's snapshot reads, proposals to
the membership agent. Tests drive this class directly over an in-memory network
(tests/unit/test_replication_scenarios.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import ClusterProtocol
from services.partition.replication_follower import FollowerSide
from services.partition.replication_log import (
    DEFAULT_LOG_ENTRIES,
    DEL,
    HDEL,
    HSET,
    NOWHERE,
    Entry,
    History,
    Op,
    Position,
    RecentLog,
    ReplicationLimits,
    history_of,
    on_history,
    op_size,
)
from services.partition.replication_master import MasterSide
from services.partition.replication_state import (
    Assignment,
    FollowedPartition,
    FollowerProgress,
    FollowerState,
    HandoverReady,
    InSync,
    InSyncChange,
    MasteredPartition,
    Persist,
    Ready,
    SnapshotRead,
    Stored,
)

# What the rest of the service and its tests import from here. The parts live in
# replication_log (the log's vocabulary), replication_state (what a node's replication holds),
# replication_master and replication_follower (the two sides of the Replicator).
__all__ = [
    "DEFAULT_LOG_ENTRIES",
    "DEL",
    "HDEL",
    "HSET",
    "NOWHERE",
    "Assignment",
    "Entry",
    "HandoverReady",
    "History",
    "InSyncChange",
    "Op",
    "Persist",
    "Position",
    "Ready",
    "ReplicationLimits",
    "Replicator",
    "SnapshotRead",
    "Stored",
    "history_of",
    "on_history",
    "op_size",
]


class Replicator(MasterSide, FollowerSide):
    """A node's replication of its partitions: the roles the view gives it, over the master
    side and the follower side; writes made durable here may settle deferred role changes."""

    # ----- roles -----------------------------------------------------------------------

    def set_protocol(self, protocol: ClusterProtocol) -> None:
        """What the cluster speaks by the view about to be set (before set_view): a follower
        of another release is a replica only in views that count it a member, and such a view
        turns off what it cannot read."""
        self.protocol = protocol

    def set_view(self, assignments: Mapping[int, Assignment], stored: Mapping[int, Stored]) -> None:
        """Take the roles the view gives this node. `stored` is what this node's store holds
        of the partitions it has no role in yet (position and history). A partition whose
        master or epoch changes starts afresh: a master that is deposed aborts its pending
        writes of the partition and follows; a follower that becomes master first makes
        durable what it received, then takes the new epoch from its position."""
        me = self.node_id
        held = set(self.mastered) | set(self.followed)
        for p in sorted(held | set(assignments)):
            a = assignments.get(p)
            if a is not None and me not in a.replicas:
                a = None
            if a is None and p not in held:
                continue
            if self._role_changes(p, a) and not self._settled(p):
                self._deferred[p] = a
                fd = self.followed.get(p)
                if fd is not None:
                    fd.accepting = False  # nothing more from the old master meanwhile
                continue
            self._deferred.pop(p, None)
            self._apply(p, a, stored.get(p, Stored()))
        self._advance()

    def _role_changes(self, p: int, a: Assignment | None) -> bool:
        m = self.mastered.get(p)
        if m is not None:
            return a is None or a.master != self.node_id or a.epoch != m.epoch
        fd = self.followed.get(p)
        if fd is not None:
            return a is None or a.master != fd.master or a.epoch != fd.epoch
        return a is not None

    def _settled(self, p: int) -> bool:
        """No write of p is on its way to this node's store."""
        m = self.mastered.get(p)
        if m is not None:
            return m.seq == m.durable
        fd = self.followed.get(p)
        return fd is None or fd.received == fd.durable

    def _apply_settled(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            if p in self._deferred and self._settled(p):
                self._apply(p, self._deferred.pop(p), Stored())

    def _apply(self, p: int, a: Assignment | None, stored: Stored) -> None:
        self._ready.relink = True
        if a is None:
            self._drop(p)
        elif a.master == self.node_id:
            self._take_master(p, a, stored)
        else:
            self._take_follower(p, a, stored)

    def _drop(self, p: int) -> None:
        if self.mastered.pop(p, None) is not None:
            self._ready.demoted.append(p)
        self.followed.pop(p, None)

    def _take_master(self, p: int, a: Assignment, stored: Stored) -> None:
        m = self.mastered.get(p)
        if m is not None and m.epoch == a.epoch:
            self._follow_view(m, a)
            return
        if m is not None:
            # Mastered at another epoch: a new tenure (writes pending at the old one abort).
            del self.mastered[p]
            self._ready.demoted.append(p)
            position, history, log = (m.durable_epoch, m.durable), m.history, m.log
        else:
            fd = self.followed.get(p)
            if fd is not None:
                del self.followed[p]
                position, history, log = fd.durable, fd.history, fd.log
            else:
                position, history, log = (
                    stored.position,
                    history_of(stored.position, stored.history),
                    RecentLog(),
                )
                log.reset(position)
        if not history or history[-1][0] < a.epoch:
            history = (*history, (a.epoch, position[1] + 1))
        m = MasteredPartition(
            partition=p,
            epoch=a.epoch,
            seq=position[1],
            durable=position[1],
            durable_epoch=position[0],
            # Caught up "now": a follower has lag_ticks from the start of this tenure to join
            # and catch up before it counts as lagging (from 0 it would count as lagging on
            # the first tick, and every in-sync follower would be dropped at once: seed 2027).
            followers={
                n: FollowerProgress(n, down_since=self.now, caught_up_at=self.now)
                for n in a.replicas[1:]
            },
            history=history,
            log=log,
        )
        self.mastered[p] = m
        self._follow_view(m, a)
        self._ready.promoted.append(p)

    def _follow_view(self, m: MasteredPartition, a: Assignment) -> None:
        """The view's replicas, in-sync set and handover request for a partition mastered here."""
        m.replicated = len(a.replicas) > 1
        wanted = set(a.replicas[1:])
        for node, fp in list(m.followers.items()):
            if node in wanted:
                continue
            if fp.isr == InSync.ADDING:
                fp.departed = True  # counted until its change is settled
            elif fp.isr == InSync.REMOVING:
                # No replica in an agreed view, so in no in-sync set: the removal it asked for
                # holds already. Counted until the agent's answer came, it held every write of
                # the partition that long after a failover (3.4 s at load 38, issue 27); kept
                # (departed) until that answer, which then forgets it.
                fp.isr = InSync.OUT
                fp.departed = True
            else:
                del m.followers[node]
        for node in sorted(wanted):
            known = m.followers.get(node)
            fp = (
                known
                if known is not None
                else FollowerProgress(node, down_since=self.now, caught_up_at=self.now)
            )
            if known is None or known.departed:
                m.followers[node] = fp
                fp.departed = False
                if node in self.feeds:
                    # Its stream is open already: it joins on it when asked (it may not
                    # know yet that it follows this partition again).
                    self._out(node).append(
                        pb.ReplicationItem(
                            start=pb.FeedStart(partition=m.partition, epoch=m.epoch, rejoin=True)
                        )
                    )
            if node in a.in_sync:
                if fp.isr == InSync.OUT:
                    fp.isr = InSync.IN
            elif fp.isr == InSync.REMOVING:
                # Out of the agreed view's in-sync set: the removal holds (the answer to it
                # may come later).
                fp.isr = InSync.OUT
            elif fp.isr == InSync.IN:
                # Removed through the view: its node was lost, or this master took an older
                # view after its agent had confirmed the removal it asked for (seed 2027). A
                # follower that is caught up is asked back now: on a partition without writes
                # no acknowledgement would ever ask for it.
                fp.isr = InSync.OUT
                self._consider_adding(m, fp)
            if fp.state == FollowerState.WAITING and not fp.counted:
                self._start_snapshot(m, fp)
        if a.handover_to != m.handover_to:
            m.handover_to = a.handover_to
            m.handover_asked = False

    def _take_follower(self, p: int, a: Assignment, stored: Stored) -> None:
        fd = self.followed.get(p)
        if fd is not None and fd.master == a.master and fd.epoch == a.epoch:
            return
        m = self.mastered.pop(p, None)
        if m is not None:
            self._ready.demoted.append(p)
            position, history, log = (m.durable_epoch, m.durable), m.history, m.log
        elif fd is not None:
            position, history, log = fd.durable, fd.history, fd.log
        else:
            position, history, log = (
                stored.position,
                history_of(stored.position, stored.history),
                RecentLog(),
            )
            log.reset(position)
        new = FollowedPartition(p, a.master, a.epoch, history=history, log=log)
        new.received = new.durable = position
        new.loading = fd.loading if fd is not None else False
        self.followed[p] = new
        self._join(new)

    def masters_followed(self) -> set[str]:
        """The nodes this node needs a replication stream to."""
        return {fp.master for fp in self.followed.values()}

    # ----- writes made durable here (they may settle deferred role changes) ---------------

    def master_durable(
        self, entries: Sequence[Entry], token: object, aborted: frozenset[int] = frozenset()
    ) -> None:
        """`entries` (from `propose`, in order) are durable here: stream them to followers and
        release `token` once every counted follower has them."""
        parts: dict[int, tuple[int, int]] = {}
        now = self.now
        for e in entries:
            parts[e.partition] = (e.epoch, e.seq)
            m = self.mastered.get(e.partition)
            if m is None or m.epoch != e.epoch:
                continue  # the partition moved while the batch was being written
            for fp in m.followers.values():
                if fp.acked >= m.durable:
                    fp.caught_up_at = now
            m.durable = e.seq
            m.durable_epoch = e.epoch
            m.log.append(e, self.limits, self._pinned(m))
            for fp in m.followers.values():
                if fp.state in (FollowerState.LOG, FollowerState.LIVE):
                    self._send(m, fp)
        self._pending.append((token, parts, aborted))
        if self._deferred:
            self._apply_settled([p for p in parts if p in self._deferred])
        self._advance()

    def follower_durable(self, persist_id: int) -> None:
        persist = self._persisting.pop(persist_id)
        for p, (epoch, seq) in persist.positions.items():
            fd = self.followed.get(p)
            if fd is None:
                continue
            fd.durable = (epoch, seq)
            if fd.accepting:
                frame = self._to_master(fd.master)
                frame.acks.append(
                    pb.PartitionPosition(partition=p, epoch=epoch, seq=seq, leader_epoch=fd.epoch)
                )
            elif not fd.joined_at and fd.received == fd.durable and p not in self._deferred:
                self._join(fd)  # a join waiting for these writes
        if self._deferred:
            self._apply_settled([p for p in persist.positions if p in self._deferred])
        self._advance()

    # ----- time and output ---------------------------------------------------------------

    def tick(self) -> None:
        self.now += 1
        now, limits = self.now, self.limits
        for m in self.mastered.values():
            for fp in m.followers.values():
                if fp.isr not in (InSync.IN, InSync.ADDING):
                    continue
                grace = limits.down_ticks if fp.joined else limits.lag_ticks
                down = fp.state == FollowerState.DOWN and now - fp.down_since >= grace
                lagging = fp.acked < m.durable and now - fp.caught_up_at > limits.lag_ticks
                if down or lagging:
                    self._ask_removal(m, fp)
        retry = limits.need_retry_ticks
        for fd in self.followed.values():
            if fd.master not in self.links:
                continue
            if fd.need and now - fd.need_at >= retry:
                fd.need_at = now
                self._need(fd)
            elif (
                not fd.accepting
                and fd.partition not in self._deferred
                and (not fd.joined_at or now - fd.joined_at >= retry)
            ):
                self._join(fd)

    def ready(self) -> Ready:
        """What to send, persist, read, release and ask for now; each call hands it over once."""
        ready, self._ready = self._ready, Ready()
        return ready

    def position(self, p: int) -> Position:
        m = self.mastered.get(p)
        if m is not None:
            return (m.durable_epoch, m.durable)
        fd = self.followed.get(p)
        return fd.received if fd is not None else NOWHERE
