"""A partition node's $SYS figures: its own counters, and the last counters of its node's edge.

Every $SYS interval each edge sends its counters to its own node's partition service
(NodeStatsQuery with `report`) and gets the node's figures back; the edge publishing the
cluster totals asks every node the same question. Keeping the edge's report here, for as long
as that edge's link is open, makes one answer from one process carry all of a node's figures,
and a node whose edge is gone stops counting at once (see services/edge/systopics.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.links import EdgeLink


class NodeStatsBoard:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._report: dict[str, int] | None = None
        # When the last report came (unix ms, the handler's `now`).
        self._reported_at = 0
        self._reporter: EdgeLink | None = None

    def answer(
        self, link: EdgeLink, query: pb.NodeStatsQuery, own: Mapping[str, int], now: int
    ) -> pb.NodeStats:
        """Keep the report if it comes from this node's edge; the node's figures at `now` (unix
        ms): `own` (the partition service's counters) and the last report of its edge."""
        if query.report and link.edge_id == self.node_id:
            self._report = dict(query.edge_counters)
            self._reported_at = now
            self._reporter = link
        stats = pb.NodeStats()
        if self._report is not None:
            stats.counters.update(self._report)
            stats.edge_reported = True
            stats.edge_report_age_ms = max(0, now - self._reported_at)
        stats.counters.update(own)
        return stats

    def link_closed(self, link: EdgeLink) -> None:
        """The edge's link closed: its figures no longer describe a live edge."""
        if link is self._reporter:
            self._report = None
            self._reporter = None
