"""Router: where a session lives and which partition masters a publish must reach.

The subscription index (filter -> partitions with subscribers, services/edge/
subscription_index.py) is fed by every partition node over its link; a publish goes only to the
partitions whose filters match, one command per master node (by the view) carrying all of that
node's target partitions. Whether and when each command can go is services/edge/hold.py's
business: the router only says where, by the edge's current view.

Shared subscriptions are in the index under their full "$share/{ShareName}/{filter}" text,
matched by their inner filter, with whether the partition has an online member of the group.
A route keeps, per matching group, the partitions holding members (its candidates); each
message then goes to one candidate per group, in turn (online members first), which is told in
its PartitionTarget to serve the group. Routes are cached per topic with their candidates, so a
cached route never pins a group's messages to one partition. A QoS 2 routing places each group
by its claim's origin id instead of in turn, so that a retried routing of the claim picks the
partition the first attempt picked (while the group's partitions and their state are the same).

Besides the index, a route honours what this edge's own clients asked for and have not had
answered (services/edge/pending_subscriptions.py): the partition of a session whose SUBSCRIBE
is on its way is a target where its filters match, and a shared group's partition whose member
is unsubscribing is that group's last choice. So a publish this edge reads after a SUBSCRIBE
reaches it, as on a single broker.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.hashring import partition_of
from hexmq.membership.view import master_of
from hexmq.topics import SHARED_PREFIX
from services.edge.links import PartitionLink
from services.edge.pending_subscriptions import PendingSubscriptions
from services.edge.subscription_index import SubscriptionIndex

ROUTE_CACHE_LIMIT = 100_000
# Round-robin positions kept for this many shared groups at most (then they start over).
SHARED_TURNS_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class SharedCandidate:
    """A partition holding members of a shared group, as a route keeps it."""

    partition: int
    epoch: int
    node_id: str
    # Some member of the group in this partition is connected.
    online: bool
    # A member there is unsubscribing through this edge (maybe the last one): the last choice.
    leaving: bool = False


@dataclass(frozen=True, slots=True)
class SharedRoute:
    """A shared group matching the topic, and the partitions holding its members (by
    partition number)."""

    group: str
    candidates: tuple[SharedCandidate, ...]


@dataclass(frozen=True, slots=True)
class PublishRoute:
    # (master node id by the view, that node's target partitions); empty when nothing
    # subscribes.
    targets: tuple[tuple[str, tuple[pb.PartitionTarget, ...]], ...]
    # False while some partition's index has never arrived (no master of it has been linked
    # since this edge started): a QoS >= 1 publish then waits (services/edge/hold.py), since
    # subscribers there might be missed. A partition whose master is lost keeps its last index.
    complete: bool
    # Cached routes only: the shared groups still to be placed (one partition each, chosen per
    # message by Router.route_publish). The routes route_publish returns have none left.
    shared: tuple[SharedRoute, ...] = ()


class Router:
    def __init__(self) -> None:
        self.view: mpb.View | None = None
        self.links: dict[str, PartitionLink] = {}
        self.index = SubscriptionIndex()
        # SUBSCRIBEs and UNSUBSCRIBEs sent and not answered: a publish routed meanwhile
        # honours them (services/edge/pending_subscriptions.py).
        self.pending = PendingSubscriptions()
        self._cache: dict[str, PublishRoute] = {}
        # Shared group -> where its next round-robin turn starts among its candidates.
        self._turns: dict[str, int] = {}
        # Whether a partition takes commands now (services/edge/hold.py, set by the edge):
        # shared groups prefer partitions that do.
        self.partition_open: Callable[[int], bool] = lambda p: True

    def set_view(self, view: mpb.View) -> None:
        self.view = view
        self._cache.clear()

    def session_partition(self, client_id: str) -> int:
        """The partition of a session (and of a topic's retained message)."""
        view = self.view
        assert view is not None
        return partition_of(client_id, view.partition_count)

    def master(self, p: int) -> str:
        """Partition p's master by the view ("" if the view names none)."""
        view = self.view
        assert view is not None
        return master_of(view.partitions[p])

    @property
    def index_complete(self) -> bool:
        """Every partition's index has arrived at least once (see PublishRoute)."""
        view = self.view
        return view is not None and len(self.index.indexed) >= view.partition_count

    def retained_route(self, topic: str) -> tuple[str, pb.PartitionTarget]:
        """Where the topic's retained message lives: the master of partition(topic)."""
        view = self.view
        assert view is not None
        p = self.session_partition(topic)  # the same keyed placement, keyed by the topic
        return self.master(p), pb.PartitionTarget(partition=p, epoch=view.partitions[p].epoch)

    def route_publish(self, topic: str, key: bytes = b"") -> PublishRoute:
        """Where one message for `topic` goes. With shared groups matching, every call places
        each group anew (so call it once per message): in turn, or by `key` (a QoS 2 claim's
        origin id) when given, the same for every call with that key."""
        route = self._cache.get(topic)
        if route is None:
            route = self._route(topic)
            if route.complete:
                if len(self._cache) >= ROUTE_CACHE_LIMIT:
                    self._cache.clear()
                self._cache[topic] = route
        if route.shared:
            return self._place_shared(route, key)
        return route

    def _route(self, topic: str) -> PublishRoute:
        view = self.view
        assert view is not None
        by_node: dict[str, list[pb.PartitionTarget]] = {}
        seen: set[int] = set()
        groups: dict[str, list[SharedCandidate]] | None = None
        for filt, p, online in self.index.match(topic):
            if filt.startswith(SHARED_PREFIX):
                if groups is None:
                    groups = {}
                groups.setdefault(filt, []).append(self._candidate(view, p, online))
                continue
            if p in seen:
                continue
            seen.add(p)
            assignment = view.partitions[p]
            master = master_of(assignment)
            by_node.setdefault(master, []).append(
                pb.PartitionTarget(partition=p, epoch=assignment.epoch)
            )
        if self.pending:
            groups = self._add_pending(view, topic, by_node, seen, groups)
        shared: tuple[SharedRoute, ...] = ()
        if groups:
            shared = tuple(
                SharedRoute(group, tuple(sorted(cands, key=lambda c: c.partition)))
                for group, cands in sorted(groups.items())
            )
        return PublishRoute(
            targets=tuple((n, tuple(t)) for n, t in sorted(by_node.items())),
            complete=self.index_complete,
            shared=shared,
        )

    def _candidate(
        self, view: mpb.View, p: int, online: bool, *, leaving: bool = False
    ) -> SharedCandidate:
        assignment = view.partitions[p]
        master = master_of(assignment)
        return SharedCandidate(p, assignment.epoch, master, online, leaving)

    def _add_pending(
        self,
        view: mpb.View,
        topic: str,
        by_node: dict[str, list[pb.PartitionTarget]],
        seen: set[int],
        groups: dict[str, list[SharedCandidate]] | None,
    ) -> dict[str, list[SharedCandidate]] | None:
        """What the index does not know yet (services/edge/pending_subscriptions.py): the
        partitions of sessions subscribing through this edge become targets (shared groups:
        candidates with an online member, the subscriber), and shared-group partitions whose
        member is unsubscribing through this edge become their group's last choice."""
        pending = self.pending
        for filt, p in pending.matching(topic):
            if filt.startswith(SHARED_PREFIX):
                if groups is None:
                    groups = {}
                cands = groups.setdefault(filt, [])
                cands[:] = [c for c in cands if c.partition != p]
                cands.append(self._candidate(view, p, True))
                continue
            if p in seen:
                continue
            seen.add(p)
            assignment = view.partitions[p]
            master = master_of(assignment)
            by_node.setdefault(master, []).append(
                pb.PartitionTarget(partition=p, epoch=assignment.epoch)
            )
        if groups:
            for group, cands in groups.items():
                cands[:] = [
                    self._candidate(view, c.partition, c.online, leaving=True)
                    if pending.leaving(group, c.partition)
                    else c
                    for c in cands
                ]
        return groups

    def shared_candidate(self, group: str, *, exclude: int) -> SharedCandidate | None:
        """The partition, other than `exclude`, that gets a shared group's messages handed
        over from a member there (services/edge/handoff.py): chosen as for a publish, in turn,
        online members and open partitions first. None: no other partition holds members."""
        view = self.view
        assert view is not None
        candidates = sorted(
            (
                self._candidate(view, p, online)
                for p, online in self.index.entries_of(group)
                if p != exclude
            ),
            key=lambda c: c.partition,
        )
        if not candidates:
            return None
        return self._pick(SharedRoute(group, tuple(candidates)), b"")

    def _place_shared(self, route: PublishRoute, key: bytes) -> PublishRoute:
        """One partition per shared group for this message, named in its PartitionTarget."""
        chosen: dict[int, tuple[SharedCandidate, list[str]]] = {}
        for shared in route.shared:
            candidate = self._pick(shared, key)
            entry = chosen.get(candidate.partition)
            if entry is None:
                chosen[candidate.partition] = (candidate, [shared.group])
            else:
                entry[1].append(shared.group)
        by_node: dict[str, list[pb.PartitionTarget]] = {
            node: list(targets) for node, targets in route.targets
        }
        for candidate, groups in chosen.values():
            targets = by_node.setdefault(candidate.node_id, [])
            target = pb.PartitionTarget(
                partition=candidate.partition, epoch=candidate.epoch, shared=groups
            )
            for i, existing in enumerate(targets):
                if existing.partition == candidate.partition:
                    targets[i] = target  # the cached target is shared by every message: replaced
                    break
            else:
                targets.append(target)
        return PublishRoute(
            targets=tuple((node, tuple(t)) for node, t in sorted(by_node.items())),
            complete=route.complete,
        )

    def _pick(self, shared: SharedRoute, key: bytes) -> SharedCandidate:
        """Round robin over the group's partitions that have an online member and take
        commands now; else over those that take commands (the message is queued for an offline
        member there); else the next one (where the publish is held). With a key the search
        starts where the key says (a stable hash: every edge agrees) and the turn is left
        alone."""
        candidates = shared.candidates
        n = len(candidates)
        if key:
            start = (int.from_bytes(key[:8], "big") ^ zlib.crc32(shared.group.encode())) % n
        else:
            start = self._turns.get(shared.group, 0) % n
        reachable = -1
        # The first candidate whose member is not leaving (see SharedCandidate.leaving).
        staying = -1
        partition_open = self.partition_open
        for k in range(n):
            i = (start + k) % n
            candidate = candidates[i]
            if candidate.leaving:
                continue
            if staying < 0:
                staying = i
            if partition_open(candidate.partition):
                if candidate.online:
                    break
                if reachable < 0:
                    reachable = i
        else:
            i = reachable if reachable >= 0 else staying if staying >= 0 else start
        if key:
            return candidates[i]
        if len(self._turns) >= SHARED_TURNS_LIMIT and shared.group not in self._turns:
            self._turns.clear()
        self._turns[shared.group] = i + 1
        return candidates[i]

    # ----- what this edge's clients asked for, not answered yet -------------------------------

    def subscribing(self, partition: int, filters: list[str]) -> None:
        """A SUBSCRIBE of a session of `partition` is on its way there: publishes routed from
        now on also go to that partition where these filters match."""
        self.pending.subscribing(partition, filters)
        self._cache.clear()

    def subscribed(self, partition: int, filters: list[str]) -> None:
        """Its answer came: the index routes by what the partition announced ahead of it."""
        self.pending.subscribed(partition, filters)
        self._cache.clear()

    def unsubscribing(self, partition: int, filters: list[str]) -> list[str]:
        """An UNSUBSCRIBE of a session of `partition` is on its way there; returns what
        `unsubscribed` is to be told when it is answered."""
        recorded = self.pending.unsubscribing(partition, filters)
        if recorded:
            self._cache.clear()
        return recorded

    def unsubscribed(self, partition: int, filters: list[str]) -> None:
        if filters:
            self.pending.unsubscribed(partition, filters)
            self._cache.clear()

    def routed_retained(self, message: cpb.Message) -> None:
        """A retained message this edge has just routed (PUBLISH with RETAIN, a will, $SYS):
        it reached every subscription pending here live (see PendingSubscriptions)."""
        if self.pending.watches:
            self.pending.routed_retained(message)

    def apply_index_update(self, node_id: str, update: pb.IndexUpdate) -> list[tuple[int, int]]:
        """An update from `node_id`'s link (SubscriptionIndex.apply): the (partition, epoch)
        pairs it showed newer than the view."""
        self._cache.clear()
        return self.index.apply(node_id, update, self.view)
