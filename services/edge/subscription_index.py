"""SubscriptionIndex: which partitions hold subscriptions for which filters (shared ones under
their full "$share/{ShareName}/{filter}" text, with whether the partition has an online member
of the group), as the partition masters tell every edge over their links.

Kept per partition, with the epoch of the master that told it (IndexEntry.epoch), so that a
deposed master that comes back cannot undo what the new master announced
(docs/failover.md, "Subscription index"):

- IndexUpdate.reset_partitions (p, e) starts partition p's index anew at epoch e, if e is at
  least the epoch known for p; an older one is ignored. The entries that follow (in this and
  later updates of that link) are applied only at the partition's current epoch: an entry of a
  newer epoch implies a reset first, one of an older epoch is ignored.
- A reset does not empty the partition at once: the filters known before stay routed until the
  link's next `snapshot_done` (unless announced again, or removed), so that a publish routed
  while a snapshot is still arriving does not miss a subscriber. A publish sent to a partition
  with no matching subscription costs that partition nothing.
- A partition is *indexed* once a snapshot that reset it has ended (`snapshot_done` on the link
  of the node that set its epoch); the index is complete when every partition is indexed.
- A partition service that sends no reset_partitions (an older version) resets with the
  node-wide `reset`: that drops the partitions whose epoch that node last set. Its entries
  carry no epoch and count at the view's epoch of their partition, and its snapshot_done marks
  every partition the view has it master as indexed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.membership.view import master_of
from hexmq.topics import TopicTrie


@dataclass(slots=True)
class _PartitionIndex:
    epoch: int
    # The node whose reset set `epoch`.
    node: str
    # Filters announced at this epoch.
    filters: set[str] = field(default_factory=set)
    # Filters known before the last reset, still routed until that snapshot ends.
    carried: set[str] = field(default_factory=set)


class SubscriptionIndex:
    def __init__(self) -> None:
        # (filter, partition) -> for shared filters, whether the partition has an online member
        # of the group (False for the others).
        self._trie: TopicTrie[int, bool] = TopicTrie()
        self._parts: dict[int, _PartitionIndex] = {}
        # Per node: the partitions it reset whose snapshot has not ended yet.
        self._resetting: dict[str, set[int]] = {}
        # Nodes whose stream reset node-wide (an older partition service).
        self._node_wide: set[str] = set()
        self.indexed: set[int] = set()

    def match(self, topic: str) -> Iterator[tuple[str, int, bool]]:
        return self._trie.match(topic)

    def entries_of(self, filt: str) -> list[tuple[int, bool]]:
        return self._trie.entries_of(filt)

    def epoch(self, p: int) -> int | None:
        """The epoch of partition p's index (None: never told)."""
        part = self._parts.get(p)
        return part.epoch if part is not None else None

    def filters(self, p: int) -> set[str]:
        """The filters routed to partition p (announced or carried)."""
        part = self._parts.get(p)
        return part.filters | part.carried if part is not None else set()

    def apply(
        self, node: str, update: pb.IndexUpdate, view: mpb.View | None
    ) -> list[tuple[int, int]]:
        """Apply one update from `node`'s link. Returns the (partition, epoch) pairs it showed
        at an epoch newer than the view's: the partition is moving (services/edge/hold.py)."""
        newer: list[tuple[int, int]] = []

        def view_epoch(p: int) -> int:
            if view is None or p >= len(view.partitions):
                return 0
            return view.partitions[p].epoch

        if update.reset_partitions:
            self._node_wide.discard(node)
            for reset in update.reset_partitions:
                self._reset(node, reset.partition, reset.epoch)
                if reset.epoch > view_epoch(reset.partition):
                    newer.append((reset.partition, reset.epoch))
        elif update.reset:
            self._node_wide.add(node)
            for p, known in list(self._parts.items()):
                if known.node == node:
                    self._reset(node, p, known.epoch)
        trie = self._trie
        for entry in update.entries:
            p, filt = entry.partition, entry.filter
            epoch = entry.epoch or view_epoch(p)
            part = self._parts.get(p)
            if part is None or epoch > part.epoch:
                part = self._reset(node, p, epoch)
                if entry.epoch and epoch > view_epoch(p):
                    newer.append((p, epoch))
            elif epoch < part.epoch:
                continue  # from a master the partition has left
            if entry.present:
                part.filters.add(filt)
                part.carried.discard(filt)
                trie.add(filt, p, entry.online)
            else:
                part.filters.discard(filt)
                part.carried.discard(filt)
                trie.remove(filt, p)
        if update.snapshot_done:
            self._snapshot_done(node, view)
        return newer

    def _reset(self, node: str, p: int, epoch: int) -> _PartitionIndex:
        part = self._parts.get(p)
        if part is None:
            part = self._parts[p] = _PartitionIndex(epoch, node)
        elif epoch < part.epoch:
            return part
        else:
            part.carried |= part.filters
            part.filters = set()
            part.epoch = epoch
            part.node = node
        self._resetting.setdefault(node, set()).add(p)
        return part

    def _snapshot_done(self, node: str, view: mpb.View | None) -> None:
        if node in self._node_wide and view is not None:
            # An older partition service's snapshot covers every partition it masters, also
            # those without subscriptions (which it sends nothing for).
            for a in view.partitions:
                if master_of(a) == node:
                    part = self._parts.get(a.partition)
                    if part is None or part.epoch < a.epoch:
                        self._reset(node, a.partition, a.epoch)
        for p in self._resetting.pop(node, ()):
            part = self._parts[p]
            if part.node != node:
                continue  # reset again since, by a newer master: its snapshot ends it
            for filt in part.carried:
                self._trie.remove(filt, p)
            part.carried.clear()
            self.indexed.add(p)
