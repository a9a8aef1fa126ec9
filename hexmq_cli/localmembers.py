"""Growing and shrinking a local cluster: `hexmq cluster add` and `hexmq cluster leave`.

`add` plans node N+1 of the cluster in DIR (ports, command lines, data directory) and starts
it like `start` does; the running nodes admit it to the view and the planner moves about 1/(N+1)
of the partitions onto it (docs/failover.md, "Join"). `leave NODE` asks the node's membership
agent to take it out of the cluster and waits until the view has let it go (master roles handed
over, RF restored on the others), then stops its processes with SIGTERM, the services' leave
signal: the edge then disconnects its clients with DISCONNECT 0x8B (docs/operations.md,
"Leaving"). A node that left stays in cluster.json, stopped, with its data; `start NODE` brings
it back as a joining node.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from hexmq_cli import localsecurity, procs
from hexmq_cli.clusterstate import (
    EDGE,
    HEXMQ_SERVICES,
    INTERNAL_OFFSET,
    MAX_NODES,
    METRICS_SLOTS,
    NODE_STRIDE,
    SERVICES,
    ClusterError,
    ClusterState,
    NodePorts,
    NodeState,
    ProcessRecord,
    UsageError,
    cluster_lock,
    colocated_processes,
    edges_per_node,
    node_sections,
    parse_hosts,
    require_state,
    save_state,
    service_argv,
    service_of,
    wrapper_argv,
    write_config,
)
from hexmq_cli.localcluster import (
    DEFAULT_GRACE,
    DEFAULT_TIMEOUT,
    _start_nodes,
    _stop_processes,
    partition_status,
)
from hexmq_cli.procs import LOOPBACK

if TYPE_CHECKING:
    from hexmq.api.membership.v1 import membership_pb2

log = logging.getLogger("hexmq.cluster")

# How long `leave` waits for the view to let the node go before it gives up (the node keeps
# leaving; the command can be run again).
DEFAULT_LEAVE_TIMEOUT: Final = 120.0
# How often `leave` reports progress while it waits.
_PROGRESS_EVERY_S: Final = 5.0


# --- add ------------------------------------------------------------------------------------


def added_node_ports(state: ClusterState, host: str = LOOPBACK) -> NodePorts:
    """The ports of the node after the last: MQTT on P+N (as `up --nodes N+1` would give), and
    the first block of ten internal ports that no node and not the embedded agreement server
    (P+1000+10*N for a cluster created with N nodes) uses; every one bound on `host`."""
    number = len(state.nodes) + 1
    used = {n.ports.redis for n in state.nodes}
    if state.consul is not None:
        used.add(state.consul_port)
    block = 0
    while (internal := state.base_port + INTERNAL_OFFSET + NODE_STRIDE * block) in used:
        block += 1
    if internal + NODE_STRIDE - 1 > 65535:
        raise ClusterError(
            f"no free ports for node {number}: its internal block would end at "
            f"{internal + NODE_STRIDE - 1} (base port {state.base_port})"
        )
    return NodePorts(
        mqtt=state.base_port + number - 1,
        redis=internal,
        membership=internal + 1,
        partition=internal + 2,
        host=host,
    )


def added_node_host(state: ClusterState, host: str | None) -> str:
    """Where node N+1 binds: `host` (`add --host`), a loopback address no node and not the
    agreement server binds, in a cluster whose nodes have addresses of their own (`up
    --hosts`); 127.0.0.1 (the default) in a cluster whose nodes all bind it."""
    placed = any(n.ports.host != LOOPBACK for n in state.nodes)
    if host is None:
        if placed:
            raise UsageError(
                "cluster add: this cluster places nodes on their own addresses (--hosts); "
                "give the new node one with --host ADDR"
            )
        return LOOPBACK
    if "," in host:
        raise UsageError(f"cluster add --host: one address, not {host!r}")
    (host,) = parse_hosts(host, "cluster add --host")
    if not placed:
        if host != LOOPBACK:
            raise UsageError(
                f"cluster add --host {host}: this cluster's nodes all bind {LOOPBACK}; a node "
                "of its own address needs a cluster made with `up --hosts`"
            )
        return host
    taken = {n.ports.host: f"node {n.node}" for n in state.nodes}
    if state.consul is not None:
        taken[state.consul_host] = "the agreement server"
    if host in taken:
        raise UsageError(f"cluster add --host {host}: {taken[host]} binds that address already")
    return host


def plan_added_node(state: ClusterState, host: str | None = None) -> NodeState:
    """Node N+1 with the command lines of the others: the same node wrapper (`up
    --node-wrapper`) and the same extra service arguments as node 1 (`up --edge-arg ...`),
    the same Python and redis-server (pure: touches no file)."""
    if len(state.nodes) >= MAX_NODES:
        raise UsageError(f"the cluster in {state.dir} already has {MAX_NODES} nodes, the most")
    first = state.nodes[0]
    number = len(state.nodes) + 1
    wrapper = state.node_wrapper
    if wrapper is None:  # a cluster.json from before the wrapper was recorded
        if first.record("membership").argv[1:4] != ["-P", "-m", "hexmq.cli"]:
            raise UsageError(
                "cluster add: this cluster's processes run under a --node-wrapper that its "
                "cluster.json does not record (made by an older hexmq); add cannot repeat it"
            )
        wrapper = []
    first_wrapped = len(wrapper_argv(wrapper, first.node))
    membership_argv = first.record("membership").argv[first_wrapped:]
    # `up --discovery static`: the new node's agent reads DIR/members too (add rewrites it).
    discovery = "static" if "--discovery" in membership_argv else None
    python = membership_argv[0]
    redis_server = first.processes["redis"].argv[first_wrapped]
    node = NodeState(
        node=number,
        ports=added_node_ports(state, added_node_host(state, host)),
        dir=state.dir / f"node{number}",
        processes={},
        # As the newest node runs: a cluster switching to TLS adds nodes at its current step.
        security=state.nodes[-1].security,
        redis_auth=state.nodes[-1].redis_auth,
        colocated=first.colocated,
    )
    if first.colocated:
        # What `up` appended to each section of node 1's `hexmq node` after its own options.
        sections = node_sections(membership_argv)
        extras: dict[str, list[str]] = {}
        for service in HEXMQ_SERVICES:
            own = service_argv(
                service, state, first, python=python, redis_server=redis_server, discovery=discovery
            )
            extras[service] = sections[service][len(own) - 5 :]
        node.processes = colocated_processes(
            state,
            node,
            wrapper=wrapper,
            python=python,
            redis_server=redis_server,
            discovery=discovery,
            service_args=extras,
        )
        return node
    edges = edges_per_node(state)
    for service in first.processes:
        # What `up` appended to node 1's command line after its own arguments.
        own = service_argv(
            service,
            state,
            first,
            python=python,
            redis_server=redis_server,
            discovery=discovery,
            edges_per_node=edges,
        )
        extra = first.processes[service].argv[first_wrapped + len(own) :]
        argv = wrapper_argv(wrapper, number)
        argv += service_argv(
            service,
            state,
            node,
            python=python,
            redis_server=redis_server,
            discovery=discovery,
            edges_per_node=edges,
        )
        node.processes[service] = ProcessRecord(argv=argv + extra, log=node.dir / f"{service}.log")
    return node


def add_node(
    cluster_dir: Path, *, host: str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> NodeState:
    """Add node N+1 to the running cluster in `cluster_dir` (on `host`: added_node_host):
    plan it, start its processes and wait until the view admits it and its edge serves
    clients of every node. The partitions it takes over move afterwards, while traffic flows
    (`hexmq cluster status` shows them)."""
    cluster_dir = cluster_dir.absolute()
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        running = [n for n in state.nodes if n.record("membership").running()]
        if not running:
            raise ClusterError(
                f"no node of the cluster in {cluster_dir} is running: a node joins a running "
                f"cluster (start it with `hexmq cluster up --dir {cluster_dir}` first)"
            )
        node = plan_added_node(state, host)
        busy = [
            f"{port} ({service})"
            for service, port in bound_ports(node)
            if procs.port_in_use(port, node.ports.host)
        ]
        if busy:
            raise ClusterError(
                f"port(s) for node {node.node} already in use on {node.ports.host}: "
                + ", ".join(busy)
            )
        state.nodes.append(node)
        if node.security != localsecurity.PLAIN:
            localsecurity.ensure_certificates(state, [node])
        if node.redis_auth:
            localsecurity.ensure_redis_password(node)
        write_config(state)
        save_state(state)
        log.info(
            "node %d (%s) joins: MQTT on %s",
            node.node,
            node.node_id,
            node.ports.addr(node.ports.mqtt),
        )
        _start_nodes(state, [node], timeout)
        return node


def bound_ports(node: NodeState) -> list[tuple[str, int]]:
    """(service or further edge, port) for every port the node's processes bind, by service:
    a co-located node's one process binds each service's ports."""
    return [(name, port) for name in [*SERVICES, *node.edges[1:]] for port in _ports_of(node, name)]


def _ports_of(node: NodeState, name: str) -> list[int]:
    """The ports one of the node's processes binds (a further edge: only its metrics port of
    its own; its MQTT port is the first edge's too)."""
    if service_of(name) == EDGE and name != EDGE:
        return [node.ports.metrics(name)]
    metrics = [node.ports.metrics(name)] if name in METRICS_SLOTS else []
    return [node.ports.of(name), *metrics]


