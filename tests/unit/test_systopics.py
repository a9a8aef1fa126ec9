"""The $SYS figures: a node's drops added up, the cluster totals, and how they are rendered."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import cast

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.config import EdgeConfig
from services.edge.stats import EdgeStats
from services.edge.systopics import SysEdge, SysTopics, cluster_values, node_values, render


def test_node_values_add_up_every_kind_of_drop() -> None:
    values = node_values(
        {
            "publish/dropped_qos0": 2,
            "publish/dropped_too_large": 3,
            "publish/dropped_queue_full": 5,
            "clients/connected": 1,
        }
    )
    assert values["publish/dropped"] == 10
    assert values["clients/connected"] == 1
    # Without the partition service's figures, the edge's drops alone.
    assert node_values({"publish/dropped_qos0": 4})["publish/dropped"] == 4


def test_cluster_values_sum_the_nodes_and_keep_the_oldest_uptime() -> None:
    nodes = [
        {"uptime": 30, "clients/connected": 2, "publish/dropped_queue_full": 3},
        {"uptime": 120, "clients/connected": 5, "publish/dropped_queue_full": 0},
    ]
    assert cluster_values(nodes, members=3) == {
        "uptime": 120,
        "clients/connected": 7,
        "publish/dropped_queue_full": 3,
        "nodes/alive": 2,
        "nodes/total": 3,
    }
    assert cluster_values([], members=2) == {"nodes/alive": 0, "nodes/total": 2}


def test_render_names_topics_under_the_prefix() -> None:
    assert render("$SYS/broker/cluster", {"uptime": 7, "clients/connected": 2}) == [
        ("$SYS/broker/cluster/clients/connected", b"2"),
        ("$SYS/broker/cluster/uptime", b"7 seconds"),
    ]


class _Link:
    """A partition link that records its requests."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.connected = True
        self.requests: list[pb.EdgeCommand] = []
        self.callbacks: list[Callable[[pb.Result], None]] = []

    def request(self, cmd: pb.EdgeCommand, callback: Callable[[pb.Result], None]) -> None:
        self.requests.append(cmd)
        self.callbacks.append(callback)


class _Published(SysTopics):
    def __init__(self, edge: SysEdge) -> None:
        super().__init__(edge, 1.0)
        self.published: list[tuple[str, bytes]] = []

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        self.published.extend(messages)


def _edge_of_node_1(edge_id: str) -> tuple[SysEdge, dict[str, _Link]]:
    links = {"n1": _Link("n1"), "n2": _Link("n2")}
    edge = SimpleNamespace(
        config=EdgeConfig(node_id="n1", host="h", port=1, membership="m:1", edge_id=edge_id),
        router=SimpleNamespace(view=mpb.View(epoch=1), links=links),
        dispatcher=None,
        stats=EdgeStats(),
        connected_clients=lambda: 4,
    )
    return cast(SysEdge, edge), links


def test_a_nodes_further_edge_reports_to_its_node_and_publishes_nothing() -> None:
    edge, links = _edge_of_node_1("n1-e2")
    sys_topics = _Published(edge)
    sys_topics.tick()
    [report] = links["n1"].requests
    assert report.node_stats.report
    assert report.node_stats.edge_counters["clients/connected"] == 4
    # Neither asks the other nodes for the cluster totals, though n1 is the lowest live node.
    assert links["n2"].requests == []
    links["n1"].connected = False
    sys_topics.tick()
    assert sys_topics.published == []


def test_a_nodes_first_edge_publishes_the_figures_of_all_its_edges() -> None:
    edge, links = _edge_of_node_1("")
    sys_topics = _Published(edge)
    sys_topics.tick()
    assert links["n1"].requests[0].node_stats.report
    assert len(links["n2"].requests) == 1  # the cluster totals' question
    # The partition service answers with its node's edges added up (this one's 4 and 6).
    answer = pb.Result(status=pb.StatusCode.STATUS_CODE_OK)
    answer.node_stats.counters.update({"clients/connected": 10, "sessions": 3})
    links["n1"].callbacks[0](answer)
    assert ("$SYS/broker/nodes/n1/clients/connected", b"10") in sys_topics.published
    assert ("$SYS/broker/nodes/n1/sessions", b"3") in sys_topics.published
    # Without its partition service: its own figures.
    sys_topics.published.clear()
    links["n1"].connected = False
    sys_topics.tick()
    assert ("$SYS/broker/nodes/n1/clients/connected", b"4") in sys_topics.published
