"""`hexmq cluster status` shows the links that are down and the connections waiting on them
(issue 30, G9), read from the services' metrics over HTTP (hexmq_cli/linkstatus.py)."""

from __future__ import annotations

from hexmq.telemetry.metrics import Metrics, start_metrics_server
from hexmq_cli import linkstatus
from tests.support.ports import free_port


def test_links_down_and_waiting_sessions_are_read_from_each_services_metrics() -> None:
    edge, partition = Metrics(), Metrics()
    edge.links_down.labels("edge", "n1").set(0)
    edge.links_down.labels("edge", "n3").set(1)
    edge.links_down.labels("membership", "n3").set(1)
    edge.sessions_waiting_for_master.set(2)
    edge.unreachable_disconnects.inc(5)
    partition.links_down.labels("replication", "n1").set(1)
    servers = [start_metrics_server("127.0.0.1", 0, registry=m.registry) for m in (edge, partition)]
    closed = free_port()  # a port nobody serves
    try:
        links = linkstatus.read(
            "127.0.0.1",
            {"edge": servers[0].port, "partition": servers[1].port, "membership": closed},
        )
    finally:
        for server in servers:
            server.close()
    assert links["down"] == [
        {"service": "edge", "link": "edge", "peer": "n3"},
        {"service": "edge", "link": "membership", "peer": "n3"},
        {"service": "partition", "link": "replication", "peer": "n1"},
    ]
    assert (links["sessions_waiting_for_master"], links["unreachable_disconnects"]) == (2, 5)
    assert list(links["errors"]) == ["membership"]
    assert linkstatus.describe("n3", links) == [
        "n3: edge's edge -> partition service of n3 DOWN",
        "n3: edge's view watch -> agent of n3 DOWN",
        "n3: partition's replication stream from master n1 DOWN",
        "n3: 2 live connection(s) waiting for a master the edge cannot reach (5 ended so far "
        "past --unreachable-disconnect)",
    ]
    assert linkstatus.describe("n1", {"down": [], "sessions_waiting_for_master": 0}) == []


def test_a_nodes_edges_are_added_up_and_their_connections_shown_each() -> None:
    first, second = Metrics(), Metrics()
    first.sessions_waiting_for_master.set(2)
    second.sessions_waiting_for_master.set(3)
    first.connections.set(40)
    second.connections.set(60)
    second.links_down.labels("edge", "n2").set(1)
    servers = [start_metrics_server("127.0.0.1", 0, registry=m.registry) for m in (first, second)]
    try:
        links = linkstatus.read("127.0.0.1", {"edge": servers[0].port, "edge2": servers[1].port})
    finally:
        for server in servers:
            server.close()
    assert links["sessions_waiting_for_master"] == 5
    assert links["connections"] == {"edge": 40, "edge2": 60}
    assert links["down"] == [{"service": "edge2", "link": "edge", "peer": "n2"}]
