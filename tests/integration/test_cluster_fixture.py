"""The tests' cluster factory (tests/conftest.py) when `hexmq cluster up` loses a port race: it
tries again on other ports, and the cluster it hands out is a fresh one, at view 1.

Found in `make test` (2026-11-28): a test's own health port fell on the edge's metrics port of
the random base port, the edge failed after the first view was agreed, and the retry in the
same directory went on from the failed attempt's Consul state (view 3, "view 1" expected)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import pytest

from hexmq_cli import clusterstate
from tests import conftest


def test_a_retried_up_starts_a_fresh_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster_prerequisites: None
) -> None:
    first = conftest.pick_base_port(1)
    second = conftest.pick_base_port(1)
    while abs(second - first) <= clusterstate.highest_port(0, 1):
        second = conftest.pick_base_port(1)
    bases = iter([first, second])
    monkeypatch.setattr(conftest, "pick_base_port", lambda _nodes: next(bases))
    # The edge's gRPC health server on the edge's own metrics port of the first base: that
    # edge cannot start, after its node's agent has agreed view 1.
    taken = clusterstate.node_ports(first, 1).metrics("edge")
    with conftest._cluster_factory(tmp_path) as make:
        cluster = make(nodes=1, extra=[f"--edge-arg=--health-listen=127.0.0.1:{taken}"])
        assert cluster.node(1)["mqtt_port"] == clusterstate.node_ports(second, 1).mqtt
        port = cluster.node(1)["metrics_ports"]["membership"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            assert answer.read().decode() == "ready: view 1: 1 members\n"