# --- leave ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaveOutcome:
    view_epoch: int
    seconds: float
    stopped: int
    notes: list[str]


def _ask_leave(
    state: ClusterState, node: NodeState, wait_s: float, rpc_timeout: float
) -> membership_pb2.LeaveReply | None:
    """One Leave call to the node's agent (None if it does not answer). An agent that has no
    Leave (a release before it: v0.2.0) is refused at once, saying what to do instead."""
    import grpc  # imported here: `hexmq cluster` commands that do not ask stay fast

    from hexmq.api.membership.v1 import membership_pb2, membership_pb2_grpc

    try:
        with localsecurity.node_channel(state, node, "membership") as channel:
            stub = membership_pb2_grpc.MembershipServiceStub(channel)
            reply: membership_pb2.LeaveReply = stub.Leave(
                membership_pb2.LeaveRequest(wait_ms=int(wait_s * 1000)),
                timeout=wait_s + rpc_timeout,
            )
            return reply
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            raise ClusterError(
                f"node {node.node} cannot leave gracefully: its membership agent runs a "
                "release without leave (v0.2.0 or older), so nothing was asked of it and it "
                f"keeps running. Stop it plainly with `hexmq cluster stop {node.node}` (its "
                "partitions fail over to in-sync replicas; nothing acknowledged is lost), or "
                "upgrade it first (docs/operations.md, Rolling upgrade and rollback)"
            ) from exc
        log.warning("node %d: leave: %s: %s", node.node, exc.code().name, exc.details())
        return None


