"""Router: where a session lives and which partition masters a publish must reach.

The subscription index (filter -> partitions with subscribers) is fed by every partition node
over its link; a publish goes only to the partitions whose filters match, one command per master
node carrying all of that node's target partitions.

Shared subscriptions are in the index under their full "$share/{ShareName}/{filter}" text,
matched by their inner filter, with whether the partition has an online member of the group.
A route keeps, per matching group, the partitions holding members (its candidates); each
message then goes to one candidate per group, in turn (online members first), which is told in
its PartitionTarget to serve the group. Routes are cached per topic with their candidates, so a
cached route never pins a group's messages to one partition. A QoS 2 routing places each group
by its claim's origin id instead of in turn, so that a retried routing of the claim picks the
partition the first attempt picked (while the group's partitions and their state are the same).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.hashring import partition_of
from hexmq.topics import SHARED_PREFIX, TopicTrie
from services.edge.links import PartitionLink, ResultCallback

ROUTE_CACHE_LIMIT = 100_000
# Round-robin positions kept for this many shared groups at most (then they start over).
SHARED_TURNS_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class SessionRoute:
    partition: int
    epoch: int
    link: PartitionLink

    def _address(self, cmd: pb.EdgeCommand) -> pb.EdgeCommand:
        # The master refuses a command for an epoch the partition has left (fencing).
        cmd.partition = self.partition
        cmd.partition_epoch = self.epoch
        return cmd

    def request(self, cmd: pb.EdgeCommand, callback: ResultCallback) -> None:
        """Send `cmd` to the partition's master, addressed to the partition at this epoch."""
        self.link.request(self._address(cmd), callback)

    def send(self, cmd: pb.EdgeCommand, *, urgent: bool = False) -> bool:
        """As `request`, without wanting a result (PartitionLink.send)."""
        return self.link.send(self._address(cmd), urgent=urgent)


@dataclass(frozen=True, slots=True)
class SharedCandidate:
    """A partition holding members of a shared group, as a route keeps it."""

    partition: int
    epoch: int
    node_id: str
    link: PartitionLink
    # Some member of the group in this partition is connected.
    online: bool


@dataclass(frozen=True, slots=True)
class SharedRoute:
    """A shared group matching the topic, and the partitions holding its members (by
    partition number)."""

    group: str
    candidates: tuple[SharedCandidate, ...]


@dataclass(frozen=True, slots=True)
class PublishRoute:
    # (link, that node's target partitions); empty when nothing subscribes.
    targets: tuple[tuple[PartitionLink, tuple[pb.PartitionTarget, ...]], ...]
    # False while some partition node's index has never arrived (its link has not been up since
    # this edge started): a QoS >= 1 publish must then be refused, since subscribers there might
    # be missed. A node whose link went down keeps its last index: a publish it matches fails
    # (its link refuses at once) while publishes for other nodes' partitions go on.
    complete: bool
    # Cached routes only: the shared groups still to be placed (one partition each, chosen per
    # message by Router.route_publish). The routes route_publish returns have none left.
    shared: tuple[SharedRoute, ...] = ()


