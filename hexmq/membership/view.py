"""What an agreed view says, read the same way by every service: a partition's master, the
partitions' health, whether a node has left. Pure functions of the view (membership.proto's
View and PartitionAssignment)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from hexmq.api.membership.v1 import membership_pb2 as pb


class Placed(Protocol):
    """A partition's entry in a view: pb.PartitionAssignment, or a core's own copy of one."""

    @property
    def replicas(self) -> Sequence[str]: ...


def master_of(assignment: Placed) -> str:
    """A partition's master: the first of its replicas (DESIGN.md, "Keys, partitions,
    hashring"); "" while the view names none."""
    return assignment.replicas[0] if assignment.replicas else ""


@dataclass(frozen=True, slots=True)
class PartitionHealth:
    # Partitions whose master is not a member: no in-sync replica is alive.
    offline: int
    # Partitions with fewer in-sync replicas than the view's replication factor.
    under_replicated: int
    # Partitions being rebalanced: a replica catching up, a handover asked for, or a replica
    # on a leaving node (docs/failover.md, "Join" and "Leave").
    moving: int = 0


def partition_health(view: pb.View) -> PartitionHealth:
    members = {m.node_id for m in view.members}
    leaving = set(view.leaving)
    offline = under = moving = 0
    for pa in view.partitions:
        if master_of(pa) not in members:
            offline += 1
        if len(pa.in_sync) < view.replication_factor:
            under += 1
        if is_moving(pa, leaving):
            moving += 1
    return PartitionHealth(offline, under, moving)


def is_moving(pa: pb.PartitionAssignment, leaving: set[str]) -> bool:
    return (
        len(pa.in_sync) < len(pa.replicas)
        or bool(pa.handover_to)
        or any(r in leaving for r in pa.replicas)
    )


def has_left(view: pb.View, node: str) -> bool:
    """`node` is neither a member nor a target member of `view`, and no partition holds it: a
    leave is done (its services may stop, nothing is lost with them)."""
    return (
        node not in {m.node_id for m in view.members}
        and node not in view.target_members
        and not any(node in pa.replicas for pa in view.partitions)
    )
