"""The partition service's periodic work beside the commands: the node's sweeps (`sweep`) and
the copy of its state into the gauges (`report_metrics`), each a task of main's serving loop."""

from __future__ import annotations

import asyncio
import logging

from hexmq import telemetry
from services.partition.commit_queue import CommitQueue
from services.partition.node import PartitionNode
from services.partition.replication import Replicator
from services.partition.replication_status import lag_by_follower
from services.partition.roles import WAIT_S

log = logging.getLogger("hexmq.partition")


async def sweep(node: PartitionNode) -> None:
    """Once a second: commands that waited too long, takeovers, expired sessions, wills and
    shared messages due, QoS 2 origin ids past their retention."""
    while True:
        await asyncio.sleep(1.0)
        waited = node.expire_waiting(node.monotonic())
        if waited:
            log.warning(
                "%d commands waited %.0f s for partitions this node was to serve; answered "
                "UNAVAILABLE (their edges ask again)",
                waited,
                WAIT_S,
            )
        now = node.clock()
        node.settle_takeovers(now)
        expired = node.expire_sessions(now)
        node.hand_out_wills(now)
        node.hand_out_shared(now)
        if expired:
            log.info("expired %d sessions", expired)
        swept = node.sweep_qos2_seen(now)
        if swept:
            log.info(
                "forgot %d QoS 2 origin ids after --qos2-dedupe-retention without a forget from "
                "their edge (a retry of those routings would be stored again)",
                swept,
            )


async def report_metrics(node: PartitionNode, queue: CommitQueue, replicator: Replicator) -> None:
    """Copy the node's state into its gauges once a second (nothing on the hot path)."""
    m = telemetry.METRICS
    queue_full = m.dropped_messages.labels("queue_full")
    reported = resent = 0
    limits_reported: dict[str, int] = {}
    while True:
        for key, count in node.limit_counts.counters().items():
            limit = key.removeprefix("limits/")
            delta = count - limits_reported.get(limit, 0)
            if delta:
                m.limit_refusals.labels(limit).inc(delta)
                limits_reported[limit] = count
        queue_full.inc(node.dropped_queue_full - reported)
        reported = node.dropped_queue_full
        m.resent_publishes.inc(node.resent_publishes - resent)
        resent = node.resent_publishes
        if node.view is not None:
            m.view_epoch.set(node.view.epoch)
        m.partition_roles.labels("master").set(len(node.mastered))
        m.partition_roles.labels("follower").set(len(replicator.followed))
        m.partition_roles.labels("catching_up").set(
            sum(1 for fd in replicator.followed.values() if fd.loading)
        )
        for follower, lag in lag_by_follower(replicator).items():
            m.replication_lag.labels(follower).set(lag)
        m.queue_depth.labels("queued_messages").set(node.queued_messages())
        m.queue_depth.labels("sessions").set(len(node.sessions))
        m.queue_depth.labels("storage_batch").set(queue.gathering)
        m.queue_depth.labels("qos2_seen").set(len(node.seen))
        await asyncio.sleep(1.0)
