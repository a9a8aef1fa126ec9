"""The cluster of one fault run, driven the way an operator would: `hexmq cluster` for up,
kill, start and down; signals by recorded process identity for pauses and single-process
kills; the agreement server's KV and each node's gRPC status for what the cluster thinks.

Runs inside the run's network namespace (tests/faults/netns.py): node i on its own loopback
address, the agreement server on another, every process of a node under the node wrapper."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.membership.v1 import membership_pb2_grpc as mpb_grpc
from hexmq.api.partition.v1 import partition_pb2 as ppb
from hexmq.api.partition.v1 import partition_pb2_grpc as ppb_grpc
from hexmq.trust.identity import MEMBERSHIP, PARTITION, Identity
from hexmq_cli import clusterstate, localsecurity, procs
from tests.support.trust import cluster_channel, node_redis

HEXMQ = Path(sys.executable).with_name("hexmq")
BASE_PORT = 21883  # the namespace is private: every port is free


def node_address(node: int) -> str:
    return f"127.0.0.{10 + node}"


AGREEMENT_ADDRESS = "127.0.0.10"


@dataclass
class NodeInfo:
    node: int
    node_id: str
    host: str
    mqtt_port: int
    redis_port: int
    partition_port: int
    membership_port: int
    # service (edge, partition, membership) -> its Prometheus metrics port on `host`
    metrics_ports: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, n: dict[str, Any]) -> NodeInfo:
        """From a node of `hexmq cluster up/add --json`'s output."""
        return cls(
            n["node"],
            n["node_id"],
            n["host"],
            n["mqtt_port"],
            n["redis_port"],
            n["partition_port"],
            n["membership_port"],
            dict(n.get("metrics_ports") or {}),
        )

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.host, self.mqtt_port


