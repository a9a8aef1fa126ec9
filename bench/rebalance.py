"""The rebalance benchmark: what moving sessions onto a joining node and off a leaving one
costs, and what clients see meanwhile.

    python -m bench.rebalance [--nodes 3] [--rf 2] [--sessions 10000] [--messages 100000]

A hexmq cluster is loaded with --sessions persistent (offline) sessions, each subscribed to a
topic of its own at QoS 1, and --messages QoS 1 messages queued for them (spread evenly).
QoS 1 publishers (one message at a time each) and a subscriber then run on the last node;
after --steady seconds `hexmq cluster add` starts node N+1, and once its rebalance has
finished `hexmq cluster leave 1` takes node 1 out. Reported:

- each move's time as the live node's agent logs it (its first `rebalance started` line to its
  last `rebalance finished`: the joiner's replicas caught up by snapshot or log and its master
  roles handed over; the leaver's roles handed over and RF restored without it), beside the
  time `add` took (processes started, admitted, MQTT answered) and `leave` took;
- the publishers' acknowledged messages a second before (steady state), during the join's
  move and during the leave's, and the longest gap between two acknowledgements in each;
- queued messages before and after (must match), and messages lost (acknowledged, never
  delivered to the live subscriber; must be 0).

It uses `hexmq cluster` in a temporary directory on free loopback ports. Results go to
bench/results/rebalance-*.json and a table on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from bench import report
from hexmq_cli import clusterstate, localcluster
from tests.support import workload
from tests.support.workload import Publisher, Subscriber, check

HEXMQ = Path(sys.executable).with_name("hexmq")


def hexmq(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(HEXMQ), "cluster", *args], capture_output=True, text=True, timeout=timeout, check=True
    )


def make_sessions(port: int, prefix: str, first: int, count: int) -> None:
    """Persistent sessions prefix-i, each subscribed at QoS 1 to rb/prefix/i, left offline."""
    for i in range(first, first + count):
        client = workload.persistent_client(f"{prefix}-{i}")
        workload.resume(
            client, port, timeout=60
        )  # a fresh session: not present; refused: no SUBACK
        done = threading.Event()
        client.on_subscribe = lambda *a, done=done: done.set()
        client.subscribe(f"rb/{prefix}/{i}", qos=1)
        if not done.wait(60):
            raise RuntimeError(f"{prefix}-{i}: no SUBACK")
        workload.close_client(client)


def queue_messages(port: int, prefix: str, sessions: int, first: int, count: int) -> None:
    """QoS 1 messages numbered first..first+count-1 for the offline sessions, many in flight."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"loader-{prefix}-{first}")
    client.max_inflight_messages_set(200)
    client.max_queued_messages_set(0)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        infos = [
            client.publish(f"rb/{prefix}/{n % sessions}", b"q" * 64, qos=1)
            for n in range(first, first + count)
        ]
        for info in infos:
            info.wait_for_publish(120)
    finally:
        client.disconnect()
        client.loop_stop()


