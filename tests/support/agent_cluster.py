"""Membership agents as processes, for the tests that run them: real `hexmq membership` agents
agreeing through a real `hexmq consul-dev`, each with a stand-in partition service
(tests/support/partition_standin.py), three to a cluster. The fixtures that make them
(`consul_dev`, `agents`) are in tests/integration/conftest.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.trust.identity import MEMBERSHIP, OPERATOR, PARTITION, Identity
from hexmq_cli import procs
from tests.conftest import HEXMQ
from tests.support.processes import end
from tests.support.trust import env_for, operator_tls, own_ca, tls_for
from tests.support.unique import uid

# The agent's defaults, except a 10 s session TTL made explicit.
AGENT_FLAGS = ("--session-ttl", "10", "--partitions", "16", "--rf", "2")


def spawn(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process of the test; `env` adds to this process's environment."""
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


def wait_until(what: str, check: Callable[[], bool], timeout: float, step: float = 0.05) -> float:
    """Seconds it took until check() held; fails the test after `timeout`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what}: not within {timeout} s", pytrace=False)
        time.sleep(step)
    return time.monotonic() - started


@dataclass
class Node:
    node_id: str
    agent_port: int
    partition_port: int
    mqtt_port: int
    agent: subprocess.Popen[bytes] | None = None
    standin: subprocess.Popen[bytes] | None = None
    incarnation: int = 0

    @property
    def agent_addr(self) -> str:
        return f"127.0.0.1:{self.agent_port}"

    def stub(self, role: str = OPERATOR) -> tuple[grpc.Channel, pb_grpc.MembershipServiceStub]:
        """The test's own calls: as an operator of the test CA, or as `role` of this node
        (PARTITION: what only the node's partition service may ask)."""
        tls = operator_tls(own_ca()) if role == OPERATOR else tls_for(own_ca(), role, self.node_id)
        channel = tls.sync_channel(self.agent_addr, peer=Identity(MEMBERSHIP, self.node_id))
        return channel, pb_grpc.MembershipServiceStub(channel)

    def view(self) -> pb.View | None:
        channel, stub = self.stub()
        with channel:
            try:
                view: pb.View = stub.GetView(pb.GetViewRequest(), timeout=2)
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return None
                raise
            return view

    def status(self) -> pb.MembershipStatus:
        channel, stub = self.stub()
        with channel:
            status: pb.MembershipStatus = stub.Status(pb.MembershipStatusRequest(), timeout=2)
            return status

    def members(self) -> dict[str, int]:
        """node id -> incarnation in this agent's view ({} before the first view)."""
        view = self.view()
        return {m.node_id: m.incarnation for m in view.members} if view else {}


@dataclass
class AgentCluster:
    consul: str
    dir: Path
    nodes: list[Node]
    name: str = field(default_factory=lambda: f"t{uid(12)}")

    def node(self, i: int) -> Node:
        return self.nodes[i - 1]

    def start_agent(self, i: int, *extra: str) -> None:
        n = self.node(i)
        argv = [
            *(str(HEXMQ), "membership", "--node-id", n.node_id, "--listen", n.agent_addr),
            *("--consul", self.consul, "--cluster", self.name),
            *("--partition-addr", f"127.0.0.1:{n.partition_port}"),
            *("--mqtt-addr", f"127.0.0.1:{n.mqtt_port}"),
            *("--expect", str(len(self.nodes))),
            *AGENT_FLAGS,
            *extra,
        ]
        n.agent = spawn(argv, self.dir / f"{n.node_id}-agent.log", self.agent_env(n))
        wait_until(f"{n.node_id} agent serving", lambda: procs.tcp_accepts(n.agent_port), 15)

    def agent_env(self, n: Node) -> dict[str, str]:
        """An agent's certificate, from the test CA."""
        return env_for(own_ca(), MEMBERSHIP, n.node_id)

    def start_standin(self, i: int, incarnation: int) -> None:
        n = self.node(i)
        argv = [
            *(sys.executable, "-m", "tests.support.partition_standin"),
            *("--node-id", n.node_id),
            *("--listen", f"127.0.0.1:{n.partition_port}", "--membership", n.agent_addr),
            *("--incarnation", str(incarnation)),
        ]
        n.standin = spawn(
            argv, self.dir / f"{n.node_id}-standin.log", env_for(own_ca(), PARTITION, n.node_id)
        )
        n.incarnation = incarnation
        wait_until(f"{n.node_id} stand-in serving", lambda: procs.tcp_accepts(n.partition_port), 15)

    def start(self) -> None:
        for i in range(1, len(self.nodes) + 1):
            self.start_agent(i)
        for i in range(1, len(self.nodes) + 1):
            self.start_standin(i, incarnation=1000 + i)

    def wait_members(
        self, observer: int, wanted: dict[str, int], timeout: float, step: float = 0.05
    ) -> float:
        node = self.node(observer)
        return wait_until(
            f"{node.node_id}'s view has members {wanted}",
            lambda: node.members() == wanted,
            timeout,
            step,
        )

    def stop(self) -> None:
        for n in self.nodes:
            for process in (n.standin, n.agent):
                if process is not None:
                    if process.poll() is None:
                        os.kill(process.pid, signal.SIGCONT)  # in case a test paused it
                    # The plain stop: SIGTERM would be a leave, waited for up to
                    # --leave-timeout by an agent whose cluster is being torn down.
                    end(process, signal.SIGINT)


ALL = {"n1": 1001, "n2": 1002, "n3": 1003}