class FaultCluster:
    def __init__(self, cluster_dir: Path, nodes: int) -> None:
        self.dir = cluster_dir
        self.count = nodes
        self.nodes: dict[int, NodeInfo] = {}
        self.agreement = f"{AGREEMENT_ADDRESS}:{clusterstate.agreement_port(BASE_PORT, nodes)}"
        self.cluster_name = clusterstate.cluster_name_of(cluster_dir)
        self.cli_log: list[str] = []

    # --- hexmq cluster ------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        argv = [str(HEXMQ), "cluster", *args, "--dir", str(self.dir)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        self.cli_log.append(f"$ {' '.join(argv)} -> {done.returncode}\n{done.stderr[-2000:]}")
        return done

    def up(
        self,
        *,
        rf: int,
        partitions: int,
        wrapper: str,
        trace_dir: Path | None = None,
        colocated: bool = False,
        service_args: Sequence[str] = (),
    ) -> None:
        hosts = ",".join(node_address(i) for i in range(1, self.count + 1))
        done = self.cli(
            "up",
            *("--nodes", str(self.count), "--rf", str(rf), "--partitions", str(partitions)),
            *("--hosts", hosts, "--agreement-listen", self.agreement),
            *("--base-port", str(BASE_PORT), "--node-wrapper", wrapper, "--timeout", "60"),
            # A process per service unless told: intra-node cuts a node's services from
            # each other, and a co-located node has no links between them to cut.
            "--colocated" if colocated else "--separate",
            *(("--trace-dir", str(trace_dir)) if trace_dir else ()),
            *service_args,
        )
        if done.returncode != 0:
            raise RuntimeError(f"hexmq cluster up failed:\n{done.stderr[-4000:]}")
        for n in json.loads(done.stdout)["nodes"]:
            self.nodes[n["node"]] = NodeInfo.of(n)

    def kill(self, node: int) -> None:
        self._checked(self.cli("kill", str(node)))

    def start(self, node: int) -> str | None:
        """Start what is not running on the node (and the agreement server if it is down);
        None, or why it failed (a start can fail while the cluster is still healing)."""
        done = self.cli("start", str(node), "--timeout", "60")
        return None if done.returncode == 0 else done.stderr.strip()[-1500:]

    def down(self) -> None:
        self.cli("down", "--grace", "5")

    def leave(self, node: int, timeout: float = 90) -> str | None:
        """`hexmq cluster leave`: the node hands its roles over, RF is restored without it,
        then its processes stop (its edge sends its clients elsewhere). None, or why not."""
        done = self.cli("leave", str(node), "--timeout", f"{timeout:g}", timeout=timeout + 60)
        return None if done.returncode == 0 else done.stderr.strip()[-1500:]

    def join(self, node: int) -> str | None:
        """Node `node` (the one after the last, or one that left) joins: `hexmq cluster add`
        on its own address the first time, `start` after; from then on the run watches it
        like the others. None, or why it failed."""
        known = len(self._state().nodes)
        if node == known + 1:
            done = self.cli("add", "--host", node_address(node), "--timeout", "60")
        elif node <= known:
            done = self.cli("start", str(node), "--timeout", "60")
        else:
            return f"node {node} cannot join a cluster of {known}: add node {known + 1} first"
        if done.returncode != 0:
            return done.stderr.strip()[-1500:]
        (n,) = json.loads(done.stdout)["nodes"]
        info = NodeInfo.of(n)
        # A new dict, not an update: the observers' threads iterate the one they hold.
        self.nodes = {**self.nodes, node: info}
        return None

    def forget(self, node: int) -> None:
        """A node that left for good: the run no longer watches it nor expects it back."""
        self.nodes = {n: info for n, info in self.nodes.items() if n != node}

    @staticmethod
    def _checked(done: subprocess.CompletedProcess[str]) -> None:
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(map(str, done.args))} failed: {done.stderr[-2000:]}")

    # --- processes ----------------------------------------------------------------------

    def _state(self) -> clusterstate.ClusterState:
        return clusterstate.require_state(self.dir)

    def signal_node(self, node: int, sig: int, services: Sequence[str] | None = None) -> list[int]:
        """Signal the node's running processes (all, or the services named); their pids."""
        state = self._state().node(node)
        sent = []
        for service, record in state.processes.items():
            if services is not None and service not in services:
                continue
            if record.identity is not None and procs.send_signal(record.identity, sig):
                sent.append(record.identity.pid)
        return sent

    def pause(self, node: int) -> list[int]:
        return self.signal_node(node, signal.SIGSTOP)

    def resume(self, node: int) -> list[int]:
        return self.signal_node(node, signal.SIGCONT)

    def preloaded(self, node: int, library: str) -> list[str]:
        """The node's services whose environment preloads `library` (a clock jump's proof)."""
        found = []
        for service, record in self._state().node(node).processes.items():
            if record.identity is None or not record.running():
                continue
            try:
                environ = Path(f"/proc/{record.identity.pid}/environ").read_bytes()
            except OSError:
                continue
            if any(
                entry.startswith(b"LD_PRELOAD=") and library.encode() in entry
                for entry in environ.split(b"\0")
            ):
                found.append(service)
        return found

    def kill_redis(self, node: int) -> list[int]:
        pids = self.signal_node(node, signal.SIGKILL, ["redis"])
        record = self._state().node(node).processes["redis"]
        if record.identity is not None:
            procs.wait_gone([record.identity], 10)
        return pids

    def kill_agreement(self) -> int | None:
        record = self._state().consul
        if record is None or record.identity is None or not record.running():
            return None
        procs.kill([record.identity])
        return record.identity.pid

    def agreement_running(self) -> bool:
        record = self._state().consul
        return record is not None and record.running()

    def running(self, node: int) -> bool:
        return not self.exited(node)

    def exited(self, node: int) -> list[str]:
        """The node's processes that are not running (by the names `cluster status` uses)."""
        state = self._state().node(node)
        return sorted(name for name, r in state.processes.items() if not r.running())

    # --- what the cluster thinks --------------------------------------------------------

    def agreement_request(self, path: str) -> urllib.request.Request:
        """A request to the agreement server's HTTP API, with the cluster's ACL token when it
        has one (`hexmq cluster up` makes DIR/consul.token; the embedded server denies
        anonymous reads then)."""
        token = self.dir / localsecurity.CONSUL_TOKEN_FILE
        headers = {"X-Consul-Token": token.read_text().strip()} if token.exists() else {}
        return urllib.request.Request(f"http://{self.agreement}{path}", headers=headers)

    def stored_view(self, timeout: float = 2.0) -> mpb.View | None:
        """The view as the agreement server holds it (None if it does not answer)."""
        request = self.agreement_request(f"/v1/kv/hexmq/{self.cluster_name}/view?raw")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return mpb.View.FromString(reply.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def node_view(self, node: int, timeout: float = 1.0) -> mpb.View | None:
        info = self.nodes.get(node)  # None: forgotten (left for good) meanwhile
        if info is None:
            return None
        try:
            with cluster_channel(
                self.dir, f"{info.host}:{info.membership_port}", Identity(MEMBERSHIP, info.node_id)
            ) as channel:
                stub = mpb_grpc.MembershipServiceStub(channel)
                view: mpb.View = stub.GetView(mpb.GetViewRequest(), timeout=timeout)
                return view
        except grpc.RpcError:
            return None

    def view(self) -> mpb.View | None:
        """The newest view anyone has: the agreement server's, else the agents'."""
        best = self.stored_view()
        if best is not None:
            return best
        for node in self.nodes:
            view = self.node_view(node)
            if view is not None and (best is None or view.epoch > best.epoch):
                best = view
        return best

    def partition_status(self, node: int, timeout: float = 1.0) -> ppb.StatusReply | None:
        info = self.nodes.get(node)  # None: forgotten (left for good) meanwhile
        if info is None:
            return None
        try:
            with cluster_channel(
                self.dir, f"{info.host}:{info.partition_port}", Identity(PARTITION, info.node_id)
            ) as channel:
                stub = ppb_grpc.PartitionServiceStub(channel)
                reply: ppb.StatusReply = stub.Status(ppb.StatusRequest(), timeout=timeout)
                return reply
        except grpc.RpcError:
            return None

    def all_status(self, timeout: float = 1.0) -> dict[int, ppb.StatusReply | None]:
        with ThreadPoolExecutor(max_workers=len(self.nodes)) as pool:
            replies = pool.map(lambda n: (n, self.partition_status(n, timeout)), self.nodes)
            return dict(replies)

    def node_number(self, node_id: str) -> int:
        return int(node_id.removeprefix("n"))

    def table(self, view: mpb.View) -> list[list[int]]:
        return [[self.node_number(r) for r in pa.replicas] for pa in view.partitions]

    def redis_dump(self, node: int, partition: int) -> dict[str, Any]:
        """Every key of a partition in a node's Redis: {key: hash}."""
        info = self.nodes[node]
        client = node_redis(self.dir, node, info.redis_port, info.host, socket_timeout=5)
        try:
            return {
                key.decode(): client.hgetall(key)
                for key in client.scan_iter(match=f"hx:{partition}:*", count=1000)
            }
        finally:
            client.close()
