"""Router: where a session lives and which partition masters a publish must reach.

The subscription index (filter -> partitions with subscribers) is fed by every partition node
over its link; a publish goes only to the partitions whose filters match, one command per master
node carrying all of that node's target partitions.
"""

from __future__ import annotations

from dataclasses import dataclass

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.hashring import partition_of
from hexmq.topics import TopicTrie
from services.edge.links import PartitionLink

ROUTE_CACHE_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class SessionRoute:
    partition: int
    epoch: int
    link: PartitionLink


@dataclass(frozen=True, slots=True)
class PublishRoute:
    # (link, that node's target partitions); empty when nothing subscribes.
    targets: tuple[tuple[PartitionLink, tuple[pb.PartitionTarget, ...]], ...]
    # False while some partition node's index has never arrived (its link has not been up since
    # this edge started): a QoS >= 1 publish must then be refused, since subscribers there might
    # be missed. A node whose link went down keeps its last index: a publish it matches fails
    # (its link refuses at once) while publishes for other nodes' partitions go on.
    complete: bool


class Router:
    def __init__(self) -> None:
        self.view: mpb.View | None = None
        self.links: dict[str, PartitionLink] = {}
        self._index: TopicTrie[int, None] = TopicTrie()
        self._index_by_node: dict[str, set[tuple[int, str]]] = {}
        # Nodes whose full index snapshot has arrived at least once.
        self._indexed: set[str] = set()
        self._cache: dict[str, PublishRoute] = {}

    def set_view(self, view: mpb.View) -> None:
        self.view = view
        self._cache.clear()

    def session_route(self, client_id: str) -> SessionRoute:
        view = self.view
        assert view is not None
        p = partition_of(client_id, view.partition_count)
        assignment = view.partitions[p]
        return SessionRoute(p, assignment.epoch, self.links[assignment.replicas[0]])

    def retained_route(self, topic: str) -> tuple[PartitionLink, pb.PartitionTarget]:
        """Where the topic's retained message lives: the master of partition(topic)."""
        route = self.session_route(topic)  # the same keyed placement, keyed by the topic
        return route.link, pb.PartitionTarget(partition=route.partition, epoch=route.epoch)

    def route_publish(self, topic: str) -> PublishRoute:
        route = self._cache.get(topic)
        if route is not None:
            return route
        view = self.view
        assert view is not None
        by_node: dict[str, list[pb.PartitionTarget]] = {}
        seen: set[int] = set()
        for _filter, p, _ in self._index.match(topic):
            if p in seen:
                continue
            seen.add(p)
            assignment = view.partitions[p]
            by_node.setdefault(assignment.replicas[0], []).append(
                pb.PartitionTarget(partition=p, epoch=assignment.epoch)
            )
        route = PublishRoute(
            targets=tuple((self.links[n], tuple(t)) for n, t in sorted(by_node.items())),
            complete=all(n in self._indexed for n in self.links),
        )
        if route.complete:
            if len(self._cache) >= ROUTE_CACHE_LIMIT:
                self._cache.clear()
            self._cache[topic] = route
        return route

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
                self._index.add(entry.filter, entry.partition, None)
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