def leave_node(
    cluster_dir: Path,
    number: int,
    *,
    timeout: float = DEFAULT_LEAVE_TIMEOUT,
    grace: float = DEFAULT_GRACE,
) -> LeaveOutcome:
    """Take node `number` out of the running cluster gracefully: its agent marks it leaving,
    the view moves its master roles by handover and restores RF without it; once the view no
    longer holds it, stop its processes with SIGTERM (its edge sends 0x8B with another node's
    address). If the view has not let it go within `timeout`, raise and leave it running (it
    keeps leaving; run `leave` again to wait longer)."""
    cluster_dir = cluster_dir.absolute()
    state = require_state(cluster_dir)
    state.node(number)  # a bad node number is a usage error, before taking the lock
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        node = state.node(number)
        if not node.record("membership").running():
            raise ClusterError(
                f"node {number}'s membership agent is not running, so it cannot leave (a "
                "stopped node's partitions have failed over already); start it first, or "
                "leave it stopped"
            )
        others = [n for n in state.nodes if n is not node and n.record("membership").running()]
        if not others:
            raise ClusterError(f"node {number} is the only running node: nobody to leave to")
        started = time.monotonic()
        deadline = started + timeout
        reply = None
        failures = 0
        log.info("node %d (%s) leaving the cluster", number, node.node_id)
        while (left_s := deadline - time.monotonic()) > 0:
            reply = _ask_leave(state, node, min(left_s, _PROGRESS_EVERY_S), rpc_timeout=5.0)
            if reply is None:
                failures += 1
                if failures >= 3 or not node.record("membership").running():
                    raise ClusterError(
                        f"node {number}'s membership agent does not answer the leave "
                        f"(log: {node.record('membership').log})"
                    )
                time.sleep(0.5)
                continue
            if reply.left:
                break
            if reply.nobody_stays:
                raise ClusterError(
                    f"node {number} cannot leave: every other member of view "
                    f"{reply.view_epoch} is leaving or gone, nobody can take its partitions"
                )
            log.info(
                "node %d leaving: %d partition(s) still have a replica on it (view %d, %.0f s)",
                number,
                reply.partitions_held,
                reply.view_epoch,
                time.monotonic() - started,
            )
        if reply is None or not reply.left:
            held = "?" if reply is None else str(reply.partitions_held)
            raise ClusterError(
                f"node {number} has not left after {timeout:g} s ({held} partition(s) still "
                "have a replica on it); it stays up and keeps leaving: run `hexmq cluster "
                f"leave {number}` again to wait longer, or `hexmq cluster stop {number}` to "
                "stop it (its partitions then fail over)"
            )
        took = time.monotonic() - started
        log.info(
            "node %d left the cluster in view %d after %.1f s; stopping its processes",
            number,
            reply.view_epoch,
            took,
        )
        targets = [(node, s) for s in node.process_names() if node.processes[s].running()]
        notes = _stop_processes(targets, grace, leave=True)
        return LeaveOutcome(reply.view_epoch, took, len(targets), notes)


