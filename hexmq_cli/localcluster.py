"""Local clusters: N hexmq nodes on one machine as background processes (dev, tests, demos).

The lifecycle behind `hexmq cluster`: up, start, stop, kill, status (add and leave are in
hexmq_cli.localmembers). The cluster's agreement
server (`hexmq consul-dev`, unless the agents use an external Consul) starts first and stops
last; a node's processes start in SERVICES order, each once the previous one serves, and stop
in reverse (a co-located node, `up`'s default: redis, then `hexmq node`, which runs the three
hexmq services in one process). Where everything lives (ports, DIR, cluster.json) is
hexmq_cli.clusterstate, and how a process is spawned and signalled safely is hexmq_cli.procs.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from hexmq.hashring import partition_of
from hexmq.membership.view import master_of
from hexmq_cli import linkstatus, localsecurity, procs
from hexmq_cli.clusterstate import (
    AGREEMENT_SERVER,
    DEFAULT_BASE_PORT,
    DEFAULT_PARTITIONS,
    EDGE,
    ENV_MARKER,
    NODE_PROCESS,
    SERVICES,
    STATE_FILE,
    ClusterError,
    ClusterState,
    NodeState,
    UsageError,
    busy_ports,
    child_environment,
    cluster_lock,
    interpreter_of,
    load_state,
    plan_cluster,
    redis_acl,
    redis_config,
    require_state,
    save_state,
    service_of,
    set_interpreter,
    validate_cluster_args,
    write_config,
)

if TYPE_CHECKING:
    from hexmq.api.common.v1 import common_pb2
    from hexmq.api.membership.v1 import membership_pb2

log = logging.getLogger("hexmq.cluster")

DEFAULT_TIMEOUT: Final = 30.0
DEFAULT_GRACE: Final = 10.0
# Grace for undoing a failed start: nothing there is worth waiting long for.
ABORT_GRACE: Final = 5.0
# CONNACK return codes (3.1.1) showing that an edge serves clients whose session lives on the
# probed node: accepted (0), or refused for credentials (4 bad user name or password, 5 not
# authorized: an edge with a password file and no --allow-anonymous), which the edge checks
# only once it has a link to the session's partition node (before that the CONNECT waits, and
# past the edge's --failover-hold it is refused with 3).
SERVING_CODES: Final = frozenset({0, 4, 5})


class StartFailure(ClusterError):
    """A process did not come up; `log_tail` holds the end of its log for the operator."""

    def __init__(self, message: str, log_path: Path) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail = procs.log_tail(log_path)


# --- starting -------------------------------------------------------------------------------


def _ready(service: str, node: NodeState) -> bool:
    port, host = node.ports.of(service), node.ports.host
    if service == "redis":
        return procs.redis_ready(port, host=host, credentials=localsecurity.redis_login(node))
    if service != EDGE and service_of(service) == EDGE:
        # A further edge of the node: its siblings may answer on the shared port already.
        identity = node.processes[service].identity
        return identity is not None and procs.listens_on(identity.pid, port, host)
    return all(procs.tcp_accepts(p, host=host) for p in node.ports.of_process(service))


def _layers(nodes: Sequence[NodeState]) -> list[str]:
    """The services of `nodes` in start order: SERVICES, or a co-located node's redis and
    node (a layer starts every process of its service: a node's edges, `--edges-per-node`)."""
    order = [*SERVICES, NODE_PROCESS]
    present = {service_of(p) for n in nodes for p in n.process_names()}
    return [p for p in order if p in present]


def _check_alive(started: Sequence[tuple[NodeState, str]]) -> None:
    """Fail fast, naming the process, if anything started by this command has died."""
    for node, service in started:
        record = node.processes[service]
        if not record.running():
            assert record.identity is not None
            how = procs.describe_exit(record.identity.pid)
            raise StartFailure(
                f"node {node.node} {service} (pid {record.identity.pid}) {how} during startup "
                f"(log: {record.log})",
                record.log,
            )


def _spawn(state: ClusterState, node: NodeState, service: str) -> None:
    record = node.processes[service]
    now = datetime.now(UTC).isoformat(timespec="seconds")
    with record.log.open("a") as f:
        f.write(f"---- hexmq cluster: starting {service} at {now}: {' '.join(record.argv)}\n")
    env = localsecurity.environment(
        child_environment(state), localsecurity.service_variables(state, node, service)
    )
    record.identity = procs.spawn(record.argv, record.log, env)
    record.started_at = now
    save_state(state)
    log.info(
        "node %d: started %s (pid %d, %s)",
        node.node,
        service,
        record.identity.pid,
        node.ports.addr(node.ports.of(service)),
    )


def _start_layer(
    state: ClusterState,
    targets: Sequence[tuple[NodeState, str]],
    timeout: float,
    started: list[tuple[NodeState, str]],
) -> None:
    """Start each target (node, process) of one layer, then wait until each one serves."""
    for node, name in targets:
        _spawn(state, node, name)
        started.append((node, name))

    def failure(node: NodeState, name: str) -> StartFailure:
        addr = node.ports.addr(node.ports.of(name))
        return StartFailure(
            f"node {node.node} {name} is not serving on {addr} after {timeout:g} s "
            f"(log: {node.processes[name].log})",
            node.processes[name].log,
        )

    deadline = time.monotonic() + timeout
    _wait_each(targets, lambda n, name: _ready(name, n), deadline, started, failure, 0.05)


def _wait_each(
    pending: Sequence[tuple[NodeState, str]],
    ready: Callable[[NodeState, str], bool],
    deadline: float,
    started: list[tuple[NodeState, str]],
    failure: Callable[[NodeState, str], StartFailure],
    pause: float,
) -> None:
    """Until `ready` holds for every pending (node, process), failing fast if anything this
    command started died; at the deadline, `failure` of the first one still waiting."""
    while pending:
        _check_alive(started)
        pending = [(n, name) for n, name in pending if not ready(n, name)]
        if pending and time.monotonic() >= deadline:
            raise failure(*pending[0])
        if pending:
            time.sleep(pause)


def _client_id_mastered_by(master: str, table: Sequence[tuple[str, ...]]) -> str:
    """A fresh probe client id whose session partition has `master` as its master."""
    for _ in range(1_000_000):
        client_id = procs.probe_client_id()
        if table[partition_of(client_id, len(table))][0] == master:
            return client_id
    raise ClusterError(f"found no client id whose partition is mastered by {master}")


def agreed_view(
    state: ClusterState, nodes: Sequence[NodeState], timeout: float = 2.0
) -> membership_pb2.View | None:
    """The newest view that the membership agents of these nodes serve (GetView), or None
    while none of them has one."""
    import grpc  # imported here: `hexmq cluster` commands that do not ask stay fast

    from hexmq.api.membership.v1 import membership_pb2, membership_pb2_grpc

    best = None
    for node in nodes:
        if not node.record("membership").running():
            continue
        try:
            with localsecurity.node_channel(state, node, "membership") as channel:
                stub = membership_pb2_grpc.MembershipServiceStub(channel)
                view = stub.GetView(membership_pb2.GetViewRequest(), timeout=timeout)
        except grpc.RpcError:
            continue
        if best is None or view.epoch > best.epoch:
            best = view
    return best


def _probe_pairs(
    state: ClusterState, targets: Sequence[NodeState], view: membership_pb2.View
) -> list[tuple[NodeState, str]]:
    """(edge node, master node id) pairs to probe: every running node's edge must accept a
    client whose session lives on each running node, where one side is a target. One CONNECT
    per edge is not enough: an edge that has not yet linked to a peer's partition service
    holds that peer's clients' CONNECTs (and refuses them with 3 past its --failover-hold), and
    a test or user would meet that delay. Masters are those of the agreed view (`view`)."""
    members = {m.node_id for m in view.members}
    masters = {master_of(pa) for pa in view.partitions} & members
    running = [n for n in state.nodes if all(r.running() for r in n.processes.values())]
    target_ids = {n.node_id for n in targets}
    return [
        (edge, master.node_id)
        for edge in running
        for master in running
        if master.node_id in masters and target_ids & {edge.node_id, master.node_id}
    ]


def _wait_mqtt(
    state: ClusterState,
    targets: Sequence[NodeState],
    timeout: float,
    started: list[tuple[NodeState, str]],
) -> None:
    """Wait until the agreed view admits every target node, then until every edge accepts
    clients whose sessions live on each running node (by that view's table)."""
    deadline = time.monotonic() + timeout
    view = _wait_admitted(state, targets, deadline, timeout, started)
    table = [tuple(pa.replicas) for pa in view.partitions]
    pending = _probe_pairs(state, targets, view)
    last: dict[tuple[int, str], int | None] = {}
    while pending:
        _check_alive(started)
        still = []
        for edge, master in pending:
            client_id = _client_id_mastered_by(master, table)
            answer = procs.mqtt_connect_answer(edge.ports.mqtt, client_id, host=edge.ports.host)
            last[edge.node, master] = answer.code
            if answer.code in SERVING_CODES:
                continue
            if answer.refused and _routes_the_view(edge, view.epoch):
                # The edge turned the probe itself away, for a client limit (a --max-packet-size
                # below the probe's CONNECT, say), not for want of its partitions: its /readyz
                # says whether it routes every partition of this view (or a later one).
                continue
            still.append((edge, master))
        pending = still
        if pending and time.monotonic() >= deadline:
            edge, master = pending[0]
            code = last.get((edge.node, master))
            said = "no CONNACK" if code is None else f"CONNACK return code {code}"
            log_path = edge.record("edge").log
            addr = edge.ports.addr(edge.ports.mqtt)
            raise StartFailure(
                f"node {edge.node} does not accept MQTT clients whose session lives on {master} "
                f"on {addr} after {timeout:g} s (last answer: {said}; log: {log_path})",
                log_path,
            )
        if pending:
            time.sleep(0.1)
    _wait_edges_ready(targets, view.epoch, deadline, timeout, started)
    for node in targets:
        addr = node.ports.addr(node.ports.mqtt)
        log.info("node %d: accepting MQTT connections on %s", node.node, addr)


def _wait_edges_ready(
    targets: Sequence[NodeState],
    epoch: int,
    deadline: float,
    timeout: float,
    started: list[tuple[NodeState, str]],
) -> None:
    """With several edges per node the MQTT probes reach whichever edge the kernel picks: wait
    until each edge of the targets routes every partition of view `epoch` (its /readyz)."""

    def failure(node: NodeState, name: str) -> StartFailure:
        return StartFailure(
            f"node {node.node} {name} does not route every partition of view {epoch} after "
            f"{timeout:g} s (its /readyz; log: {node.processes[name].log})",
            node.processes[name].log,
        )

    _wait_each(
        [(n, name) for n in targets if len(n.edges) > 1 for name in n.edges],
        lambda n, name: _routes_the_view(n, epoch, n.ports.metrics(name)),
        deadline,
        started,
        failure,
        0.1,
    )


def _routes_the_view(edge: NodeState, epoch: int, metrics_port: int | None = None) -> bool:
    """Whether the edge's /readyz (default: the node's first edge's) says it routes every
    partition of view `epoch` or later."""
    port = edge.ports.metrics(EDGE) if metrics_port is None else metrics_port
    ready_at = procs.ready_view_epoch(port, host=edge.ports.host)
    return ready_at is not None and ready_at >= epoch


def _wait_admitted(
    state: ClusterState,
    targets: Sequence[NodeState],
    deadline: float,
    timeout: float,
    started: list[tuple[NodeState, str]],
) -> membership_pb2.View:
    """The first agreed view that lists every target node as a member."""
    wanted = {n.node_id for n in targets}
    view = None
    while True:
        _check_alive(started)
        view = agreed_view(state, targets)
        if view is not None and wanted <= {m.node_id for m in view.members}:
            log.info("view %d admits node(s) %s", view.epoch, ", ".join(sorted(wanted)))
            return view
        if time.monotonic() >= deadline:
            node = targets[0]
            log_path = node.record("membership").log
            seen = (
                "no view agreed"
                if view is None
                else f"view {view.epoch} has members {', '.join(m.node_id for m in view.members)}"
            )
            raise StartFailure(
                f"the cluster view does not admit node(s) {', '.join(sorted(wanted))} after "
                f"{timeout:g} s ({seen}; log: {log_path})",
                log_path,
            )
        time.sleep(0.1)


def start_agreement(state: ClusterState, timeout: float) -> bool:
    """Start the cluster's own agreement server unless it runs (or the agents use an external
    Consul); True if this call started it."""
    record = state.consul
    if record is None or record.running():
        return False
    if procs.port_in_use(state.consul_port, state.consul_host):
        raise ClusterError(f"port(s) already in use: {state.consul_addr} (agreement server)")
    now = datetime.now(UTC).isoformat(timespec="seconds")
    with record.log.open("a") as f:
        f.write(f"---- hexmq cluster: starting consul-dev at {now}: {' '.join(record.argv)}\n")
    env = localsecurity.environment(
        child_environment(state), localsecurity.agreement_variables(state)
    )
    record.identity = procs.spawn(record.argv, record.log, env)
    record.started_at = now
    save_state(state)
    log.info(
        "agreement server: started consul-dev (pid %d, %s)",
        record.identity.pid,
        state.consul_addr,
    )
    deadline = time.monotonic() + timeout
    try:
        while not procs.tcp_accepts(state.consul_port, host=state.consul_host):
            if not record.running():
                how = procs.describe_exit(record.identity.pid)
                raise StartFailure(
                    f"the agreement server (pid {record.identity.pid}) {how} during startup "
                    f"(log: {record.log})",
                    record.log,
                )
            if time.monotonic() >= deadline:
                raise StartFailure(
                    f"the agreement server is not serving on {state.consul_addr} after "
                    f"{timeout:g} s (log: {record.log})",
                    record.log,
                )
            time.sleep(0.05)
    except BaseException:
        # The caller stops what it started only once this returns: a server that never
        # served was left running (a loaded machine's `up` timed out and kept consul-dev).
        stop_agreement(state, ABORT_GRACE)
        raise
    return True


def stop_agreement(state: ClusterState, grace: float) -> list[str]:
    record = state.consul
    if record is None or record.identity is None or not record.running():
        return []
    killed = procs.terminate([record.identity], grace)
    if killed:
        return [
            f"the agreement server (pid {record.identity.pid}) did not stop within {grace:g} s "
            "and was killed"
        ]
    return []


def _start_nodes(state: ClusterState, targets: Sequence[NodeState], timeout: float) -> None:
    """Start whatever is not running on the target nodes, layer by layer across the nodes
    (every redis, then every membership ...), so a service that looks for its peers' service
    of the same layer at startup finds it already serving. On any failure or interrupt, stop
    what this call started, so a failed start leaves nothing running."""
    started: list[tuple[NodeState, str]] = []
    agreement_started = False
    try:
        agreement_started = start_agreement(state, timeout)
        for service in _layers(targets):
            todo = [
                (n, name)
                for n in targets
                for name in n.processes_of(service)
                if not n.processes[name].running()
            ]
            _start_layer(state, todo, timeout, started)
        _wait_mqtt(state, targets, timeout, started)
    except BaseException:
        if started:
            log.info("start failed: stopping the %d process(es) it started", len(started))
            _stop_processes([(n, s) for n, s in reversed(started)], ABORT_GRACE)
        if agreement_started:
            stop_agreement(state, ABORT_GRACE)
        save_state(state)
        raise


def _refuse_if_running(cluster_dir: Path, previous: ClusterState | None) -> None:
    if previous is not None:
        running = [
            f"node {n.node} {s} pid {r.identity.pid}"
            for n in previous.nodes
            for s, r in n.processes.items()
            if r.identity is not None and r.running()
        ]
        server = previous.consul
        if server is not None and server.identity is not None and server.running():
            running.append(f"agreement server pid {server.identity.pid}")
        if running:
            raise ClusterError(
                f"{cluster_dir} holds a running cluster ({', '.join(running[:4])}"
                f"{', ...' if len(running) > 4 else ''}); stop it first with "
                f"`hexmq cluster down --dir {cluster_dir}`"
            )
    strays = procs.pids_with_env(ENV_MARKER, str(cluster_dir))
    if strays:
        raise ClusterError(
            f"processes {', '.join(map(str, strays))} of an earlier cluster in {cluster_dir} are "
            f"still running but not recorded in {STATE_FILE}; stop them first"
        )


def find_redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise ClusterError("redis-server not found on PATH (Debian: apt-get install redis-server)")
    return path


def up(
    cluster_dir: Path,
    *,
    nodes: int,
    base_port: int = DEFAULT_BASE_PORT,
    partitions: int = DEFAULT_PARTITIONS,
    rf: int = 1,
    timeout: float = DEFAULT_TIMEOUT,
    service_args: Mapping[str, Sequence[str]] | None = None,
    trace_dir: Path | None = None,
    consul: str | None = None,
    hosts: Sequence[str] | None = None,
    agreement_listen: tuple[str, int] | None = None,
    node_wrapper: Sequence[str] = (),
    discovery: str | None = None,
    insecure_cluster: bool = False,
    edges_per_node: int = 1,
    colocated: bool = False,
) -> ClusterState:
    """Start a cluster in `cluster_dir` and wait until every node answers MQTT CONNECT.
    `service_args` adds arguments to a service's command line on every node (e.g.
    {"edge": ["--sys-interval=1"]}). `consul` names an external Consul (HOST:PORT) for the
    membership agents; None: the cluster starts its own agreement server first, on
    `agreement_listen` if given. `hosts`: node i binds every port of it on hosts[i-1].
    `node_wrapper`: every process of node i runs as `node_wrapper <argv>` ({node} -> i). `discovery`
    "static" makes the agents admit the nodes of DIR/members (docs/discovery.md).

    Secure by default (docs/security.md): the cluster's CA and a certificate per service
    (mutual TLS on every gRPC link), and the embedded agreement server's ACL token, are made
    under DIR (kept across restarts of the same DIR). `insecure_cluster`: the nodes' links in
    plain text instead (each service logs a warning). `edges_per_node`: edge processes per
    node, sharing its MQTT port (--reuse-port), each with its own id (n<i>-e<k>), certificate
    and metrics port (separate processes only). `colocated`: each node's hexmq services run as
    one process (`hexmq node`), calling each other in process."""
    validate_cluster_args(
        nodes=nodes,
        base_port=base_port,
        partitions=partitions,
        rf=rf,
        edges_per_node=edges_per_node,
        colocated=colocated,
    )
    cluster_dir = cluster_dir.absolute()
    try:
        cluster_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ClusterError(f"cannot create {cluster_dir}: {exc.strerror}") from exc
    with cluster_lock(cluster_dir):
        previous = load_state(cluster_dir)
        _refuse_if_running(cluster_dir, previous)
        shape = (nodes, partitions)
        if (
            previous is not None
            and previous.served
            and ((len(previous.nodes), previous.partitions) != shape)
        ):
            # Its Redis data is placed for that shape: other nodes or partitions would
            # silently lose sessions. Restarting the same shape keeps the data.
            raise ClusterError(
                f"{cluster_dir} holds the data of a cluster with {len(previous.nodes)} node(s) "
                f"and {previous.partitions} partitions; use the same --nodes and --partitions, "
                "another --dir, or delete the directory"
            )
        state = plan_up(
            cluster_dir,
            nodes=nodes,
            base_port=base_port,
            partitions=partitions,
            rf=rf,
            redis_server=find_redis_server(),
            service_args=service_args,
            trace_dir=trace_dir,
            consul=consul,
            hosts=hosts,
            agreement_listen=agreement_listen,
            node_wrapper=node_wrapper,
            discovery=discovery,
            insecure_cluster=insecure_cluster,
            edges_per_node=edges_per_node,
            colocated=colocated,
        )
        state.served = previous is not None and previous.served
        busy = busy_ports(
            [n.ports for n in state.nodes],
            (state.consul_host, state.consul_port) if state.consul else None,
            edges_per_node,
        )
        if busy:
            raise ClusterError(f"port(s) already in use: {', '.join(busy)}")
        write_config(state)
        save_state(state)
        _start_nodes(state, state.nodes, timeout)
        state.served = True
        save_state(state)
        return state


def plan_up(
    cluster_dir: Path,
    *,
    nodes: int,
    base_port: int = DEFAULT_BASE_PORT,
    partitions: int = DEFAULT_PARTITIONS,
    rf: int = 1,
    redis_server: str = "redis-server",
    service_args: Mapping[str, Sequence[str]] | None = None,
    trace_dir: Path | None = None,
    consul: str | None = None,
    hosts: Sequence[str] | None = None,
    agreement_listen: tuple[str, int] | None = None,
    node_wrapper: Sequence[str] = (),
    discovery: str | None = None,
    insecure_cluster: bool = False,
    edges_per_node: int = 1,
    colocated: bool = False,
) -> ClusterState:
    """The cluster `up` starts (its arguments, less `timeout`): every process planned, with
    the secrets it is given made under `cluster_dir` (kept when they exist), and nothing
    started. `planned_processes` says what each process would run with. `up` itself starts
    from this; other deployments are checked against it (tests/support/kubernetes.py)."""
    validate_cluster_args(
        nodes=nodes,
        base_port=base_port,
        partitions=partitions,
        rf=rf,
        edges_per_node=edges_per_node,
        colocated=colocated,
    )
    state = plan_cluster(
        cluster_dir.absolute(),
        nodes=nodes,
        base_port=base_port,
        partitions=partitions,
        rf=rf,
        python=sys.executable,
        redis_server=redis_server,
        service_args=service_args,
        trace_dir=trace_dir.absolute() if trace_dir else None,
        consul_addr=consul,
        hosts=hosts,
        agreement_listen=agreement_listen,
        node_wrapper=node_wrapper,
        discovery=discovery,
        edges_per_node=edges_per_node,
        colocated=colocated,
    )
    secure(state, insecure_cluster=insecure_cluster)
    return state


@dataclass(frozen=True, slots=True)
class PlannedProcess:
    """One process of a planned cluster, as `up` starts it."""

    # Its node's number, None for the cluster's agreement server.
    node: int | None
    # redis, membership, partition, edge (edge2 ...: the node's further edges), or consul-dev
    # (the agreement server).
    service: str
    argv: tuple[str, ...]
    # The variables `hexmq cluster` gives it on top of its own environment (secrets by file
    # name: hexmq_cli.localsecurity).
    env: Mapping[str, str]
    # Redis: the redis.conf its argv names, as `up` writes it (secrets hashed).
    config: str | None = None


def planned_processes(state: ClusterState) -> list[PlannedProcess]:
    """Every process of `state` in start order: the agreement server (when the cluster runs
    its own), then each node's SERVICES; with the argv, variables and Redis config that
    `start_agreement`, `_spawn` and `write_config` give them. Reads the secrets `plan_up` made
    (for Redis's ACL lines); starts and writes nothing."""
    out = []
    if state.consul is not None:
        env = localsecurity.agreement_variables(state)
        out.append(PlannedProcess(None, AGREEMENT_SERVER, tuple(state.consul.argv), env))
    out.extend(
        PlannedProcess(
            node.node,
            service,
            tuple(node.processes[service].argv),
            localsecurity.service_variables(state, node, service),
            redis_config(node, redis_acl(node)) if service == "redis" else None,
        )
        for node in state.nodes
        for service in node.process_names()
    )
    return out


def secure(state: ClusterState, *, insecure_cluster: bool) -> None:
    """Give a newly planned cluster its secrets and say what each node runs as: certificates
    (unless `insecure_cluster`), a Redis password per node, the agreement server's token."""
    mode = localsecurity.PLAIN if insecure_cluster else localsecurity.TLS
    if not insecure_cluster:
        localsecurity.ensure_certificates(state)
    for node in state.nodes:
        node.security = mode
        localsecurity.ensure_redis_password(node)
        node.redis_auth = True
    if state.consul is not None:
        localsecurity.ensure_consul_token(state)
        state.consul_acl = True


def check_interpreter(python: str) -> str:
    """`python` as an absolute path, if it is a Python that can import hexmq (UsageError
    naming what is wrong otherwise)."""
    path = Path(python).absolute()
    if not path.is_file() or not os.access(path, os.X_OK):
        raise UsageError(f"--python {python}: not an executable file")
    try:
        probe = subprocess.run(
            [str(path), "-P", "-c", "import hexmq.cli; print('hexmq', hexmq.__version__)"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc})") from None
    if probe.returncode != 0 or not probe.stdout.startswith("hexmq "):
        last = (probe.stderr.strip().splitlines() or [f"exit {probe.returncode}"])[-1]
        raise UsageError(f"--python {python}: cannot import hexmq.cli ({last})")
    return str(path)


def start_node(
    cluster_dir: Path,
    number: int,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    python: str | None = None,
) -> NodeState:
    """Start the processes of one node that are not running, with the config and data it had.
    `python` (a path) runs its services from that Python's hexmq from now on: another
    release's installation, for a rolling upgrade or a rollback; the node must be stopped."""
    cluster_dir = cluster_dir.absolute()
    state = require_state(cluster_dir)
    state.node(number)  # a bad node number is a usage error, before taking the lock
    interpreter = check_interpreter(python) if python is not None else None
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        node = state.node(number)
        if interpreter is not None and interpreter != interpreter_of(node):
            running = [s for s, r in node.processes.items() if s != "redis" and r.running()]
            if running:
                raise UsageError(
                    f"node {number} still runs {', '.join(running)} from "
                    f"{interpreter_of(node)}: stop it before starting it with --python"
                )
            log.info("node %d: services run from %s from now on", number, interpreter)
            set_interpreter(node, interpreter)
            save_state(state)
        busy = [
            f"{node.ports.addr(port)} (node {number} {s})"
            for s, r in node.processes.items()
            if not r.running()
            for port in _own_ports(node, s)
            if procs.port_in_use(port, node.ports.host)
        ]
        if busy:
            raise ClusterError(f"port(s) already in use: {', '.join(busy)}")
        write_config(state)
        _start_nodes(state, [node], timeout)
        return node


def _own_ports(node: NodeState, name: str) -> list[int]:
    """The ports a process of the node binds that no other process may hold: a further edge's
    metrics port (its MQTT port is its siblings' too), the node's MQTT port for its first edge
    only while none of the others runs."""
    if service_of(name) != EDGE:
        return list(node.ports.of_process(name))
    if name != EDGE:
        return [node.ports.metrics(name)]
    siblings = any(node.processes[e].running() for e in node.edges if e != EDGE)
    return [] if siblings else [node.ports.mqtt]


# --- stopping -------------------------------------------------------------------------------


def _stop_processes(
    targets: Sequence[tuple[NodeState, str]], grace: float, *, leave: bool = False
) -> list[str]:
    """Stop the targets in reverse start order, one layer at a time (all edges, then all
    partition services ...), so that each service can still reach the ones below it while it
    shuts down. Returns a note for every process that needed SIGKILL.

    hexmq services get SIGINT, their plain stop; with `leave`, SIGTERM, which makes a node
    leave the cluster first (docs/operations.md, "Leaving"). Redis gets SIGTERM."""
    notes = []
    try:
        for service in reversed(_layers([n for n, _ in targets])):
            layer = [
                (node, name, node.processes[name].identity)
                for node, name in targets
                if service_of(name) == service
            ]
            idents = [i for _, _, i in layer if i is not None]
            sig = signal.SIGTERM if leave or service == "redis" else signal.SIGINT
            killed = set(procs.terminate(idents, grace, sig))
            notes += [
                f"node {node.node} {name} (pid {ident.pid}) did not stop within {grace:g} s "
                "and was killed"
                for node, name, ident in layer
                if ident in killed
            ]
    except KeyboardInterrupt:
        # Interrupted while waiting (a second Ctrl-C): finish at once rather than leave the
        # lower layers running.
        procs.kill([i for n, s in targets if (i := n.processes[s].identity) is not None])
        raise
    return notes


def stop_nodes(
    cluster_dir: Path, numbers: Sequence[int] | None, *, grace: float = DEFAULT_GRACE
) -> tuple[int, list[str]]:
    """Gracefully stop the given nodes (None: all). Returns (processes stopped, notes)."""
    cluster_dir = cluster_dir.absolute()
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        nodes = state.nodes if numbers is None else [state.node(i) for i in numbers]
        targets = [(n, s) for n in nodes for s in n.process_names() if n.processes[s].running()]
        notes = _stop_processes(targets, grace)
        count = len(targets)
        if numbers is None:  # the whole cluster: its agreement server last
            server = state.consul
            if server is not None and server.running():
                notes += stop_agreement(state, grace)
                count += 1
        return count, notes


def kill_node(cluster_dir: Path, number: int) -> int:
    """SIGKILL every process of the node, Redis included (a crash, for fault tests)."""
    cluster_dir = cluster_dir.absolute()
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        node = state.node(number)
        idents = [
            r.identity for r in node.processes.values() if r.identity is not None and r.running()
        ]
        procs.kill(idents)
        return len(idents)


# --- status ---------------------------------------------------------------------------------


def node_status(state: ClusterState, node: NodeState) -> dict[str, Any]:
    """What is known about one node right now: its processes, and what its partition service
    says of itself (PartitionService.Status) under "partitions" (replication lag joins it
    with the cluster data plane)."""
    processes = {}
    for service, record in node.processes.items():
        processes[service] = {
            "pid": record.identity.pid if record.identity else None,
            "alive": record.running(),
            "port": node.ports.of(service),
            "log": str(record.log),
            "started_at": record.started_at,
        }
    return {
        "node": node.node,
        "node_id": node.node_id,
        "host": node.ports.host,
        "mqtt_port": node.ports.mqtt,
        "alive": all(p["alive"] for p in processes.values()),
        "processes": processes,
        "security": node.security,
        "colocated": node.colocated,
        "partitions": partition_status(state, node) if node.record("partition").running() else None,
        # Links down and connections waiting on them, from the services' metrics (G9).
        "links": linkstatus.read(node.ports.host, _link_metrics(node)),
    }


def _link_metrics(node: NodeState) -> dict[str, int]:
    """Where to read a node's links from: its edges' and partition service's metrics ports,
    or, co-located, one of them (the process has one registry: each port shows it all)."""
    if node.colocated:
        alive = node.processes[NODE_PROCESS].running()
        return {NODE_PROCESS: node.ports.metrics("edge")} if alive else {}
    return {
        s: node.ports.metrics(s) for s in (*node.edges, "partition") if node.processes[s].running()
    }


def partition_status(state: ClusterState, node: NodeState, timeout: float = 2.0) -> dict[str, Any]:
    """The partition service's own account: partitions by role, sessions, queued messages."""
    import grpc  # imported here: `hexmq cluster` commands that do not ask stay fast

    from hexmq.api.partition.v1 import partition_pb2, partition_pb2_grpc

    try:
        with localsecurity.node_channel(state, node, "partition") as channel:
            reply = partition_pb2_grpc.PartitionServiceStub(channel).Status(
                partition_pb2.StatusRequest(), timeout=timeout
            )
    except grpc.RpcError as exc:
        return {"error": f"{exc.code().name}: {exc.details()}"}
    roles: dict[str, int] = {}
    # follower node id -> its replication of this node's partitions, summed.
    followers: dict[str, dict[str, Any]] = {}
    # Followers of this node's partitions not yet in sync: what a rebalance still copies.
    catching_up = {"replicas": 0, "entries": 0, "bytes": 0}
    for p in reply.partitions:
        roles[p.role] = roles.get(p.role, 0) + 1
        for f in p.followers:
            if not f.in_sync:
                catching_up["replicas"] += 1
                catching_up["entries"] += f.lag
                catching_up["bytes"] += f.bytes_left
            row = followers.setdefault(
                f.node_id, {"partitions": 0, "in_sync": 0, "lag": 0, "max_lag": 0, "states": {}}
            )
            row["partitions"] += 1
            row["in_sync"] += int(f.in_sync)
            row["lag"] += f.lag
            row["max_lag"] = max(row["max_lag"], f.lag)
            row["states"][f.state] = row["states"].get(f.state, 0) + 1
    return {
        "roles": roles,
        "followers": followers,
        "catching_up": catching_up,
        "sessions": sum(p.sessions for p in reply.partitions),
        "connected_sessions": reply.connected_sessions,
        "queued_messages": sum(p.queued_messages for p in reply.partitions),
        "edges": reply.edges,
        "messages_in": reply.messages_in,
        "messages_out": reply.messages_out,
    }


def agreement_status(state: ClusterState) -> dict[str, Any]:
    record = state.consul
    return {
        "addr": state.consul_addr,
        "embedded": record is not None,
        "pid": record.identity.pid if record and record.identity else None,
        "alive": record.running() if record else None,
        "log": str(record.log) if record else None,
        "cluster_name": state.cluster_name,
    }


def membership_status(state: ClusterState, timeout: float = 2.0) -> dict[str, Any] | None:
    """What the membership agent of the first running node knows of the cluster: the view
    epoch, members with their liveness, recent failovers (None: no agent answers)."""
    import grpc

    from hexmq.api.membership.v1 import membership_pb2, membership_pb2_grpc

    for node in state.nodes:
        if not node.record("membership").running():
            continue
        try:
            with localsecurity.node_channel(state, node, "membership") as channel:
                stub = membership_pb2_grpc.MembershipServiceStub(channel)
                reply = stub.Status(membership_pb2.MembershipStatusRequest(), timeout=timeout)
        except grpc.RpcError:
            continue
        view = reply.view if reply.HasField("view") else None
        return {
            "from_node": reply.node_id,
            "consul_reachable": reply.consul_reachable,
            "lease_valid": reply.lease_valid,
            "view_epoch": view.epoch if view else None,
            "members": [
                {
                    "node_id": m.node_id,
                    "in_view": m.in_view,
                    "registered": m.registered,
                    "incarnation": m.incarnation,
                    "probe": m.probe,
                    "suspected_by": list(m.suspected_by),
                    # What the node registered it speaks ("" from a v0.2.0 agent), and why
                    # it is not admitted for that, if it is not.
                    "protocol": _support(m.protocol) if m.HasField("protocol") else "",
                    "not_admitted": m.not_admitted,
                }
                for m in reply.members
            ],
            # What the members speak together by this view (a v0.2.0 agent's view: 1, none).
            "protocol": {
                "version": (view.protocol_version or 1) if view else None,
                "features": sorted(view.features) if view else [],
            },
            "partitions": _view_roles(view) if view else {},
            "rebalance": _view_rebalance(view) if view else None,
            "recent_failovers": [
                {
                    "partition": r.partition,
                    "kind": r.kind,
                    "from": r.from_node,
                    "to": r.to_node,
                    "epoch": r.epoch,
                    "view_epoch": r.view_epoch,
                    "at_ms": r.at_ms,
                }
                for r in reply.recent
            ],
        }
    return None


def _support(message: common_pb2.ProtocolSupport) -> str:
    """'1..2 +zlib-snapshots' (a support that says nothing: v0.2.0's, '1')."""
    from hexmq.node_protocol import ProtocolError, Support

    try:
        return Support.from_proto(message).describe()
    except ProtocolError as exc:
        return f"invalid ({exc})"


def _view_rebalance(view: membership_pb2.View) -> dict[str, Any]:
    """What of the view is still moving (docs/failover.md, "Join" and "Leave")."""
    from hexmq.membership.view import partition_health

    health = partition_health(view)
    return {
        "moving": health.moving,
        "under_replicated": health.under_replicated,
        "offline": health.offline,
        "joining": list(view.joining),
        "leaving": list(view.leaving),
        "target_members": list(view.target_members),
    }


def _view_roles(view: membership_pb2.View) -> dict[str, dict[str, int]]:
    """Per node: partitions it masters and follows in the view, and of those how many it
    holds in sync."""
    roles: dict[str, dict[str, int]] = {}
    for pa in view.partitions:
        for i, node in enumerate(pa.replicas):
            row = roles.setdefault(node, {"masters": 0, "follows": 0, "in_sync": 0})
            row["masters" if i == 0 else "follows"] += 1
            row["in_sync"] += int(node in pa.in_sync)
    return roles


def cluster_status(
    cluster_dir: Path,
    gather: Callable[[ClusterState, NodeState], dict[str, Any]] = node_status,
) -> dict[str, Any]:
    cluster_dir = cluster_dir.absolute()
    state = require_state(cluster_dir)
    nodes = [gather(state, n) for n in state.nodes]
    agreement = agreement_status(state)
    membership = (
        membership_status(state)
        if any(n.record("membership").running() for n in state.nodes)
        else None
    )
    known = {p["pid"] for n in nodes for p in n["processes"].values() if p["alive"]}
    if agreement["alive"]:
        known.add(agreement["pid"])
    strays = [p for p in procs.pids_with_env(ENV_MARKER, str(cluster_dir)) if p not in known]
    return {
        "dir": str(cluster_dir),
        "base_port": state.base_port,
        "partitions": state.partitions,
        "rf": state.rf,
        "agreement": agreement,
        "membership": membership,
        "nodes": nodes,
        # Processes started for this DIR that cluster.json does not know (a manager killed
        # between spawn and save); listed so an operator can deal with them by hand.
        "strays": strays,
    }
