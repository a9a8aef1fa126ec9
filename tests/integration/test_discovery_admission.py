"""Discovery as the admission gate, with processes: real `hexmq membership` agents with
`--discovery static` agreeing through a real `hexmq consul-dev`, each beside a stand-in
partition service (as in test_membership_agent.py). A node the members file does not list
registers and serves but neither counts for the first view nor joins it; listed, it joins; no
longer listed, it stays (docs/discovery.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hexmq_cli import procs
from tests.conftest import HEXMQ
from tests.support.agent_cluster import (
    AGENT_FLAGS,
    AgentCluster,
    Node,
    spawn,
    wait_until,
)
from tests.support.ports import free_ports

LISTED = {"n1": 1001, "n2": 1002}
ALL = {**LISTED, "n3": 1003}


class DiscoveringCluster(AgentCluster):
    """Agents that know who belongs from a members file, with no --expect: the first view
    waits for every node the file lists."""

    members: Path

    def write_members(self, *node_ids: str) -> None:
        lines = [f"{n.node_id} 127.0.0.1:{n.partition_port}" for n in self.nodes]
        listed = [line for line in lines if line.split()[0] in node_ids]
        # Written whole, then renamed: the agents never read half a file.
        partial = self.members.with_suffix(".tmp")
        partial.write_text("# test members file\n" + "\n".join(listed) + "\n")
        partial.replace(self.members)

    def start_agent(self, i: int, *extra: str) -> None:
        n = self.node(i)
        argv = [
            *(str(HEXMQ), "membership", "--node-id", n.node_id, "--listen", n.agent_addr),
            *("--consul", self.consul, "--cluster", self.name),
            *("--partition-addr", f"127.0.0.1:{n.partition_port}"),
            *("--mqtt-addr", f"127.0.0.1:{n.mqtt_port}"),
            *("--discovery", "static", "--discovery-static-file", str(self.members)),
            *("--discovery-interval", "0.1"),
            *AGENT_FLAGS,
            *extra,
        ]
        n.agent = spawn(argv, self.dir / f"{n.node_id}-agent.log", self.agent_env(n))
        wait_until(f"{n.node_id} agent serving", lambda: procs.tcp_accepts(n.agent_port), 15)


@pytest.fixture
def cluster(consul_dev: str, tmp_path: Path) -> Iterator[DiscoveringCluster]:
    ports = free_ports(9)
    nodes = [Node(f"n{i + 1}", *ports[3 * i : 3 * i + 3]) for i in range(3)]
    agents = DiscoveringCluster(consul_dev, tmp_path, nodes)
    agents.members = tmp_path / "members"
    try:
        yield agents
    finally:
        agents.stop()


def steady(what: str, check: bool | None, hold_s: float, probe: object) -> None:
    """`probe()` keeps giving `check` for `hold_s` seconds (a thing that must not happen)."""
    assert callable(probe)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        assert probe() == check, what
        time.sleep(0.1)


@pytest.mark.timeout(90)
def test_only_the_nodes_discovery_lists_make_the_first_view_and_join_it(
    cluster: DiscoveringCluster,
) -> None:
    cluster.write_members("n1", "n2")
    for i in (1, 2, 3):
        cluster.start_agent(i)
    # n1 and n3 serve: two registered serving nodes, but n3 is not listed and n2, listed, is
    # not serving yet, so there is no first view.
    cluster.start_standin(1, 1001)
    cluster.start_standin(3, 1003)
    steady(
        "no first view without every listed node", True, 1.5, lambda: cluster.node(1).view() is None
    )

    cluster.start_standin(2, 1002)
    for i in (1, 2, 3):  # n3's agent follows the view it is not in
        cluster.wait_members(i, LISTED, timeout=15)
    view = cluster.node(1).view()
    assert view is not None
    assert sorted(view.target_members) == ["n1", "n2"]
    # Registered, serving and settled, n3 still stays out while the file does not list it.
    steady("n3 stays out", False, 1.5, lambda: "n3" in cluster.node(1).members())

    cluster.write_members("n1", "n2", "n3")
    took = cluster.wait_members(1, ALL, timeout=15)
    cluster.wait_members(3, ALL, timeout=5)
    print(f"n3 admitted {took:.2f} s after the members file listed it")

    # No longer listed, a member stays until it leaves or fails (discovery is a gate at the
    # door, never a reason to remove a running node).
    cluster.write_members("n1", "n2")
    steady("n3 stays in", True, 1.5, lambda: cluster.node(1).members() == ALL)
    log = (cluster.dir / "n1-agent.log").read_text()
    assert "node n3 is registered but not listed by discovery static (" in log
    assert "member n3 is not listed by discovery static (" in log
    assert "it stays a member until it leaves or fails" in log
