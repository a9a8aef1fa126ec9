"""A partition service's $SYS board: the reports of every edge of its node, added up."""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.links import EdgeLink
from services.partition.sysstats import NodeStatsBoard


def _report(**counters: int) -> pb.NodeStatsQuery:
    return pb.NodeStatsQuery(edge_counters=counters, report=True)


def test_the_reports_of_a_nodes_edges_are_added_up() -> None:
    board = NodeStatsBoard("n1")
    first, second = EdgeLink("n1", 1), EdgeLink("n1-e2", 2)
    board.answer(first, _report(uptime=100, connected=3), {"sessions": 7}, now=1_000)
    stats = board.answer(second, _report(uptime=40, connected=5), {"sessions": 7}, now=1_500)
    # The node's uptime is its oldest edge's; everything else is a sum.
    assert dict(stats.counters) == {"uptime": 100, "connected": 8, "sessions": 7}
    assert stats.edge_reported
    assert stats.edge_report_age_ms == 0
    # A question without a report (the cluster totals' edge asking) changes nothing.
    asked = board.answer(EdgeLink("n2", 3), pb.NodeStatsQuery(), {"sessions": 7}, now=2_000)
    assert dict(asked.counters) == dict(stats.counters)
    assert asked.edge_report_age_ms == 500


def test_an_edge_whose_link_closed_stops_counting() -> None:
    board = NodeStatsBoard("n1")
    first, second = EdgeLink("n1", 1), EdgeLink("n1-e2", 2)
    board.answer(first, _report(connected=3), {}, now=1_000)
    board.answer(second, _report(connected=5), {}, now=1_000)
    board.link_closed(first)
    stats = board.answer(second, pb.NodeStatsQuery(), {}, now=1_000)
    assert dict(stats.counters) == {"connected": 5}
    board.link_closed(second)
    stats = board.answer(second, pb.NodeStatsQuery(), {}, now=1_000)
    assert not stats.edge_reported
    assert dict(stats.counters) == {}


def test_a_new_report_of_an_edge_replaces_its_last() -> None:
    board = NodeStatsBoard("n1")
    link = EdgeLink("n1", 1)
    board.answer(link, _report(connected=3), {}, now=1_000)
    stats = board.answer(link, _report(connected=1), {}, now=2_000)
    assert dict(stats.counters) == {"connected": 1}
