"""Subscriptions at the partition master: SUBSCRIBE and UNSUBSCRIBE of its sessions, and the
subscription index the edges route by (which partitions hold which filters, and which hold
online members of a shared group), sent to every edge as it changes. A SUBACK that adds a
filter to the index waits until every edge routes by it (IndexBarrier).

Owns the state's `index` part (services/partition/state.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.topics import SHARED_PREFIX
from services.partition.effects import AfterIndexed, Send, SendToAll
from services.partition.fencing import live_session, reply, result
from services.partition.links import EdgeLink
from services.partition.sessions import Session
from services.partition.state import PartitionState

MAX_QOS = 2
GRANTED = (
    pb.FILTER_OUTCOME_GRANTED_QOS_0,
    pb.FILTER_OUTCOME_GRANTED_QOS_1,
    pb.FILTER_OUTCOME_GRANTED_QOS_2,
)


def subscribe(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.subscribe
    session = live_session(state, link, cmd, req.client_id, req.connection_id)
    if session is None:
        return
    batch = state.commit.batch
    barrier = state.index.barrier
    outcomes: list[pb.FilterOutcome.ValueType] = []
    existed = []
    announced = barrier.seq
    most = state.delivery.limits.max_subscriptions
    for spec in req.subscriptions:
        had = spec.filter in session.subscriptions
        existed.append(had)
        if not had and len(session.subscriptions) >= most:
            # --max-subscriptions: this filter only (a replaced one is no new one).
            state.delivery.limit_counts.subscriptions += 1
            outcomes.append(pb.FILTER_OUTCOME_SUBSCRIPTION_LIMIT)
            continue
        granted = pb.SubscriptionSpec()
        granted.CopyFrom(spec)
        granted.qos = min(spec.qos, MAX_QOS)
        add_subscription(state, session, granted, announce=True)
        batch.put_subscription(session.partition, session.client_id, granted)
        outcomes.append(GRANTED[granted.qos])
    if barrier.seq == announced:
        reply(state, link, cmd, filter_outcomes=outcomes, existed=existed)
        return
    # A filter new to the edges' index: SUBACK once every edge routes by it.
    event = result(cmd.request_id, filter_outcomes=outcomes, existed=existed)
    state.commit.after(AfterIndexed(link, event, barrier.seq))


def index_ack(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    state.index.barrier.acked(link, cmd.index_ack.seq)


def unsubscribe(state: PartitionState, link: EdgeLink, cmd: pb.EdgeCommand, now: int) -> None:
    req = cmd.unsubscribe
    session = live_session(state, link, cmd, req.client_id, req.connection_id)
    if session is None:
        return
    outcomes = []
    removed = []
    for filt in req.filters:
        if remove_subscription(state, session, filt):
            outcomes.append(pb.FILTER_OUTCOME_REMOVED)
            removed.append(filt)
        else:
            outcomes.append(pb.FILTER_OUTCOME_NOT_SUBSCRIBED)
    state.commit.batch.delete_subscriptions(session.partition, session.client_id, removed)
    reply(state, link, cmd, filter_outcomes=outcomes)


def add_subscription(
    state: PartitionState, session: Session, spec: pb.SubscriptionSpec, *, announce: bool
) -> None:
    filt = spec.filter
    new = filt not in session.subscriptions
    session.subscriptions[filt] = spec
    if filt.startswith(SHARED_PREFIX):
        entry = state.index.shared.join(session, filt)
        if entry is not None and announce:
            _announce(state, [entry])
        return
    if new:
        _index_ref(state, session.partition, filt, +1, announce)
    state.index.trie.add(filt, session.client_id, spec)


def remove_subscription(state: PartitionState, session: Session, filt: str) -> bool:
    if session.subscriptions.pop(filt, None) is None:
        return False
    if filt.startswith(SHARED_PREFIX):
        entry = state.index.shared.leave(session, filt)
        if entry is not None:
            _announce(state, [entry])
        return True
    state.index.trie.remove(filt, session.client_id)
    _index_ref(state, session.partition, filt, -1, True)
    return True


def presence(state: PartitionState, session: Session) -> None:
    """After a session's connection came or went: edges hear which partitions now have (or no
    longer have) online members of its shared subscription groups."""
    if session.shared:
        entries = state.index.shared.presence(session)
        if entries:
            _announce(state, entries)


def index_entries(state: PartitionState, partitions: Iterable[int]) -> list[pb.IndexEntry]:
    """Everything these partitions tell the edges' index, at their epochs here."""
    wanted = set(partitions)
    entries = [
        pb.IndexEntry(partition=p, filter=f, present=True)
        for (p, f) in state.index.refs
        if p in wanted
    ]
    entries += state.index.shared.entries(wanted)
    _stamp(state, entries)
    return entries


def index_snapshot(state: PartitionState, link: EdgeLink) -> None:
    """A new link's routing index for the partitions mastered here: reset each (at its epoch),
    snapshot, done."""
    mastered = state.roles.mastered
    entries = index_entries(state, mastered)
    chunk = 4096
    resets = [pb.PartitionEpoch(partition=p, epoch=e) for p, e in sorted(mastered.items())]
    out = state.outbox
    out.append(_update(link, pb.IndexUpdate(reset_partitions=resets)))
    for i in range(0, len(entries), chunk):
        out.append(_update(link, pb.IndexUpdate(entries=entries[i : i + chunk])))
    out.append(_update(link, pb.IndexUpdate(snapshot_done=True, seq=state.index.barrier.seq)))


def announce_partitions(state: PartitionState, partitions: Iterable[int]) -> None:
    """Tell every edge what these partitions hold, from scratch, at their epochs."""
    mastered = state.roles.mastered
    update = pb.IndexUpdate(
        reset_partitions=[pb.PartitionEpoch(partition=p, epoch=mastered[p]) for p in partitions],
        entries=index_entries(state, partitions),
        # The whole of each partition's index is in this update: edges stop routing by what
        # they knew of these partitions before.
        snapshot_done=True,
        seq=state.index.barrier.next_seq(),
    )
    _to_all(state, pb.PartitionEvent(index_update=update))


def _update(link: EdgeLink, update: pb.IndexUpdate) -> Send:
    return Send(link, pb.PartitionEvent(index_update=update))


def _to_all(state: PartitionState, event: pb.PartitionEvent) -> None:
    state.outbox.append(SendToAll(tuple(state.conns.links.values()), event))


def _stamp(state: PartitionState, entries: Iterable[pb.IndexEntry]) -> None:
    """Each entry carries its partition's epoch (edges keep the newest master's word)."""
    mastered = state.roles.mastered
    for entry in entries:
        entry.epoch = mastered.get(entry.partition, 0)


def _announce(state: PartitionState, entries: list[pb.IndexEntry]) -> None:
    """Sent to every edge right away, ahead of the SUBACK that follows the commit, so the
    subscriber's own edge routes by it before its client hears the subscription holds."""
    _stamp(state, entries)
    seq = state.index.barrier.next_seq()
    event = pb.PartitionEvent(index_update=pb.IndexUpdate(entries=entries, seq=seq))
    _to_all(state, event)


def _index_ref(state: PartitionState, p: int, filt: str, delta: int, announce: bool) -> None:
    refs = state.index.refs
    key = (p, filt)
    count = refs.get(key, 0) + delta
    if count > 0:
        refs[key] = count
    else:
        refs.pop(key, None)
    if announce and (count == 0 or (count == 1 and delta > 0)):
        _announce(state, [pb.IndexEntry(partition=p, filter=filt, present=count > 0)])
