"""The $SYS figures: a node's drops added up, the cluster totals, and how they are rendered."""

from __future__ import annotations

from services.edge.systopics import cluster_values, node_values, render


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
