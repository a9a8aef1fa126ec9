"""The failover benchmark: what a node's death costs the clients of the others.

    python -m bench.failover [--nodes 3] [--rf 3] [--rate 1000] [--runs 3]

A hexmq cluster runs QoS 1 publishers (one message at a time each, paced to --rate messages a
second in all) and persistent QoS 1 subscribers on every node; after --before seconds node 1
is killed with SIGKILL (every process, Redis included). Reported per run:

- the longest gap between two acknowledgements seen by a publisher of a surviving node, and
  the longest gap spanning the kill (the failover as those clients see it);
- when the view dropped the node, after the kill;
- when a session whose partition the dead node mastered was resumable on a survivor (a
  CONNECT with clean start 0 answered with session present 1);
- when every partition had RF in-sync replicas again: on the remaining nodes when there are
  more nodes than RF, else once the killed node was started again (--restart-after) and had
  caught up;
- messages lost: acknowledged and never delivered to a subscriber (must be 0).

It uses `hexmq cluster` in a temporary directory on free loopback ports, and the workload of
tests/support/workload.py. Results go to bench/results/failover-*.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import report
from hexmq.hashring import partition_of
from hexmq.membership.view import master_of
from hexmq_cli import clusterstate, localcluster
from tests.support import workload
from tests.support.workload import Publisher, Subscriber, check

HEXMQ = Path(sys.executable).with_name("hexmq")


def hexmq(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HEXMQ), "cluster", *args], capture_output=True, text=True, timeout=timeout, check=True
    )


def free_base_port(nodes: int) -> int:
    from tests.conftest import pick_base_port

    return pick_base_port(nodes)


def resumable(client_id: str, port: int, timeout: float) -> bool:
    """Whether a CONNECT with clean start 0 for `client_id` is answered, within `timeout`, with
    session present 1 (the session exists and its partition has a master)."""
    client = workload.persistent_client(client_id)
    try:
        return workload.resume(client, port, timeout=timeout)
    finally:
        workload.close_client(client)


class Cluster:
    def __init__(self, nodes: int, rf: int, partitions: int, workdir: Path) -> None:
        self.dir = workdir / "cluster"
        out = hexmq(
            "up",
            *("--nodes", str(nodes), "--rf", str(rf), "--partitions", str(partitions)),
            *("--dir", str(self.dir), "--base-port", str(free_base_port(nodes))),
            "--separate",  # as its figures in docs/benchmarks.md were measured
        )
        self.nodes = json.loads(out.stdout)["nodes"]
        self.partitions = partitions
        self.rf = rf

    def port(self, node: int) -> int:
        port: int = self.nodes[node - 1]["mqtt_port"]
        return port

    def view(self) -> dict[str, Any]:
        """What a running membership agent reports (in process: polled every 50 ms)."""
        state = clusterstate.require_state(self.dir.absolute())
        return localcluster.membership_status(state, timeout=1.0) or {}

    def masters(self) -> dict[int, str]:
        """Partition -> its master in the agreed view."""
        from hexmq.api.membership.v1 import membership_pb2, membership_pb2_grpc
        from hexmq_cli import localsecurity

        state = clusterstate.require_state(self.dir.absolute())
        with localsecurity.node_channel(state, state.nodes[-1], "membership") as channel:
            stub = membership_pb2_grpc.MembershipServiceStub(channel)
            view = stub.Status(membership_pb2.MembershipStatusRequest(), timeout=5).view
        return {pa.partition: master_of(pa) for pa in view.partitions if pa.replicas}

    def down(self) -> None:
        subprocess.run(
            [str(HEXMQ), "cluster", "down", "--dir", str(self.dir)],
            capture_output=True,
            timeout=120,
            check=False,
        )


def one_run(args: argparse.Namespace, run: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hexmq-failover-bench-") as tmp:
        cluster = Cluster(args.nodes, args.rf, args.partitions, Path(tmp))
        try:
            return measure(cluster, args, run)
        finally:
            cluster.down()


def measure(cluster: Cluster, args: argparse.Namespace, run: int) -> dict[str, Any]:
    tag = f"fb{run}-{int(time.time())}"
    nodes = range(1, args.nodes + 1)
    subs = [Subscriber(f"s-{tag}-n{n}", cluster.port(n), f"fb/{tag}/#", qos=1) for n in nodes]
    for s in subs:
        s.connect()
    killed = 1
    # A session whose partition the node to be killed masters: resumable again once failed over.
    masters = cluster.masters()
    probe_id = next(
        cid
        for cid in (f"probe-{tag}-{i}" for i in range(10_000))
        if masters.get(partition_of(cid, cluster.partitions)) == f"n{killed}"
    )
    probe = Subscriber(probe_id, cluster.port(args.nodes), f"fbp/{tag}", qos=1)
    probe.connect()
    probe.close()
    per_node = max(1, args.publishers // args.nodes)
    interval = max(0.0, per_node * args.nodes / args.rate)
    pubs = [
        Publisher(f"p-{tag}-n{n}-{i}", cluster.port(n), f"fb/{tag}/n{n}/{i}", qos=1)
        for n in nodes
        for i in range(per_node)
    ]
    for p in pubs:
        p.start(interval=interval)
    time.sleep(args.before)
    t_kill = time.monotonic()
    hexmq("kill", str(killed), "--dir", str(cluster.dir))
    survivors = [n for n in nodes if n != killed]
    # When the view dropped it, and when the dead node's session was resumable elsewhere.
    t_out = t_resumable = None
    deadline = t_kill + 60
    while time.monotonic() < deadline and (t_out is None or t_resumable is None):
        if t_out is None:
            members = cluster.view().get("members", [])
            if not any(m["node_id"] == f"n{killed}" and m["in_view"] for m in members):
                t_out = time.monotonic()
        if t_resumable is None and resumable(probe_id, cluster.port(survivors[0]), timeout=2.0):
            t_resumable = time.monotonic()
        time.sleep(0.05)
    t_restart = t_serving = None
    if args.nodes <= args.rf:
        time.sleep(max(0.0, args.restart_after - (time.monotonic() - t_kill)))
        t_restart = time.monotonic()
        hexmq("start", str(killed), "--dir", str(cluster.dir))
        t_serving = time.monotonic()
    t_rf = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        roles = cluster.view().get("partitions", {})
        in_sync = sum(row["in_sync"] for row in roles.values())
        if in_sync >= cluster.partitions * args.rf:
            t_rf = time.monotonic()
            break
        time.sleep(0.2)
    time.sleep(args.after)
    for p in pubs:
        p.stop()
    moved = {s.client_id for s in subs if s.port == cluster.port(killed)}
    for s in subs:
        if s.client_id in moved:
            s.move(cluster.port(survivors[0]))
    deadline = time.monotonic() + 30
    wanted = {p.payload(n) for p in pubs for n in p.acked}
    while time.monotonic() < deadline and not all(wanted <= set(s.payloads()) for s in subs):
        time.sleep(0.3)
    result = check(pubs, subs)
    for s in subs:
        s.close()
    alive = [p for p in pubs if p.port != cluster.port(killed)]
    spanning = [gap_spanning(p, t_kill) for p in alive]

    def since_kill(t: float | None) -> float | None:
        return round(t - t_kill, 3) if t is not None else None

    return {
        "run": run,
        "acknowledged": result.acknowledged,
        "lost": sum(len(v) for v in result.lost.values()),
        # QoS 1 duplicates are allowed; at a subscriber that stayed connected they can only
        # come from a publish the edge sent again to the new master (never a resend without a
        # reconnect, MQTT-4.4.0-1).
        "duplicates_qos1_moved": sum(len(result.duplicates_qos1[c]) for c in moved),
        "duplicates_qos1_stayed": sum(
            len(v) for c, v in result.duplicates_qos1.items() if c not in moved
        ),
        "refused": sum(len(p.refused) for p in alive),
        "longest_ack_gap_s": round(max(p.longest_gap() for p in alive), 3),
        "longest_gap_spanning_kill_s": round(max(spanning), 3) if spanning else None,
        "view_dropped_node_s": since_kill(t_out),
        "sessions_resumable_s": since_kill(t_resumable),
        "restarted_s": since_kill(t_restart),
        # `hexmq cluster start` returned: every process up, MQTT answered.
        "restarted_serving_s": since_kill(t_serving),
        "rf_restored_s": since_kill(t_rf),
    }


def gap_spanning(p: Publisher, t: float) -> float:
    """The gap between the last acknowledgement before `t` and the first after it."""
    times = sorted(p.acked.values())
    before = [x for x in times if x <= t]
    after = [x for x in times if x > t]
    if not before or not after:
        return 0.0
    return after[0] - before[-1]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rf", type=int, default=3)
    p.add_argument("--partitions", type=int, default=256)
    p.add_argument("--publishers", type=int, default=12, help="in all, spread over the nodes")
    p.add_argument("--rate", type=float, default=1000, help="messages a second in all (paced)")
    p.add_argument("--before", type=float, default=5, help="seconds of traffic before the kill")
    p.add_argument("--after", type=float, default=5, help="seconds of traffic after RF is back")
    p.add_argument(
        "--restart-after",
        type=float,
        default=5,
        help="with no spare node (nodes <= rf): start the killed node again this long after",
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", type=Path, help="JSON results file (default bench/results/...)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    machine = report.machine_facts()
    runs = [one_run(args, i + 1) for i in range(args.runs)]
    doc: dict[str, Any] = {"machine": machine, "config": vars(args) | {"out": None}, "runs": runs}
    for key in ("longest_gap_spanning_kill_s", "view_dropped_node_s", "sessions_resumable_s"):
        values = [r[key] for r in runs if r[key] is not None]
        doc[f"median_{key}"] = statistics.median(values) if values else None
    path = args.out or report.RESULTS_DIR / f"failover-{report.result_stem(machine)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    cols = [
        "run",
        "acknowledged",
        "lost",
        "refused",
        "longest_gap_spanning_kill_s",
        "view_dropped_node_s",
        "sessions_resumable_s",
        "rf_restored_s",
    ]
    print(" | ".join(cols))
    for r in runs:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"written to {path}")
    return 1 if any(r["lost"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