# --- progress -------------------------------------------------------------------------------


def _left(nodes: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(replicas catching up, log entries and bytes they still lack) over the nodes'
    partition services."""
    replicas = entries = size = 0
    for node in nodes:
        parts = node.get("partitions") or {}
        catching_up = parts.get("catching_up") or {}
        replicas += catching_up.get("replicas", 0)
        entries += catching_up.get("entries", 0)
        size += catching_up.get("bytes", 0)
    return replicas, entries, size


def rebalance_progress(
    state: ClusterState, doc: dict[str, Any], sample_s: float = 1.0
) -> dict[str, Any] | None:
    """What `hexmq cluster status` says of a rebalance: the view's moving partitions (from
    `doc`, a cluster_status document), the replicas still catching up and the log entries and
    bytes they lack; while something moves, a second look after `sample_s` gives the rates at
    which they are copied and an estimate of the time left (None: no rate yet), from bytes
    (a snapshot's entry lag counts the partition's whole history, its bytes what is left to
    copy), or from entries while no bytes moved. None when no agent answers."""
    membership = doc.get("membership") or {}
    view = membership.get("rebalance")
    if view is None:
        return None
    replicas, entries, size = _left(doc["nodes"])
    progress: dict[str, Any] = {
        **view,
        "replicas_catching_up": replicas,
        "entries_left": entries,
        "bytes_left": size,
        "entries_per_s": None,
        "bytes_per_s": None,
        "estimate_s": None,
    }
    if (view["moving"] or replicas) and sample_s > 0:
        time.sleep(sample_s)
        replicas, entries_now, size_now = _left(_partition_statuses(state))
        progress.update(replicas_catching_up=replicas, entries_left=entries_now)
        progress["bytes_left"] = size_now
        entry_rate = (entries - entries_now) / sample_s
        byte_rate = (size - size_now) / sample_s
        if entry_rate > 0:
            progress["entries_per_s"] = round(entry_rate)
        if byte_rate > 0:
            progress["bytes_per_s"] = round(byte_rate)
            progress["estimate_s"] = round(size_now / byte_rate, 1)
        elif entry_rate > 0:
            progress["estimate_s"] = round(entries_now / entry_rate, 1)
    return progress


def _partition_statuses(state: ClusterState) -> list[dict[str, Any]]:
    """Each running partition service's account, as cluster_status puts it in a node."""
    return [
        {"partitions": partition_status(state, n)}
        for n in state.nodes
        if n.record("partition").running()
    ]


def _mb(size: float) -> str:
    return f"{size / 1e6:.1f} MB"


def describe_progress(progress: dict[str, Any] | None) -> str:
    """One line for `hexmq cluster status`."""
    if progress is None:
        return "rebalance: unknown (no membership agent answers)"
    moving = progress["moving"]
    who = [f"joining {', '.join(progress['joining'])}"] if progress["joining"] else []
    who += [f"leaving {', '.join(progress['leaving'])}"] if progress["leaving"] else []
    because = f" ({'; '.join(who)})" if who else ""
    if not moving and not progress["replicas_catching_up"]:
        return f"rebalance: none{because}: every partition in sync at its placement"
    line = (
        f"rebalance: {moving} partition(s) moving{because}, "
        f"{progress['under_replicated']} under-replicated; "
        f"{progress['replicas_catching_up']} replica(s) catching up, "
        f"{progress['entries_left']} entries ({_mb(progress.get('bytes_left', 0))}) left"
    )
    if progress["estimate_s"] is not None:
        rate = (
            f"{_mb(progress['bytes_per_s'])}/s"
            if progress.get("bytes_per_s")
            else f"{progress['entries_per_s']} entries/s"
        )
        line += f" (~{progress['estimate_s']:g} s at {rate})"
    return line + "; do not stop or add another node until it has finished"
