"""A partition node's $SYS figures: its own counters, and the last counters of its node's edges.

Every $SYS interval each edge sends its counters to its own node's partition service
(NodeStatsQuery with `report`) and gets the node's figures back; the edge publishing the
cluster totals asks every node the same question. Keeping each edge's report here, for as long
as that edge's link is open, makes one answer from one process carry all of a node's figures,
and an edge that is gone stops counting at once (see services/edge/systopics.py). A node may
run several edges (--edge-id): their reports are added up. Only an edge of this node reports
(an edge sends `report` to its own node's partition service only; a standalone edge, whose
id is no member's, to none).
"""

from __future__ import annotations

from collections.abc import Mapping

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.links import EdgeLink

# Figures that are not added up over a node's edges: the node's uptime is its oldest edge's.
LONGEST = frozenset({"uptime"})


class NodeStatsBoard:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        # Each reporting edge's link: its last counters and when they came (unix ms, the
        # handler's `now`).
        self._reports: dict[EdgeLink, tuple[dict[str, int], int]] = {}

    def answer(
        self, link: EdgeLink, query: pb.NodeStatsQuery, own: Mapping[str, int], now: int
    ) -> pb.NodeStats:
        """Keep the report if the query carries one; the node's figures at `now` (unix ms):
        `own` (the partition service's counters) and the sum of its edges' last reports, aged
        by the newest of them."""
        if query.report:
            self._reports[link] = (dict(query.edge_counters), now)
        stats = pb.NodeStats()
        if self._reports:
            for counters, _at in self._reports.values():
                for key, value in counters.items():
                    held = stats.counters[key]
                    stats.counters[key] = max(held, value) if key in LONGEST else held + value
            stats.edge_reported = True
            newest = max(at for _counters, at in self._reports.values())
            stats.edge_report_age_ms = max(0, now - newest)
        stats.counters.update(own)
        return stats

    def link_closed(self, link: EdgeLink) -> None:
        """An edge's link closed: its figures no longer describe a live edge."""
        self._reports.pop(link, None)
