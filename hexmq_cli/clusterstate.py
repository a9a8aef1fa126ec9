"""The layout of a local cluster: its port scheme, its directory, and its state file.

A node is four processes: redis-server, `hexmq membership`, `hexmq partition`, `hexmq edge`
(SERVICES, in start order), or two when co-located (`up`'s default): redis-server and `hexmq
node`, which runs the three hexmq services (COLOCATED_PROCESSES). The cluster has one more:
its agreement server, `hexmq consul-dev` (the embedded Consul-API server), started before the
nodes and stopped after them, unless the membership agents use an external Consul (`--consul
ADDR`). Nothing here starts or signals a process (that is hexmq_cli.localcluster); this module
says where everything is and what each command line is.

Port scheme, from the base port P (default 1883), for node i (1-based):
    MQTT (edge)            P + i - 1
    redis                  P + 1000 + 10*(i-1) + 0
    membership (gRPC)      P + 1000 + 10*(i-1) + 1
    partition (gRPC)       P + 1000 + 10*(i-1) + 2
    edge metrics (HTTP)    P + 1000 + 10*(i-1) + 3      (Prometheus, GET /metrics)
    partition metrics      P + 1000 + 10*(i-1) + 4
    membership metrics     P + 1000 + 10*(i-1) + 5
    edge k's metrics       P + 1000 + 10*(i-1) + 4 + k  (k = 2..5: `--edges-per-node`)
and for the cluster as a whole, in the block after the last node's (N nodes):
    agreement server       P + 1000 + 10*N + 0          (hexmq consul-dev, Consul's HTTP API)
    reserved for later     P + 1000 + 10*N + 1..9
With `--edges-per-node N` (N > 1) a node runs N edge processes, `edge` (id n<i>) and `edge2`
.. `edgeN` (ids n<i>-e2 ..), all on the node's MQTT port with --reuse-port (the kernel spreads
new connections over them), each with its own metrics port, certificate and log.
MQTT ports are consecutive so "node i listens on P+i-1" is easy to remember; every other port
is in a separate block of ten per node. Everything binds 127.0.0.1, unless `--hosts` gives each
node a loopback address of its own (node i then binds every port of it there, the port scheme
unchanged) and `--agreement-listen` gives the agreement server its own: links between nodes can
then be told apart by address (the fault suite cuts them with iptables, docs/faults.md).

A node wrapper (`--node-wrapper 'CMD ARGS'`, `{node}` replaced by the node number) prefixes
every command line of a node: its processes run as `CMD ARGS <argv>` (e.g. `nice -n 5`, or
`setpriv --regid ...` to give each node a group id that iptables can match). It is recorded in
each process's argv, so `start` runs it again.

Layout of DIR:
    cluster.json          the state: config, ports, and per process argv, log, pid, start time
    consul/               the agreement server's state (the view survives its restart)
    consul.log            its log
    members               the nodes and their partition addresses (`--discovery static`)
    node<i>/redis.conf    node<i>/redis/ (Redis data: append-only file)
    node<i>/<process>.log one log per process (edge2.log ... for further edges), appended to
                          across restarts
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from hexmq.netaddr import parse_hostport
from hexmq_cli import procs
from hexmq_cli.procs import LOOPBACK, ProcessIdentity

SERVICES: Final = ("redis", "membership", "partition", "edge")
HEXMQ_SERVICES: Final = ("membership", "partition", "edge")
# A co-located node (`up --colocated`) runs its three hexmq services as one process,
# `hexmq node` (hexmq_cli/node.py): its processes, in start order.
NODE_PROCESS: Final = "node"
COLOCATED_PROCESSES: Final = ("redis", NODE_PROCESS)
# Each hexmq service serves Prometheus metrics on its node block's port: base + slot.
METRICS_SLOTS: Final = {"edge": 3, "partition": 4, "membership": 5}
# A node's further edges (`--edges-per-node`): edge k serves metrics on slot 4 + k, the block's
# slots 6-9, so a node runs at most 5 edges.
EDGE: Final = "edge"
FURTHER_EDGE_SLOTS: Final = 4
MAX_EDGES_PER_NODE: Final = 5
MAX_NODES: Final = 100
MIN_BASE_PORT: Final = 1024
INTERNAL_OFFSET: Final = 1000
NODE_STRIDE: Final = 10
DEFAULT_BASE_PORT: Final = 1883
DEFAULT_PARTITIONS: Final = 256

STATE_FILE: Final = "cluster.json"
# node<i>/redis.password: the node's Redis password for its partition service, and
# redis-operator.password the operator's (hexmq_cli.localsecurity makes them).
REDIS_PASSWORD_FILE: Final = "redis.password"
REDIS_OPERATOR_FILE: Final = "redis-operator.password"
MEMBERS_FILE: Final = "members"
# How the agents of a local cluster know who belongs: None (every node that registers, after
# --expect N), or "static" (DIR/members, the first view waiting for every node it lists).
DISCOVERY_CHOICES: Final = ("static",)
LOCK_FILE: Final = ".cluster.lock"
# 2: the agreement server (consul, consul_addr, cluster_name). Format 1 files still load (no
# agreement server recorded); `up` plans every command line afresh.
STATE_FORMAT: Final = 2
READABLE_FORMATS: Final = (1, 2)
AGREEMENT_SERVER: Final = "consul-dev"
# Consul's own default address, for agents pointed at an external Consul.
DEFAULT_CONSUL_ADDR: Final = "127.0.0.1:8500"
# Set in every process's environment: finds leftovers even when cluster.json is gone.
ENV_MARKER: Final = "HEXMQ_CLUSTER_DIR"


class UsageError(Exception):
    """Bad arguments: the command line has to change (exit code 2)."""


class ClusterError(Exception):
    """The command could not be carried out (exit code 1)."""


# --- ports ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodePorts:
    mqtt: int
    redis: int
    membership: int
    partition: int
    # The address every port of the node binds (--hosts; 127.0.0.1 by default).
    host: str = LOOPBACK

    def of(self, service: str) -> int:
        """The port a process serves on (every edge of the node: its MQTT port; a co-located
        node's process: its MQTT port, which it listens on last)."""
        mqtt = service_of(service) == EDGE or service == NODE_PROCESS
        port: int = getattr(self, "mqtt" if mqtt else service)
        return port

    def of_process(self, process: str) -> tuple[int, ...]:
        """Every port a process of the node listens on (metrics aside)."""
        if process == NODE_PROCESS:
            return tuple(self.of(s) for s in HEXMQ_SERVICES)
        return (self.of(process),)

    def metrics(self, service: str) -> int:
        """The Prometheus port of a hexmq process: the node block's slots 3, 4, 5, and 6-9
        for the edges edge2-edge5."""
        k = edge_number(service)
        if k is not None and k > 1:
            return self.redis + FURTHER_EDGE_SLOTS + k
        return self.redis + METRICS_SLOTS[service]

    def addr(self, port: int) -> str:
        """HOST:PORT of one of this node's ports."""
        return f"{self.host}:{port}"


def edge_names(count: int) -> list[str]:
    """A node's edge processes: `edge`, then `edge2` .. `edge<count>`."""
    return [EDGE, *(f"{EDGE}{k}" for k in range(2, count + 1))]


def edge_number(name: str) -> int | None:
    """1 for `edge`, k for `edge<k>`, None for a process that is no edge."""
    if name == EDGE:
        return 1
    rest = name.removeprefix(EDGE)
    return int(rest) if rest != name and rest.isdigit() else None


def service_of(name: str) -> str:
    """What a process of a node runs: its name, but `edge` for every one of its edges."""
    return EDGE if edge_number(name) is not None else name


def node_ports(base_port: int, node: int, host: str = LOOPBACK) -> NodePorts:
    """The ports of node `node` (1-based) in a cluster with base port `base_port`."""
    internal = base_port + INTERNAL_OFFSET + NODE_STRIDE * (node - 1)
    return NodePorts(
        mqtt=base_port + node - 1,
        redis=internal,
        membership=internal + 1,
        partition=internal + 2,
        host=host,
    )


def agreement_port(base_port: int, nodes: int) -> int:
    """The embedded agreement server's port: the first of the block after the last node's."""
    return base_port + INTERNAL_OFFSET + NODE_STRIDE * nodes


def highest_port(base_port: int, nodes: int) -> int:
    """The top of the port range a cluster reserves (the cluster block after the nodes')."""
    return base_port + INTERNAL_OFFSET + NODE_STRIDE * (nodes + 1) - 1


def validate_cluster_args(
    *,
    nodes: int,
    base_port: int,
    partitions: int,
    rf: int,
    edges_per_node: int = 1,
    colocated: bool = False,
) -> None:
    if not 1 <= edges_per_node <= MAX_EDGES_PER_NODE:
        raise UsageError(
            f"--edges-per-node must be between 1 and {MAX_EDGES_PER_NODE}, got {edges_per_node}"
        )
    if colocated and edges_per_node > 1:
        raise UsageError(
            f"--edges-per-node {edges_per_node} needs separate processes: a --colocated node "
            "runs one edge, inside its `hexmq node` process (leave out one of the two)"
        )
    if not 1 <= nodes <= MAX_NODES:
        raise UsageError(f"--nodes must be between 1 and {MAX_NODES}, got {nodes}")
    if not MIN_BASE_PORT <= base_port <= 65535:
        raise UsageError(f"--base-port must be between {MIN_BASE_PORT} and 65535, got {base_port}")
    if highest_port(base_port, nodes) > 65535:
        span = highest_port(0, nodes)
        raise UsageError(
            f"--base-port {base_port} is too high for {nodes} node(s): the cluster uses ports up "
            f"to base+{span}; use at most {65535 - span}"
        )
    if partitions < 1:
        raise UsageError(f"--partitions must be at least 1, got {partitions}")
    if rf < 1:
        raise UsageError(f"--rf must be at least 1, got {rf}")
    if rf > nodes:
        raise UsageError(f"--rf {rf} needs at least {rf} nodes, got --nodes {nodes}")


def parse_hosts(text: str, what: str = "--hosts") -> list[str]:
    """`--hosts`: comma-separated IPv4 loopback addresses, one per node, all different."""
    hosts = [h.strip() for h in text.split(",")]
    for host in hosts:
        try:
            addr = ipaddress.IPv4Address(host)
        except ValueError:
            raise UsageError(
                f"{what}: {host!r} is not an IPv4 address (expected e.g. 127.0.0.2,127.0.0.3)"
            ) from None
        if not addr.is_loopback:
            raise UsageError(
                f"{what}: {host} is not a loopback address (a local cluster binds 127.0.0.0/8 only)"
            )
    repeated = sorted({h for h in hosts if hosts.count(h) > 1})
    if repeated:
        raise UsageError(f"{what}: {', '.join(repeated)} listed more than once")
    return hosts


def parse_agreement_listen(text: str) -> tuple[str, int]:
    """`--agreement-listen HOST:PORT`: a loopback IPv4 address and a port."""
    try:
        host, port = parse_hostport(text, what="--agreement-listen")
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise UsageError(
            f"--agreement-listen: {host!r} is not an IPv4 address (expected e.g. 127.0.0.10:8500)"
        ) from None
    if not addr.is_loopback:
        raise UsageError(f"--agreement-listen: {host} is not a loopback address (127.0.0.0/8 only)")
    return host, port


def parse_node_wrapper(text: str) -> list[str]:
    """`--node-wrapper 'CMD ARGS'`: the words, the command resolved through PATH (the
    processes are spawned without a shell)."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise UsageError(f"--node-wrapper: {exc} in {text!r}") from None
    if not words:
        raise UsageError("--node-wrapper: empty command")
    path = shutil.which(words[0])
    if path is None:
        raise UsageError(f"--node-wrapper: command {words[0]!r} not found on PATH")
    return [path, *words[1:]]


def cluster_ports(
    base_port: int, nodes: int, hosts: Sequence[str] | None = None
) -> list[NodePorts]:
    return [
        node_ports(base_port, i, hosts[i - 1] if hosts else LOOPBACK) for i in range(1, nodes + 1)
    ]


def busy_ports(
    ports: Sequence[NodePorts],
    agreement: tuple[str, int] | None = None,
    edges_per_node: int = 1,
) -> list[str]:
    """'HOST:PORT (node I SERVICE)' for every port that is taken now (and the agreement
    server's (host, port), if given)."""
    wanted = [
        (p.host, port, f"node {i} {label}")
        for i, p in enumerate(ports, start=1)
        for service in SERVICES
        for port, label in (
            [(p.of(service), service)]
            + ([(p.metrics(service), f"{service} metrics")] if service in METRICS_SLOTS else [])
        )
    ]
    wanted += [
        (p.host, p.metrics(name), f"node {i} {name} metrics")
        for i, p in enumerate(ports, start=1)
        for name in edge_names(edges_per_node)[1:]
    ]
    if agreement is not None:
        wanted.append((*agreement, "agreement server"))
    return [
        f"{host}:{port} ({label})" for host, port, label in wanted if procs.port_in_use(port, host)
    ]


# --- state ----------------------------------------------------------------------------------


@dataclass(slots=True)
class ProcessRecord:
    argv: list[str]
    log: Path
    identity: ProcessIdentity | None = None
    started_at: str | None = None  # wall clock, for people reading cluster.json

    def running(self) -> bool:
        return self.identity is not None and procs.is_running(self.identity)


@dataclass(slots=True)
class NodeState:
    node: int
    ports: NodePorts
    dir: Path
    processes: dict[str, ProcessRecord]
    # How its services secure the cluster's links (hexmq_cli.localsecurity.MODES). A cluster.json
    # written before TLS has none: its nodes run in plain text.
    security: str = "plain"
    # Its Redis asks for the node's password (node<i>/redis.password) as the hexmq ACL user.
    redis_auth: bool = False
    # Its hexmq services run as one process, `hexmq node` (processes: redis, node).
    colocated: bool = False

    @property
    def node_id(self) -> str:
        return f"n{self.node}"

    @property
    def edges(self) -> list[str]:
        """The node's edge processes (`edge`, and `edge2` .. with `--edges-per-node`; none for a
        co-located node, whose edge runs in its `node` process)."""
        return [name for name in self.processes if edge_number(name) is not None]

    def process_id(self, name: str) -> str:
        """The id a process of the node goes by in the cluster, which its certificate names:
        the node's, and for edge k > 1 n<i>-e<k> (its --edge-id)."""
        k = edge_number(name)
        return f"{self.node_id}-e{k}" if k is not None and k > 1 else self.node_id

    def processes_of(self, service: str) -> list[str]:
        """The names of the node's processes that run `service` (SERVICES, or `node`: a
        co-located node's one process for its three hexmq services)."""
        return [name for name in self.processes if service_of(name) == service]

    def process_names(self) -> tuple[str, ...]:
        """Its processes in start order: SERVICES and its further edges, or a co-located
        node's COLOCATED_PROCESSES."""
        return COLOCATED_PROCESSES if self.colocated else tuple(_process_names(self.processes))

    def record(self, service: str) -> ProcessRecord:
        """The process that runs `service` (redis, membership, partition or edge: the node's
        first edge)."""
        if self.colocated and service in HEXMQ_SERVICES:
            return self.processes[NODE_PROCESS]
        return self.processes[service]

    def summary(self) -> dict[str, Any]:
        """The node's entry in the JSON that `up` prints (a stable interface)."""
        return {
            "node": self.node,
            "node_id": self.node_id,
            "host": self.ports.host,
            "mqtt_port": self.ports.mqtt,
            "redis_port": self.ports.redis,
            "partition_port": self.ports.partition,
            "membership_port": self.ports.membership,
            "metrics_ports": {s: self.ports.metrics(s) for s in [*METRICS_SLOTS, *self.edges[1:]]},
            "security": self.security,
            "colocated": self.colocated,
            "pids": {
                s: (r.identity.pid if r.identity else None) for s, r in self.processes.items()
            },
        }


@dataclass(slots=True)
class ClusterState:
    dir: Path
    base_port: int
    partitions: int
    rf: int
    nodes: list[NodeState]
    # Where every service writes OTLP JSON trace files (None: no file export).
    trace_dir: Path | None = None
    # Set once every node has answered MQTT: from then on the Redis data may hold client state
    # placed for this shape of cluster.
    served: bool = False
    # The agreement server the membership agents use, and its process when the cluster runs
    # its own (`hexmq consul-dev`); None: an external Consul at consul_addr.
    consul_addr: str = DEFAULT_CONSUL_ADDR
    consul: ProcessRecord | None = None
    # The agents' KV prefix is hexmq/<cluster_name>/.
    cluster_name: str = "hexmq"
    # `up --node-wrapper`'s words ({node} not yet replaced), for `add` to repeat; None in a
    # cluster.json written before they were recorded.
    node_wrapper: list[str] | None = None
    # The embedded agreement server asks for the token in DIR/consul.token (ACLs on, default
    # deny), and the agents present it.
    consul_acl: bool = False

    @property
    def consul_port(self) -> int:
        return int(self.consul_addr.rpartition(":")[2])

    @property
    def consul_host(self) -> str:
        return self.consul_addr.rpartition(":")[0].strip("[]")

    def node(self, number: int) -> NodeState:
        if not 1 <= number <= len(self.nodes):
            raise UsageError(
                f"node {number} does not exist: the cluster in {self.dir} has nodes "
                f"1-{len(self.nodes)}"
            )
        return self.nodes[number - 1]

    def summary(self) -> dict[str, Any]:
        return {
            "dir": str(self.dir),
            "consul": {
                "addr": self.consul_addr,
                "embedded": self.consul is not None,
                "pid": self.consul.identity.pid if self.consul and self.consul.identity else None,
            },
            "cluster_name": self.cluster_name,
            "nodes": [n.summary() for n in self.nodes],
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "dir": str(self.dir),
            "base_port": self.base_port,
            "partitions": self.partitions,
            "rf": self.rf,
            "served": self.served,
            "trace_dir": str(self.trace_dir) if self.trace_dir else None,
            "consul_addr": self.consul_addr,
            "consul": _record_to_json(self.consul) if self.consul else None,
            "cluster_name": self.cluster_name,
            "node_wrapper": self.node_wrapper,
            "consul_acl": self.consul_acl,
            "nodes": [
                {
                    **n.summary(),
                    "redis_auth": n.redis_auth,
                    "dir": str(n.dir),
                    "processes": {s: _record_to_json(r) for s, r in n.processes.items()},
                }
                for n in self.nodes
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ClusterState:
        if doc.get("format") not in READABLE_FORMATS:
            raise ValueError(f"unknown format {doc.get('format')!r}")
        nodes = [
            NodeState(
                node=n["node"],
                ports=NodePorts(
                    mqtt=n["mqtt_port"],
                    redis=n["redis_port"],
                    membership=n["membership_port"],
                    partition=n["partition_port"],
                    host=n.get("host", LOOPBACK),
                ),
                dir=Path(n["dir"]),
                processes={
                    s: _record_from_json(n["processes"][s])
                    for s in (
                        COLOCATED_PROCESSES
                        if n.get("colocated")
                        else _process_names(n["processes"])
                    )
                },
                security=n.get("security", "plain"),
                redis_auth=bool(n.get("redis_auth", False)),
                colocated=bool(n.get("colocated", False)),
            )
            for n in doc["nodes"]
        ]
        return cls(
            dir=Path(doc["dir"]),
            base_port=doc["base_port"],
            partitions=doc["partitions"],
            rf=doc["rf"],
            nodes=nodes,
            trace_dir=Path(doc["trace_dir"]) if doc.get("trace_dir") else None,
            served=bool(doc.get("served", False)),
            consul_addr=doc.get("consul_addr", DEFAULT_CONSUL_ADDR),
            consul=_record_from_json(doc["consul"]) if doc.get("consul") else None,
            cluster_name=doc.get("cluster_name", "hexmq"),
            node_wrapper=doc.get("node_wrapper"),
            consul_acl=bool(doc.get("consul_acl", False)),
        )


def _process_names(recorded: Mapping[str, Any]) -> list[str]:
    """SERVICES, then the further edges a cluster.json records, in start order."""
    further = [name for name in recorded if service_of(name) == EDGE and name != EDGE]
    return [*SERVICES, *sorted(further, key=lambda name: edge_number(name) or 0)]


def _record_to_json(r: ProcessRecord) -> dict[str, Any]:
    ident = r.identity
    return {
        "argv": r.argv,
        "log": str(r.log),
        "pid": ident.pid if ident else None,
        "start_ticks": ident.start_ticks if ident else None,
        "boot_id": ident.boot_id if ident else None,
        "started_at": r.started_at,
    }


def _record_from_json(d: dict[str, Any]) -> ProcessRecord:
    ident = None
    if d.get("pid") is not None:
        ident = ProcessIdentity(pid=d["pid"], start_ticks=d["start_ticks"], boot_id=d["boot_id"])
    return ProcessRecord(
        argv=list(d["argv"]), log=Path(d["log"]), identity=ident, started_at=d.get("started_at")
    )


def load_state(cluster_dir: Path) -> ClusterState | None:
    path = cluster_dir / STATE_FILE
    try:
        doc = json.loads(path.read_text())
        return ClusterState.from_json(doc)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as exc:
        raise ClusterError(f"{path} is not a hexmq cluster state file ({exc})") from exc


def require_state(cluster_dir: Path) -> ClusterState:
    state = load_state(cluster_dir)
    if state is None:
        raise ClusterError(
            f"no cluster in {cluster_dir} ({STATE_FILE} not found); "
            f"create one with `hexmq cluster up --dir {cluster_dir}`"
        )
    return state


def save_state(state: ClusterState) -> None:
    # Written after every spawn, atomically: if the manager dies half-way, `down` still finds
    # every process it started.
    path = state.dir / STATE_FILE
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    tmp.replace(path)


@contextlib.contextmanager
def cluster_lock(cluster_dir: Path, timeout: float = 120.0) -> Iterator[None]:
    """One changing command at a time per DIR (`status` only reads and takes no lock)."""
    with (cluster_dir / LOCK_FILE).open("a+") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ClusterError(
                        f"another `hexmq cluster` command is still working on {cluster_dir}"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# --- planning and configuration -------------------------------------------------------------


def wrapper_argv(wrapper: Sequence[str], node: int) -> list[str]:
    """The node wrapper's words for node `node` ({node} replaced by its number)."""
    return [word.replace("{node}", str(node)) for word in wrapper]


def service_argv(
    service: str,
    state: ClusterState,
    node: NodeState,
    *,
    python: str,
    redis_server: str,
    discovery: str | None = None,
    edges_per_node: int = 1,
) -> list[str]:
    """The exact command line of one process of a node (`service`: a SERVICES name, or
    `edge<k>`, the node's k-th edge)."""
    ports = node.ports
    if service == "redis":
        return [redis_server, str(node.dir / "redis.conf")]
    process = service
    service = service_of(process)
    # -P: the manager's working directory must not shadow the installed hexmq and services
    # packages (`python -m` would put it first on sys.path).
    hexmq = [
        *(python, "-P", "-m", "hexmq.cli", service, "--node-id", node.node_id),
        *(("--edge-id", node.process_id(process)) if process != service else ()),
        *("--metrics-listen", ports.addr(ports.metrics(process))),
        *(("--trace-dir", str(state.trace_dir)) if state.trace_dir else ()),
    ]
    if service == "membership":
        return [
            *hexmq,
            *("--listen", ports.addr(ports.membership)),
            *("--consul", state.consul_addr, "--cluster", state.cluster_name),
            *("--partition-addr", ports.addr(ports.partition)),
            *("--mqtt-addr", ports.addr(ports.mqtt)),
            *_membership_discovery(state, discovery),
            *("--partitions", str(state.partitions)),
            *("--rf", str(state.rf)),
        ]
    if service == "partition":
        return [
            *hexmq,
            *("--listen", ports.addr(ports.partition)),
            *("--redis", f"redis://{ports.addr(ports.redis)}/0"),
            *("--membership", ports.addr(ports.membership)),
        ]
    if service == EDGE:
        return [
            *hexmq,
            *("--listen", ports.addr(ports.mqtt)),
            *("--membership", ports.addr(ports.membership)),
            # Several edges of the node share its MQTT port.
            *(("--reuse-port",) if edges_per_node > 1 else ()),
        ]
    raise ValueError(f"unknown service {service!r}")


def node_argv(
    state: ClusterState,
    node: NodeState,
    *,
    python: str,
    redis_server: str,
    discovery: str | None = None,
    service_args: Mapping[str, Sequence[str]] | None = None,
) -> list[str]:
    """The command line of a co-located node's `hexmq node`: a section per hexmq service, each
    its own command line's options (service_argv) and then `service_args`'s for it."""
    argv = [python, "-P", "-m", "hexmq.cli", NODE_PROCESS]
    for service in HEXMQ_SERVICES:
        own = service_argv(
            service, state, node, python=python, redis_server=redis_server, discovery=discovery
        )
        argv += ["--", *own[4:], *(service_args or {}).get(service, ())]
    return argv


def colocated_processes(
    state: ClusterState,
    node: NodeState,
    *,
    wrapper: Sequence[str],
    python: str,
    redis_server: str,
    discovery: str | None,
    service_args: Mapping[str, Sequence[str]] | None,
) -> dict[str, ProcessRecord]:
    """A co-located node's processes: its Redis and its `hexmq node` (node_argv), each under
    the node wrapper."""
    words = wrapper_argv(wrapper, node.node)
    return {
        "redis": ProcessRecord(
            argv=[
                *words,
                *service_argv("redis", state, node, python=python, redis_server=redis_server),
            ],
            log=node.dir / "redis.log",
        ),
        NODE_PROCESS: ProcessRecord(
            argv=words
            + node_argv(
                state,
                node,
                python=python,
                redis_server=redis_server,
                discovery=discovery,
                service_args=service_args,
            ),
            log=node.dir / f"{NODE_PROCESS}.log",
        ),
    }


def node_sections(argv: Sequence[str]) -> dict[str, list[str]]:
    """{service: its section's words after the service's name} of a `hexmq node` argv."""
    start = list(argv).index(NODE_PROCESS)
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for word in argv[start + 1 :]:
        if word == "--":
            current = None
        elif current is None:
            current = sections[word] = []
        else:
            current.append(word)
    return sections


def _membership_discovery(state: ClusterState, discovery: str | None) -> list[str]:
    if discovery is None:
        return ["--expect", str(len(state.nodes))]
    if discovery == "static":
        # No --expect: the first view waits for every node the file lists.
        members = str(state.dir / MEMBERS_FILE)
        return ["--discovery", "static", "--discovery-static-file", members]
    choices = ", ".join(DISCOVERY_CHOICES)
    raise UsageError(f"--discovery must be one of {choices}, got {discovery!r}")


def members_file(state: ClusterState) -> str:
    """DIR/members: every node with its partition service's address, the members file of
    `--discovery static` (docs/discovery.md)."""
    lines = ["# hexmq cluster: NODE_ID PARTITION_ADDR of every node (rewritten by up and start)"]
    lines += [f"{n.node_id} {n.ports.addr(n.ports.partition)}" for n in state.nodes]
    return "\n".join(lines) + "\n"


def agreement_argv(state: ClusterState, python: str) -> list[str]:
    """The embedded agreement server's command line (state in DIR/consul)."""
    return [
        *(python, "-P", "-m", "hexmq.cli", AGREEMENT_SERVER),
        *("--listen", state.consul_addr),
        *("--data-dir", str(state.dir / "consul")),
    ]


def edges_per_node(state: ClusterState) -> int:
    """How many edge processes each node of the cluster runs (`up --edges-per-node`)."""
    return len(state.nodes[0].edges) if state.nodes else 1


def interpreter_of(node: NodeState) -> str:
    """The Python whose hexmq the node's services run (argv[0] of each, the same for all)."""
    return node.record("partition").argv[0]


def set_interpreter(node: NodeState, python: str) -> None:
    """Run the node's services (not its Redis) from `python`'s installation of hexmq from
    their next start: another release's venv, for an upgrade or a rollback. Only argv[0]
    changes: every release takes the options the release before it was started with."""
    for process in node.process_names():
        if process != "redis":
            node.processes[process].argv[0] = python


def cluster_name_of(cluster_dir: Path) -> str:
    """The agents' cluster name for a DIR: its base name, in the characters a KV path segment
    takes (so local clusters sharing an external Consul keep apart)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", cluster_dir.name).strip("-.")[:63]
    return name or "hexmq"


def plan_cluster(
    cluster_dir: Path,
    *,
    nodes: int,
    base_port: int,
    partitions: int,
    rf: int,
    python: str,
    redis_server: str,
    service_args: Mapping[str, Sequence[str]] | None = None,
    trace_dir: Path | None = None,
    consul_addr: str | None = None,
    hosts: Sequence[str] | None = None,
    agreement_listen: tuple[str, int] | None = None,
    node_wrapper: Sequence[str] = (),
    discovery: str | None = None,
    edges_per_node: int = 1,
    colocated: bool = False,
) -> ClusterState:
    """The cluster's full state before anything runs (pure: touches no file). `consul_addr`
    names an external Consul; None: the cluster runs its own agreement server, on
    `agreement_listen` (default 127.0.0.1 and the port after the last node's block). `hosts`:
    node i binds hosts[i-1] (default 127.0.0.1 for all). `node_wrapper` prefixes every command
    line of a node (its {node} replaced by the node number). `discovery`: how the agents
    know who belongs (DISCOVERY_CHOICES, None: --expect N). `edges_per_node`: edge processes per
    node, sharing its MQTT port (separate processes only). `colocated`: each node's hexmq
    services run as one process, `hexmq node`."""
    if hosts is not None and len(hosts) != nodes:
        raise UsageError(f"--hosts lists {len(hosts)} address(es) for {nodes} node(s)")
    if consul_addr is not None and agreement_listen is not None:
        raise UsageError(
            "--agreement-listen places the cluster's own agreement server; with --consul "
            "(an external Consul) there is none"
        )
    host, port = agreement_listen or (LOOPBACK, agreement_port(base_port, nodes))
    state = ClusterState(
        dir=cluster_dir,
        base_port=base_port,
        partitions=partitions,
        rf=rf,
        nodes=[],
        trace_dir=trace_dir,
        consul_addr=consul_addr or f"{host}:{port}",
        cluster_name=cluster_name_of(cluster_dir),
        node_wrapper=list(node_wrapper),
    )
    if consul_addr is None:
        state.consul = ProcessRecord(
            argv=agreement_argv(state, python), log=cluster_dir / "consul.log"
        )
    state.nodes = [
        NodeState(
            node=i, ports=ports, dir=cluster_dir / f"node{i}", processes={}, colocated=colocated
        )
        for i, ports in enumerate(cluster_ports(base_port, nodes, hosts), start=1)
    ]
    for node in state.nodes:
        if colocated:
            node.processes = colocated_processes(
                state,
                node,
                wrapper=node_wrapper,
                python=python,
                redis_server=redis_server,
                discovery=discovery,
                service_args=service_args,
            )
            continue
        for name in [*SERVICES, *edge_names(edges_per_node)[1:]]:
            argv = wrapper_argv(node_wrapper, node.node)
            argv += service_argv(
                name,
                state,
                node,
                python=python,
                redis_server=redis_server,
                discovery=discovery,
                edges_per_node=edges_per_node,
            )
            argv += (service_args or {}).get(service_of(name), ())
            node.processes[name] = ProcessRecord(argv=argv, log=node.dir / f"{name}.log")
    return state


def _redis_quote(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def redis_config(node: NodeState, acl: Sequence[str] = ()) -> str:
    """The node's redis.conf; `acl`: its ACL lines (hexmq.redis_security.acl_lines)."""
    return "\n".join(
        [
            "# Written by `hexmq cluster`; rewritten on every start of the node.",
            f"port {node.ports.redis}",
            f"bind {node.ports.host}",
            # Protected mode admits clients from 127.0.0.1 and ::1 only. A node on an address
            # of its own (--hosts) may reach its Redis from that address (the fault suite
            # gives each node's connections its own source address); Redis listens on a
            # loopback address either way (--hosts takes 127.0.0.0/8 only).
            f"protected-mode {'yes' if node.ports.host == LOOPBACK else 'no'}",
            "daemonize no",
            f"dir {_redis_quote(str(node.dir / 'redis'))}",
            f"logfile {_redis_quote(str(node.processes['redis'].log))}",
            # Durability from the append-only file alone; no RDB snapshots.
            "appendonly yes",
            "appendfsync everysec",
            'save ""',
            # Keep argv and environment as spawned: `ps` then shows which cluster's config a
            # redis-server runs, and the cluster marker in its environment stays readable.
            "set-proc-title no",
            # Who may connect, as what (docs/security.md): the password's hash only.
            *acl,
            "",
        ]
    )


def redis_acl(node: NodeState) -> list[str]:
    """The node's Redis ACL lines (none while its Redis asks for no password), from the
    passwords in its directory."""
    from hexmq.redis_security import HEXMQ_USER, acl_lines, operator_line

    if not node.redis_auth:
        return []
    acl = acl_lines(HEXMQ_USER, (node.dir / REDIS_PASSWORD_FILE).read_text().strip())
    acl.append(operator_line((node.dir / REDIS_OPERATOR_FILE).read_text().strip()))
    return acl


def write_config(state: ClusterState) -> None:
    (state.dir / MEMBERS_FILE).write_text(members_file(state))
    for node in state.nodes:
        (node.dir / "redis").mkdir(parents=True, exist_ok=True)
        (node.dir / "redis.conf").write_text(redis_config(node, redis_acl(node)))


def child_environment(state: ClusterState) -> dict[str, str]:
    env = dict(os.environ)
    env[ENV_MARKER] = str(state.dir)
    env["PYTHONUNBUFFERED"] = "1"  # log lines reach the file as they happen
    return env