class Router:
    def __init__(self) -> None:
        self.view: mpb.View | None = None
        self.links: dict[str, PartitionLink] = {}
        # (filter, partition) -> for shared filters, whether the partition has an online
        # member of the group (False for the others).
        self._index: TopicTrie[int, bool] = TopicTrie()
        self._index_by_node: dict[str, set[tuple[int, str]]] = {}
        # Nodes whose full index snapshot has arrived at least once.
        self._indexed: set[str] = set()
        self._cache: dict[str, PublishRoute] = {}
        # Shared group -> where its next round-robin turn starts among its candidates.
        self._turns: dict[str, int] = {}

    def set_view(self, view: mpb.View) -> None:
        self.view = view
        self._cache.clear()

    def session_route(self, client_id: str) -> SessionRoute:
        view = self.view
        assert view is not None
        return self.partition_route(partition_of(client_id, view.partition_count))

    def partition_route(self, p: int) -> SessionRoute:
        """The master of partition p, by the view."""
        view = self.view
        assert view is not None
        assignment = view.partitions[p]
        return SessionRoute(p, assignment.epoch, self.links[assignment.replicas[0]])

    @property
    def index_complete(self) -> bool:
        """Every partition node's index has arrived at least once (see PublishRoute)."""
        return all(n in self._indexed for n in self.links)

    def retained_route(self, topic: str) -> tuple[PartitionLink, pb.PartitionTarget]:
        """Where the topic's retained message lives: the master of partition(topic)."""
        route = self.session_route(topic)  # the same keyed placement, keyed by the topic
        return route.link, pb.PartitionTarget(partition=route.partition, epoch=route.epoch)

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
        for filt, p, online in self._index.match(topic):
            if filt.startswith(SHARED_PREFIX):
                if groups is None:
                    groups = {}
                groups.setdefault(filt, []).append(self._candidate(view, p, online))
                continue
            if p in seen:
                continue
            seen.add(p)
            assignment = view.partitions[p]
            by_node.setdefault(assignment.replicas[0], []).append(
                pb.PartitionTarget(partition=p, epoch=assignment.epoch)
            )
        shared: tuple[SharedRoute, ...] = ()
        if groups:
            shared = tuple(
                SharedRoute(group, tuple(sorted(cands, key=lambda c: c.partition)))
                for group, cands in sorted(groups.items())
            )
        return PublishRoute(
            targets=tuple((self.links[n], tuple(t)) for n, t in sorted(by_node.items())),
            complete=self.index_complete,
            shared=shared,
        )

    def _candidate(self, view: mpb.View, p: int, online: bool) -> SharedCandidate:
        assignment = view.partitions[p]
        master = assignment.replicas[0]
        return SharedCandidate(p, assignment.epoch, master, self.links[master], online)

    def shared_candidate(self, group: str, *, exclude: int) -> SharedCandidate | None:
        """The partition, other than `exclude`, that gets a shared group's messages handed
        over from a member there (services/edge/handoff.py): chosen as for a publish, in turn,
        online members and a working link first. None: no other partition holds members."""
        view = self.view
        assert view is not None
        candidates = sorted(
            (
                self._candidate(view, p, online)
                for p, online in self._index.entries_of(group)
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
        by_node: dict[str, tuple[PartitionLink, list[pb.PartitionTarget]]] = {
            link.node_id: (link, list(targets)) for link, targets in route.targets
        }
        for candidate, groups in chosen.values():
            _, targets = by_node.setdefault(candidate.node_id, (candidate.link, []))
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
            targets=tuple((link, tuple(t)) for _, (link, t) in sorted(by_node.items())),
            complete=route.complete,
        )

    def _pick(self, shared: SharedRoute, key: bytes) -> SharedCandidate:
        """Round robin over the group's partitions that have an online member and a working
        link to their master; else over those with a working link (the message is queued for
        an offline member there); else the next one (whose link refuses the publish). With a
        key the search starts where the key says (a stable hash: every edge agrees) and the
        turn is left alone."""
        candidates = shared.candidates
        n = len(candidates)
        if key:
            start = (int.from_bytes(key[:8], "big") ^ zlib.crc32(shared.group.encode())) % n
        else:
            start = self._turns.get(shared.group, 0) % n
        reachable = -1
        for k in range(n):
            i = (start + k) % n
            candidate = candidates[i]
            if candidate.link.connected:
                if candidate.online:
                    break
                if reachable < 0:
                    reachable = i
        else:
            i = reachable if reachable >= 0 else start
        if key:
            return candidates[i]
        if len(self._turns) >= SHARED_TURNS_LIMIT and shared.group not in self._turns:
            self._turns.clear()
        self._turns[shared.group] = i + 1
        return candidates[i]

    def apply_index_update(self, node_id: str, update: pb.IndexUpdate) -> None:
        self._cache.clear()
        mine = self._index_by_node.setdefault(node_id, set())
        if update.reset:
            self.drop_node_index(node_id)
            mine = self._index_by_node.setdefault(node_id, set())
        for entry in update.entries:
            key = (entry.partition, entry.filter)
            if entry.present:
                mine.add(key)
                self._index.add(entry.filter, entry.partition, entry.online)
            elif key in mine:
                mine.discard(key)
                self._index.remove(entry.filter, entry.partition)
        if update.snapshot_done:
            self._indexed.add(node_id)

    def node_down(self, node_id: str) -> None:
        """The node's link dropped. Its last index stays (see PublishRoute.complete); the
        reset that opens its next snapshot replaces it."""
        self._cache.clear()

    def drop_node_index(self, node_id: str) -> None:
        self._cache.clear()
        for p, filt in self._index_by_node.pop(node_id, set()):
            self._index.remove(filt, p)
