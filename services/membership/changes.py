"""What an agreed view change says, for operators: one log line, metrics, a span.

`describe` is pure (as is `partition_health`, hexmq/membership/view.py); `record_view_change`
applies them to the process's metrics and tracing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from opentelemetry.util.types import AttributeValue

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.membership.view import partition_health
from hexmq.node_protocol import ClusterProtocol
from hexmq.telemetry.tracing import Tracing

log = logging.getLogger("hexmq.membership")

# Failover records listed in full in one log line; past that, counted by kind.
_LOGGED_RECORDS = 8


class RebalanceLog:
    """The log lines at the start and end of each rebalance, as HiveMQ's "cluster
    replication" lines tell an operator when the next node may be rotated: a rebalance starts
    with the first view in which a partition is moving and ends with the first in which none
    is (every partition at its goal, all in sync)."""

    def __init__(self) -> None:
        self._started_ms: int | None = None
        self._first_epoch = 0
        self._peak = 0

    def observe(self, view: pb.View, now_ms: int) -> str | None:
        moving = partition_health(view).moving
        who = []
        if view.joining:
            who.append("joining " + ", ".join(view.joining))
        if view.leaving:
            who.append("leaving " + ", ".join(view.leaving))
        because = f" ({'; '.join(who)})" if who else ""
        if moving and self._started_ms is None:
            self._started_ms, self._first_epoch, self._peak = now_ms, view.epoch, moving
            return (
                f"rebalance started in view {view.epoch}: {moving} of {view.partition_count} "
                f"partitions moving{because}; do not stop another node until it has finished"
            )
        if moving:
            self._peak = max(self._peak, moving)
            return None
        if self._started_ms is None:
            return None
        took = (now_ms - self._started_ms) / 1000
        line = (
            f"rebalance finished in view {view.epoch} after {took:.1f}s (views "
            f"{self._first_epoch}-{view.epoch}, at most {self._peak} partitions moving): every "
            f"partition in sync at its placement; safe to stop or add the next node"
        )
        self._started_ms = None
        return line


def describe(old: pb.View | None, new: pb.View, records: Sequence[pb.FailoverRecord]) -> str:
    """'view 7 (was 6): members -n2 (n1, n3); failover p3 n2->n1 epoch 7, ...'."""
    if old is None:
        names = ", ".join(m.node_id for m in new.members)
        return (
            f"view {new.epoch}: first view, members {names}, {new.partition_count} partitions, "
            f"rf {new.replication_factor}"
        )
    parts = [f"view {new.epoch} (was {old.epoch})"]
    before = {m.node_id: m.incarnation for m in old.members}
    after = {m.node_id: m.incarnation for m in new.members}
    moved = [f"-{n}" for n in sorted(before.keys() - after.keys())]
    moved += [f"+{n}" for n in sorted(after.keys() - before.keys())]
    moved += [
        f"~{n} (incarnation {after[n]})"
        for n in sorted(before.keys() & after.keys())
        if before[n] != after[n]
    ]
    if moved:
        parts.append(f"members {' '.join(moved)} ({', '.join(sorted(after))})")
    shown = [
        f"{r.kind} p{r.partition} {r.from_node}->{r.to_node or '-'} epoch {r.epoch}"
        for r in records[:_LOGGED_RECORDS]
    ]
    if len(records) > _LOGGED_RECORDS:
        rest: dict[str, int] = {}
        for r in records[_LOGGED_RECORDS:]:
            rest[r.kind] = rest.get(r.kind, 0) + 1
        shown.append("and " + ", ".join(f"{n} more {k}" for k, n in sorted(rest.items())))
    if shown:
        parts.append(", ".join(shown))
    health = partition_health(new)
    parts.append(f"{health.offline} offline, {health.under_replicated} under-replicated")
    return "; ".join(parts)


def record_view_change(
    tracing: Tracing,
    node_id: str,
    old: pb.View | None,
    new: pb.View,
    records: Sequence[pb.FailoverRecord],
    began_ns: int = 0,
) -> None:
    """The log line, the metrics and the membership.view span of one agreed view change, as
    this agent saw it (every agent counts every change it sees). `began_ns`: when this agent
    first doubted a node the change removes (unix ns; 0: unknown, the span is an instant).

    The span names a lost node only when `new` directly follows `old`: an agent that missed
    views (cut off from Consul, paused) cannot tell which of them removed the node, and the
    Spark job's failover timeline would file the loss under the wrong view."""
    log.info("%s", describe(old, new, records))
    m = telemetry.METRICS
    m.view_epoch.set(new.epoch)
    m.view_changes.inc()
    for r in records:
        m.failovers.labels(r.kind).inc()
    health = partition_health(new)
    m.partitions_offline.set(health.offline)
    m.partitions_under_replicated.set(health.under_replicated)
    m.show_protocol(ClusterProtocol.of_view(new))
    m.partitions_moving.set(health.moving)
    attributes: dict[str, AttributeValue] = {
        telemetry.Attr.VIEW_EPOCH: new.epoch,
        telemetry.Attr.NODE: node_id,
        "hexmq.view.previous_epoch": old.epoch if old is not None else 0,
        "hexmq.view.members": len(new.members),
        "hexmq.view.failovers": sum(1 for r in records if r.kind == "failover"),
        "hexmq.view.handovers": sum(1 for r in records if r.kind == "handover"),
        "hexmq.view.partitions_offline": health.offline,
        "hexmq.view.partitions_under_replicated": health.under_replicated,
        "hexmq.view.partitions_moving": health.moving,
    }
    lost = sorted(
        {m.node_id for m in old.members} - {m.node_id for m in new.members}
        if old is not None and new.epoch == old.epoch + 1
        else set()
    )
    if lost:
        attributes[telemetry.Attr.NODE_LOST] = ",".join(lost)
    else:
        began_ns = 0  # no loss this agent can vouch for: the span is the installation
    # From the moment this agent first doubted a lost node (when it knows), to now: the span
    # the Spark job's failover timeline measures detection by.
    now_ns = time.time_ns()
    tracing.record(telemetry.SpanName.MEMBERSHIP_VIEW, began_ns or now_ns, now_ns, attributes)