def in_threads(target: Any, total: int, threads: int, *args: Any) -> None:
    share = -(-total // threads)
    workers = [
        threading.Thread(
            target=target, args=(*args, i * share, min(share, total - i * share)), daemon=True
        )
        for i in range(threads)
        if i * share < total
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


class Cluster:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        from tests.conftest import pick_base_port

        self.dir = (workdir / "cluster").absolute()
        out = hexmq(
            "up",
            *("--nodes", str(args.nodes), "--rf", str(args.rf)),
            *("--partitions", str(args.partitions), "--dir", str(self.dir)),
            *("--base-port", str(pick_base_port(args.nodes + 2))),
            *(f"--membership-arg={a}" for a in args.membership_arg),
            "--separate",  # as its figures in docs/benchmarks.md were measured
        )
        self.nodes = json.loads(out.stdout)["nodes"]

    def port(self, node: int) -> int:
        port: int = self.nodes[node - 1]["mqtt_port"]
        return port

    def rebalance(self) -> dict[str, Any]:
        state = clusterstate.require_state(self.dir)
        doc = localcluster.membership_status(state, timeout=2.0) or {}
        return doc.get("rebalance") or {}

    def settled(self) -> bool:
        r = self.rebalance()
        return r.get("moving") == 0 and not r.get("joining") and not r.get("leaving")

    def queued(self) -> int:
        """Messages queued, counted on each partition's master."""
        state = clusterstate.require_state(self.dir)
        total = 0
        for node in state.nodes:
            if node.processes["partition"].running():
                total += _queued_on_masters(state, node)
        return total

    def down(self) -> None:
        subprocess.run(
            [str(HEXMQ), "cluster", "down", "--dir", str(self.dir)],
            capture_output=True,
            timeout=300,
            check=False,
        )


def _queued_on_masters(state: clusterstate.ClusterState, node: clusterstate.NodeState) -> int:
    from hexmq.api.partition.v1 import partition_pb2, partition_pb2_grpc
    from hexmq_cli import localsecurity

    with localsecurity.node_channel(state, node, "partition") as channel:
        reply = partition_pb2_grpc.PartitionServiceStub(channel).Status(
            partition_pb2.StatusRequest(), timeout=10
        )
    return sum(p.queued_messages for p in reply.partitions if p.role == "master")


def wait_settled(cluster: Cluster, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cluster.settled():
            return time.monotonic()
        time.sleep(0.2)
    raise RuntimeError(f"the rebalance did not finish within {timeout:g} s")


def logged_rebalance(log: Path, since_wall: float) -> tuple[float, float] | None:
    """(start, end) in wall-clock seconds of the rebalance an agent logged after `since_wall`:
    its first `rebalance started` line to its last `rebalance finished` line (a move may log
    several, e.g. a handover after the copies)."""
    start = end = None
    for line in log.read_text().splitlines():
        if "hexmq.membership: rebalance " not in line:
            continue
        stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if stamp < since_wall:
            continue
        if " rebalance started " in line and start is None:
            start = stamp
        elif " rebalance finished " in line:
            end = stamp
    return (start, end) if start is not None and end is not None else None


def window(pubs: list[Publisher], start: float, end: float) -> dict[str, float]:
    """Acknowledgements a second in [start, end), and the longest gap between two of one
    publisher's acknowledgements that overlaps the window."""
    acks = sum(1 for p in pubs for t in p.acked.values() if start <= t < end)
    gaps = []
    for p in pubs:
        times = sorted(p.acked.values())
        gaps += [b - a for a, b in itertools.pairwise(times) if b > start and a < end]
    return {
        "seconds": round(end - start, 2),
        "acks_per_s": round(acks / (end - start), 1) if end > start else 0.0,
        "longest_ack_gap_s": round(max(gaps, default=0.0), 3),
    }


def measure(cluster: Cluster, args: argparse.Namespace) -> dict[str, Any]:
    tag = f"rb{int(time.time())}"
    loader_port = cluster.port(args.nodes)
    t0 = time.monotonic()
    in_threads(make_sessions, args.sessions, args.threads, loader_port, tag)
    in_threads(queue_messages, args.messages, args.threads, loader_port, tag, args.sessions)
    loaded_s = time.monotonic() - t0
    wait_settled(cluster, 120)
    queued_before = cluster.queued()
    live = args.nodes  # the node the live clients use, never the one that leaves
    sub = Subscriber(f"live-{tag}", cluster.port(live), f"live/{tag}/#", qos=1)
    sub.connect()
    pubs = [
        Publisher(f"p-{tag}-{i}", cluster.port(live), f"live/{tag}/{i}", qos=1)
        for i in range(args.publishers)
    ]
    for p in pubs:
        p.start(interval=0.0)
    time.sleep(args.steady)
    # Publishers time their acknowledgements on the monotonic clock, the agents' log lines
    # on the wall clock.
    wall = time.time() - time.monotonic()
    agent_log = cluster.dir / f"node{live}" / "membership.log"
    t_add = time.monotonic()
    hexmq("add", "--dir", str(cluster.dir))
    t_admitted = time.monotonic()
    t_joined = wait_settled(cluster, args.timeout)
    join_move = logged_rebalance(agent_log, t_add + wall)
    time.sleep(args.steady)
    t_leave = time.monotonic()
    hexmq("leave", "1", "--dir", str(cluster.dir), "--timeout", str(args.timeout))
    t_stopped = time.monotonic()
    t_left = wait_settled(cluster, args.timeout)
    leave_move = logged_rebalance(agent_log, t_leave + wall)
    time.sleep(1)
    for p in pubs:
        p.stop()
    wanted = {p.payload(n) for p in pubs for n in p.acked}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not wanted <= set(sub.payloads()):
        time.sleep(0.3)
    result = check(pubs, [sub])
    sub.close()
    queued_after = cluster.queued()
    return {
        "sessions": args.sessions,
        "queued_messages_loaded": args.messages,
        "load_s": round(loaded_s, 1),
        "queued_before": queued_before,
        "queued_after": queued_after,
        "join": {
            # `hexmq cluster add` returned: the node's processes up, admitted, serving MQTT.
            "until_added_s": round(t_admitted - t_add, 2),
            "until_settled_s": round(t_joined - t_add, 2),
            **moved(pubs, join_move, wall),
        },
        "leave": {
            "until_left_and_stopped_s": round(t_stopped - t_leave, 2),
            "until_settled_s": round(t_left - t_leave, 2),
            **moved(pubs, leave_move, wall),
        },
        "steady": window(pubs, t_add - args.steady, t_add),
        "acknowledged": result.acknowledged,
        "lost": sum(len(v) for v in result.lost.values()),
    }


def moved(pubs: list[Publisher], logged: tuple[float, float] | None, wall: float) -> dict[str, Any]:
    """The move as the agent logged it (first start to last finish), with what the live
    publishers saw meanwhile."""
    if logged is None:
        return {"move_s": None, "during": None}
    start, end = logged[0] - wall, logged[1] - wall
    return {"move_s": round(end - start, 2), "during": window(pubs, start, max(end, start + 1))}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.rebalance", description=__doc__)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--rf", type=int, default=2)
    p.add_argument("--partitions", type=int, default=256)
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--messages", type=int, default=100_000, help="queued, over the sessions")
    p.add_argument("--threads", type=int, default=32, help="loader connections")
    p.add_argument("--publishers", type=int, default=4, help="live QoS 1 publishers")
    p.add_argument("--steady", type=float, default=5, help="seconds of traffic before a move")
    p.add_argument("--timeout", type=float, default=600, help="for each move to finish")
    p.add_argument(
        "--membership-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="add ARG to every membership agent's command line (repeatable), e.g. "
        "--membership-arg=--suspect-after=3 on a machine too loaded for the 1 s default (keep "
        "it below --replica-lag-timeout, 5 s, minus --probe-timeout: docs/failover.md)",
    )
    p.add_argument("--out", type=Path, help="JSON results file (default bench/results/...)")
    p.add_argument(
        "--keep", type=Path, metavar="DIR", help="run the cluster in DIR/cluster and keep its logs"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.nodes <= args.rf:
        print("--nodes must be above --rf (a node leaves)", file=sys.stderr)
        return 2
    machine = report.machine_facts()
    with tempfile.TemporaryDirectory(prefix="hexmq-rebalance-bench-") as tmp:
        cluster = Cluster(args, args.keep or Path(tmp))
        try:
            run = measure(cluster, args)
        finally:
            cluster.down()
    doc: dict[str, Any] = {"machine": machine, "config": vars(args) | {"out": None}, "run": run}
    path = args.out or report.RESULTS_DIR / f"rebalance-{report.result_stem(machine)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    rows = [
        ["steady", "-", str(run["steady"]["acks_per_s"]), str(run["steady"]["longest_ack_gap_s"])],
        *(
            [
                move,
                str(run[move]["move_s"]),
                str((run[move]["during"] or {}).get("acks_per_s")),
                str((run[move]["during"] or {}).get("longest_ack_gap_s")),
            ]
            for move in ("join", "leave")
        ),
    ]
    print(
        f"{run['sessions']} sessions, {run['queued_before']} queued messages "
        f"(after: {run['queued_after']}), {run['acknowledged']} live messages acknowledged, "
        f"{run['lost']} lost"
    )
    print(" | ".join(["phase", "move_s", "acks_per_s", "longest_ack_gap_s"]))
    for row in rows:
        print(" | ".join(row))
    print(f"written to {path}")
    ok = run["lost"] == 0 and run["queued_before"] == run["queued_after"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
