"""Subscriptions at the partition master: SUBSCRIBE and UNSUBSCRIBE of its sessions, and the
subscription index the edges route by (which partitions hold which filters, and which hold
online members of a shared group), sent to every edge as it changes. A SUBACK that adds a
filter to the index waits until every edge routes by it (IndexBarrier).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.topics import SHARED_PREFIX
from services.partition.effects import AfterIndexed
from services.partition.index_barrier import IndexBarrier
from services.partition.links import EdgeLink
from services.partition.master_state import MasterState, _result
from services.partition.sessions import Session

if TYPE_CHECKING:
    from services.partition.delivery import LimitCounts, QueueLimits

MAX_QOS = 2
GRANTED = (
    pb.FILTER_OUTCOME_GRANTED_QOS_0,
    pb.FILTER_OUTCOME_GRANTED_QOS_1,
    pb.FILTER_OUTCOME_GRANTED_QOS_2,
)


class Subscriptions(MasterState):
    index_barrier: IndexBarrier
    index_refs: dict[tuple[int, str], int]
    limits: QueueLimits
    limit_counts: LimitCounts

    def _subscribe(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.subscribe
        session = self._live_session(link, cmd, req.client_id, req.connection_id)
        if session is None:
            return
        batch = self.commit.batch
        outcomes: list[pb.FilterOutcome.ValueType] = []
        existed = []
        announced = self.index_barrier.seq
        most = self.limits.max_subscriptions
        for spec in req.subscriptions:
            had = spec.filter in session.subscriptions
            existed.append(had)
            if not had and len(session.subscriptions) >= most:
                # --max-subscriptions: this filter only (a replaced one is no new one).
                self.limit_counts.subscriptions += 1
                outcomes.append(pb.FILTER_OUTCOME_SUBSCRIPTION_LIMIT)
                continue
            granted = pb.SubscriptionSpec()
            granted.CopyFrom(spec)
            granted.qos = min(spec.qos, MAX_QOS)
            self._add_subscription(session, granted, announce=True)
            batch.put_subscription(session.partition, session.client_id, granted)
            outcomes.append(GRANTED[granted.qos])
        if self.index_barrier.seq == announced:
            self._reply(link, cmd, filter_outcomes=outcomes, existed=existed)
            return
        # A filter new to the edges' index: SUBACK once every edge routes by it.
        event = _result(cmd.request_id, filter_outcomes=outcomes, existed=existed)
        self.commit.after(AfterIndexed(link, event, self.index_barrier.seq))

    def _index_ack(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        self.index_barrier.acked(link, cmd.index_ack.seq)

    def _unsubscribe(self, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
        req = cmd.unsubscribe
        session = self._live_session(link, cmd, req.client_id, req.connection_id)
        if session is None:
            return
        outcomes = []
        removed = []
        for filt in req.filters:
            if self._remove_subscription(session, filt):
                outcomes.append(pb.FILTER_OUTCOME_REMOVED)
                removed.append(filt)
            else:
                outcomes.append(pb.FILTER_OUTCOME_NOT_SUBSCRIBED)
        self.commit.batch.delete_subscriptions(session.partition, session.client_id, removed)
        self._reply(link, cmd, filter_outcomes=outcomes)

    def _add_subscription(
        self, session: Session, spec: pb.SubscriptionSpec, *, announce: bool
    ) -> None:
        filt = spec.filter
        new = filt not in session.subscriptions
        session.subscriptions[filt] = spec
        if filt.startswith(SHARED_PREFIX):
            entry = self.shared.join(session, filt)
            if entry is not None and announce:
                self._announce([entry])
            return
        if new:
            self._index_ref(session.partition, filt, +1, announce)
        self.trie.add(filt, session.client_id, spec)

    def _remove_subscription(self, session: Session, filt: str) -> bool:
        if session.subscriptions.pop(filt, None) is None:
            return False
        if filt.startswith(SHARED_PREFIX):
            entry = self.shared.leave(session, filt)
            if entry is not None:
                self._announce([entry])
            return True
        self.trie.remove(filt, session.client_id)
        self._index_ref(session.partition, filt, -1, True)
        return True

    def _presence(self, session: Session) -> None:
        """After a session's connection came or went: edges hear which partitions now have
        (or no longer have) online members of its shared subscription groups."""
        if session.shared:
            entries = self.shared.presence(session)
            if entries:
                self._announce(entries)

    def _index_entries(self, partitions: Iterable[int]) -> list[pb.IndexEntry]:
        """Everything these partitions tell the edges' index, at their epochs here."""
        wanted = set(partitions)
        entries = [
            pb.IndexEntry(partition=p, filter=f, present=True)
            for (p, f) in self.index_refs
            if p in wanted
        ]
        entries += self.shared.entries(wanted)
        self._stamp(entries)
        return entries

    def _stamp(self, entries: Iterable[pb.IndexEntry]) -> None:
        """Each entry carries its partition's epoch (edges keep the newest master's word)."""
        mastered = self.mastered
        for entry in entries:
            entry.epoch = mastered.get(entry.partition, 0)

    def _announce(self, entries: list[pb.IndexEntry]) -> None:
        """Sent to every edge right away, ahead of the SUBACK that follows the commit, so the
        subscriber's own edge routes by it before its client hears the subscription holds."""
        self._stamp(entries)
        seq = self.index_barrier.next_seq()
        event = pb.PartitionEvent(index_update=pb.IndexUpdate(entries=entries, seq=seq))
        for link in self.links.values():
            link.send(event)

    def _index_ref(self, p: int, filt: str, delta: int, announce: bool) -> None:
        key = (p, filt)
        count = self.index_refs.get(key, 0) + delta
        if count > 0:
            self.index_refs[key] = count
        else:
            self.index_refs.pop(key, None)
        if announce and (count == 0 or (count == 1 and delta > 0)):
            self._announce([pb.IndexEntry(partition=p, filter=filt, present=count > 0)])
