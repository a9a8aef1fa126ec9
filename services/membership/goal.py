"""A partition's goal placement (docs/failover.md, "Placement").

The goal order of partition p is `assign(target_members)[p]` (the balanced placement of the
nodes meant to be in the cluster) followed by p's ring preference list over every known node;
the goal is its first RF members. A target member that is lost is skipped, so its partitions'
goals move to the next node on the ring and come back when it returns.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.hashring import assign, ring_order

Orders = tuple[tuple[str, ...], ...]


@functools.lru_cache(maxsize=32)
def _orders(targets: tuple[str, ...], known: tuple[str, ...], partitions: int, rf: int) -> Orders:
    placed = assign(targets, partitions, rf)
    ring = ring_order(known, partitions)
    return tuple(tuple(dict.fromkeys(placed[p] + ring[p])) for p in range(partitions))


def goal_orders(targets: Iterable[str], members: Iterable[str], partitions: int, rf: int) -> Orders:
    """Every partition's goal order: its placement over `targets`, then the rest of the known
    nodes (targets and members) in ring order. Cached: it changes only with the targets."""
    target_set = set(targets)
    if not target_set:
        raise ValueError("goal placement needs at least one target member")
    known = tuple(sorted(target_set | set(members)))
    return _orders(tuple(sorted(target_set)), known, partitions, rf)


def goal(view: pb.View, p: int) -> list[str]:
    """The partition's goal replicas, goal master first (docs/failover.md, Placement); a
    leaving member is no goal replica."""
    if not 0 <= p < view.partition_count:
        raise ValueError(f"partition {p} outside 0..{view.partition_count - 1}")
    members = {m.node_id for m in view.members}
    orders = goal_orders(
        view.target_members, members, view.partition_count, view.replication_factor
    )
    eligible = members - set(view.leaving)
    return [n for n in orders[p] if n in eligible][: view.replication_factor]
