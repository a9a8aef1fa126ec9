"""Fixtures of the integration tests: membership agents as processes
(tests/support/agent_cluster.py) and a real redis-server."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hexmq_cli import procs
from tests.conftest import HEXMQ
from tests.support.agent_cluster import AgentCluster, Node, spawn, wait_until
from tests.support.ports import free_port, free_ports
from tests.support.processes import end
from tests.support.start_bounds import step_timeout


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
        wait_until("consul-dev serving", lambda: procs.tcp_accepts(port), step_timeout())
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


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of its own on a free loopback port: (its URL, its process)."""
    port = free_port()
    server = subprocess.Popen(
        [
            *(shutil.which("redis-server") or "redis-server", "--port", str(port)),
            *("--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail("redis-server exited at start")
                subprocess.run(["sleep", "0.05"], check=True)
        yield f"redis://127.0.0.1:{port}/0", server
    finally:
        server.terminate()
        server.wait(timeout=10)
