"""Fixtures of the integration tests that run membership agents as processes
(tests/support/agent_cluster.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hexmq import procs
from tests.conftest import HEXMQ
from tests.support.agent_cluster import AgentCluster, Node, end, free_ports, spawn, wait_until


@pytest.fixture(scope="module")
def consul_dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `hexmq consul-dev` on a free loopback port, shared by a test module's tests (each
    test uses its own cluster name, so its own keys)."""
    base = tmp_path_factory.mktemp("consul")
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    argv = [str(HEXMQ), "consul-dev", "--listen", addr, "--data-dir", str(base / "data")]
    server = spawn(argv, base / "consul.log")
    try:
        wait_until("consul-dev serving", lambda: procs.tcp_accepts(port), 15)
        yield addr
    finally:
        end(server)


@pytest.fixture
def agents(consul_dev: str, tmp_path: Path) -> Iterator[AgentCluster]:
    ports = free_ports(9)
    nodes = [Node(f"n{i + 1}", *ports[3 * i : 3 * i + 3]) for i in range(3)]
    cluster = AgentCluster(consul_dev, tmp_path, nodes)
    try:
        yield cluster
    finally:
        cluster.stop()
