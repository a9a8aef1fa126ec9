"""`python -m bench`: start the brokers, run the scenarios against each, report, stop.

Two suites share the clients, the run protocol and the report:

- **single**: one hexmq node against mosquitto, fan-in at QoS 0 and 1, saturated and paced
  (`fanin-qos<Q>-<mode>`);
- **cluster**: a hexmq cluster (3 nodes by default) at each replication factor (1, 2, 3)
  against the same mosquitto, QoS 1, in three shapes (bench.shapes): fan-in, fan-out and
  publisher/subscriber pairs, saturated and paced (`cluster-<shape>-<mode>`).

Beside hexmq (a process per service), both suites run hexmq-colo by default (`cluster up
--colocated`: one `hexmq node` process per node) and, with `--baseline PYTHON`, hexmq-base
(another checkout), taking turns within each scenario; hexmq runs also report the batching
stages' gRPC stream messages and Redis transactions per publish (bench.batches).

The orchestrator itself stays idle while load runs (it only samples /proc at the window's edges),
so it does not compete with the broker or the generator for the machine's CPUs.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import pyspy, report
from bench.batches import batch_counters, batching
from bench.brokers import (
    LOOPBACK,
    MOSQUITTO_SETTINGS,
    Broker,
    BrokerFailure,
    Hexmq,
    checkout,
    hexmq_variants,
    make_broker,
)
from bench.clients import now_ns
from bench.shapes import SHAPES, layout
from bench.stats import DISTURBED_PCT, cpu_snapshot, cpu_usage

BROKERS = ("hexmq", "mosquitto")
QOS_LEVELS = (0, 1)
MODES = ("saturated", "paced", "flood")
# The cluster suite: QoS 1 only (the replicated path), no flood.
CLUSTER_MODES = ("saturated", "paced")
# The publisher behaviour behind each mode (bench.clients.PUBLISH_MODES).
PUBLISHER_MODE = {"saturated": "window", "paced": "paced", "flood": "flood"}
# Publishers keep sending a little past the window, so its end sees steady load, not a stop.
TAIL_S = 0.5
# From "go" to the first publish: time for the message to reach every worker.
LEAD_S = 0.2


@dataclass(frozen=True, slots=True)
class Scenario:
    qos: int
    mode: str
    shape: str = "fanin"
    cluster: bool = False

    @property
    def name(self) -> str:
        return f"cluster-{self.shape}" if self.cluster else f"fanin-qos{self.qos}"

    @property
    def full_name(self) -> str:
        return f"{self.name}-{self.mode}"

    @property
    def suite(self) -> str:
        return "cluster" if self.cluster else "single"


# The scenario --profile samples (on the highest replication factor asked for).
PROFILED = Scenario(1, "saturated", "fanin", cluster=True)


class WorkerFailure(Exception):
    pass


def _positive(kind: type[float] | type[int]) -> Any:
    def parse(text: str) -> float | int:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    return parse


def _rf_list(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a comma-separated list of integers, got {text}"
        ) from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"replication factors are 1 or more, got {text}")
    return values


def _edges_list(text: str) -> list[int]:
    """`--edges-per-node 1,2`: distinct counts of edges per node, 1-5, in the order given."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. 1,2") from None
    if any(not 1 <= c <= 5 for c in counts) or len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"{text!r}: distinct counts from 1 to 5")
    return counts


def _interpreter(text: str) -> str:
    if not Path(text).exists():
        raise argparse.ArgumentTypeError(f"{text}: no such interpreter")
    return text


def add_variant_options(p: argparse.ArgumentParser, each: str) -> None:
    """--colocated and --baseline, which bench.cli and bench.moderate share: the hexmq
    variants that take turns with the default one (brokers.hexmq_variants); `each` names what
    they run beside ("each hexmq topology")."""
    p.add_argument(
        "--colocated",
        action=argparse.BooleanOptionalAction,
        default=True,
        help=f"also run {each} co-located (`hexmq cluster up --colocated`: each "
        "node's agent, partition service and edge in one process, calling each other in "
        "process), as hexmq-colo, taking turns with separate processes; its CPU is each node's "
        "hexmq node process and Redis, and the agreement server (default: on)",
    )
    p.add_argument(
        "--baseline",
        type=_interpreter,
        metavar="PYTHON",
        help=f"also run {each} with the hexmq of another checkout (its venv's python, e.g. "
        "/path/.venv/bin/python; that checkout's own hexmq command, without PYTHONPATH), as "
        "hexmq-base, taking turns with this one: a before/after comparison in one run",
    )


def baseline_facts(python: str | None) -> dict[str, str] | None:
    """The checkout --baseline runs (brokers.checkout), for the results file; refused if its
    interpreter cannot import hexmq."""
    if python is None:
        return None
    try:
        return checkout(python)
    except BrokerFailure as exc:
        raise SystemExit(f"bench: --baseline: {exc}") from None


def all_scenarios() -> list[Scenario]:
    single = [Scenario(0, "flood")] + [
        Scenario(q, m) for q in QOS_LEVELS for m in MODES if m != "flood"
    ]
    cluster = [Scenario(1, m, shape, cluster=True) for shape in SHAPES for m in CLUSTER_MODES]
    return single + cluster


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(s.full_name for s in all_scenarios())
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="hexmq against mosquitto on this machine, with our own load generator. "
        "single: one hexmq node, fan-in (N publishers -> 1 wildcard subscriber), QoS 0 and 1, "
        "saturated and paced. cluster: a hexmq cluster at each replication factor, QoS 1, "
        "fan-in, fan-out and publisher/subscriber pairs with the clients spread over the nodes, "
        "saturated and paced; mosquitto runs the same shapes on its one port. Default: both "
        "suites, each hexmq also co-located (hexmq-colo), about 12 minutes on 2 cores (about 17 "
        "with --baseline).",
    )
    p.add_argument("--broker", choices=(*BROKERS, "both"), default="both")
    p.add_argument(
        "--scenario",
        action="append",
        metavar="PATTERN",
        help=f"run only scenarios matching this glob (repeatable): {names} (the flood, QoS 0 "
        "with no window, only when named); e.g. '*qos1*', 'cluster-*', 'cluster-pairs-*'. "
        "Default: all but the flood",
    )
    p.add_argument(
        "--duration",
        type=_positive(float),
        default=8.0,
        metavar="S",
        help="single suite: measurement window per run (default %(default)g s)",
    )
    p.add_argument(
        "--warmup",
        type=_positive(float),
        default=2.0,
        metavar="S",
        help="single suite: load before the window that is not measured (default %(default)g s)",
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 2 s windows, 1 s warm-ups (both suites)"
    )
    p.add_argument(
        "--publishers",
        type=_positive(int),
        default=8,
        metavar="N",
        help="single suite: fan-in publishers (default %(default)s)",
    )
    p.add_argument("--payload", type=_positive(int), default=64, metavar="BYTES")
    p.add_argument(
        "--inflight",
        type=_positive(int),
        default=64,
        metavar="N",
        help="QoS 1: unacknowledged publishes per publisher (default %(default)s)",
    )
    p.add_argument(
        "--pace",
        type=_positive(float),
        default=0.5,
        metavar="FRACTION",
        help="paced runs offer this fraction of the saturated delivery rate (default %(default)g)",
    )
    p.add_argument(
        "--pace-basis",
        choices=("common", "own"),
        default="common",
        help="common: every broker of a scenario paced at FRACTION of the slowest one's "
        "saturated rate, so their latencies are compared under the same load; own: each at "
        "FRACTION of its own",
    )
    p.add_argument(
        "--rate",
        type=_positive(float),
        metavar="MSG_S",
        help="pace at this total delivery rate (messages/s) instead of --pace",
    )
    p.add_argument(
        "--edges-per-node",
        type=_edges_list,
        default=[1],
        metavar="LIST",
        help="one hexmq node (single suite) or cluster (cluster suite, each replication "
        "factor) per value, with that many edge processes per node sharing its MQTT port "
        "(`hexmq cluster up --edges-per-node`), taking turns within each scenario; e.g. 1,2 "
        "shows what a second core for connection handling gives (hexmq and hexmq-2e; "
        "default 1). Separate processes only: hexmq-colo and hexmq-base run one edge per node "
        "(`cluster up` refuses --edges-per-node above 1 with --colocated)",
    )
    add_variant_options(
        p, "the one-node hexmq (single suite) and each replication factor's cluster (cluster suite)"
    )
    cluster = p.add_argument_group("cluster suite")
    cluster.add_argument(
        "--nodes",
        type=_positive(int),
        default=3,
        metavar="N",
        help="nodes per cluster (default %(default)s)",
    )
    cluster.add_argument(
        "--rf",
        type=_rf_list,
        default=[1, 2, 3],
        metavar="LIST",
        help="replication factors, one cluster each, all up for the whole suite (default 1,2,3)",
    )
    cluster.add_argument(
        "--cluster-duration",
        type=_positive(float),
        default=4.0,
        metavar="S",
        help="measurement window per run (default %(default)g s)",
    )
    cluster.add_argument(
        "--cluster-warmup",
        type=_positive(float),
        default=1.5,
        metavar="S",
        help="warm-up per run (default %(default)g s)",
    )
    cluster.add_argument(
        "--fanin-publishers",
        type=_positive(int),
        default=12,
        metavar="N",
        help="fan-in: publishers to the one subscriber (default %(default)s)",
    )
    cluster.add_argument(
        "--fanout-subscribers",
        type=_positive(int),
        default=12,
        metavar="N",
        help="fan-out: subscribers of the one publisher (default %(default)s)",
    )
    cluster.add_argument(
        "--pairs",
        type=_positive(int),
        default=100,
        metavar="N",
        help="pairs: publisher/subscriber pairs (default %(default)s)",
    )
    cluster.add_argument(
        "--plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run the highest replication factor with the cluster's links in plain text "
        "(--insecure-cluster), as hexmq-plain beside the default mutual TLS (default: on)",
    )
    cluster.add_argument(
        "--profile",
        action="store_true",
        help="after the measured cluster-fanin-saturated run on the highest replication "
        "factor, run it once more with py-spy sampling node 1's edge and partition, and write "
        "their hottest functions next to the JSON results (needs py-spy: pip install py-spy)",
    )
    cluster.add_argument(
        "--profile-duration",
        type=_positive(float),
        default=10.0,
        metavar="S",
        help="window of the --profile run, sampled throughout (default %(default)g s)",
    )
    p.add_argument(
        "--procs",
        type=int,
        choices=(1, 2),
        default=2,
        help="load-generator processes: 2 puts the subscribers in their own process, so their "
        "receive timestamps do not wait behind publishers in the same event loop (default 2)",
    )
    p.add_argument("--mqtt", type=int, choices=(4, 5), default=4, help="protocol level (4 = 3.1.1)")
    p.add_argument(
        "--drain-timeout",
        type=_positive(float),
        default=15.0,
        metavar="S",
        help="after a run, how long to wait for outstanding acks and deliveries",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=5.0,
        metavar="S",
        help="before each run, wait up to S seconds for the machine (other people's work, the "
        "last run's backlog) to drop below a quarter of a core busy; recorded either way; "
        "0 = do not wait (default %(default)g)",
    )
    p.add_argument(
        "--redo-disturbed",
        type=int,
        default=0,
        metavar="N",
        help=f"run a scenario again, up to N times, while other work on the machine took more "
        f"than {DISTURBED_PCT:g}%% of a core in its window ('cpu other'); the least disturbed "
        "run counts, and the JSON keeps the others' figure (default %(default)s)",
    )
    p.add_argument("--keep", action="store_true", help="keep the brokers' directories and logs")
    p.add_argument("--out", type=Path, help="JSON results file (default bench/results/...)")
    return p


# --- one run ------------------------------------------------------------------------------------


class Worker:
    """A bench.worker process and a thread turning its stdout into a queue of messages."""

    def __init__(self, name: str, spec: dict[str, Any]) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=report.REPO,
        )
        self.messages: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True, name=f"read-{name}").start()
        self.send(spec)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.messages.put(json.loads(line))
        self.messages.put(None)

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        try:
            message = self.messages.get(timeout=timeout)
        except queue.Empty:
            raise WorkerFailure(f"{self.name}: no {event!r} within {timeout:g} s") from None
        if message is None:
            raise WorkerFailure(f"{self.name}: exited before {event!r}")
        if message.get("event") != event:
            raise WorkerFailure(f"{self.name}: expected {event!r}, got {message}")
        return message

    def finish(self) -> None:
        # End of input tells a worker still waiting for a command (a failed run) to exit.
        assert self.process.stdin is not None
        try:
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _sleep_until(t_ns: int) -> None:
    delay = (t_ns - now_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


def _progress_file(n_publishers: int) -> Path:
    """A zeroed file of one int64 per publisher, in memory (/dev/shm) where there is one."""
    shm = Path("/dev/shm")
    fd, name = tempfile.mkstemp(prefix="hexmq-bench-", dir=shm if shm.is_dir() else None)
    with os.fdopen(fd, "wb") as f:
        f.write(bytes(8 * n_publishers))
    return Path(name)


QUIET_PCT = 25.0


def wait_for_quiet(limit_s: float) -> float:
    """Wait (up to limit_s) until the whole machine is below QUIET_PCT of one core busy.

    Other people's builds and tests share this machine, and a broker may still be working off
    the previous run's backlog (a QoS 0 flood leaves one): a run that starts in the middle of
    either measures both. Returns the machine's load (percent of one core) when the wait ended.
    """
    deadline = time.monotonic() + limit_s
    while True:
        before = cpu_snapshot({}, now_ns())
        time.sleep(0.5)
        busy: float = cpu_usage(before, cpu_snapshot({}, now_ns())).get("machine_pct", 0.0)
        if busy < QUIET_PCT or time.monotonic() >= deadline:
            return busy


def clients_for(scenario: Scenario, args: argparse.Namespace) -> int:
    """The fan-in's publishers, the fan-out's subscribers or the number of pairs."""
    if not scenario.cluster:
        return int(args.publishers)
    per_shape = {
        "fanin": args.fanin_publishers,
        "fanout": args.fanout_subscribers,
        "pairs": args.pairs,
        "split": args.pairs,
    }
    return int(per_shape[scenario.shape])


def timing(scenario: Scenario, args: argparse.Namespace) -> tuple[float, float]:
    """(warm-up, window) in seconds."""
    if scenario.cluster:
        return args.cluster_warmup, args.cluster_duration
    return args.warmup, args.duration


def run_once(
    broker: Broker,
    scenario: Scenario,
    rate: float | None,
    args: argparse.Namespace,
    run_no: int,
    all_brokers: list[Broker],
    at_window: Callable[[float], None] | None = None,
    window_s: float | None = None,
) -> dict[str, Any]:
    """One run. `rate` (paced) is the total delivery rate to offer; `at_window` is called with
    the window's length as it begins (--profile starts its samplers there); `window_s`
    overrides the scenario's window."""
    if not broker.alive():
        raise BrokerFailure(f"{broker.label} is not running (see its logs)")
    topic_prefix = f"bench/r{run_no}"
    plan = layout(scenario.shape, clients_for(scenario, args), broker.ports, topic_prefix)
    n = len(plan.publishers)
    warmup, duration = timing(scenario, args)
    duration = window_s or duration
    progress_path = _progress_file(n)
    spec = {
        "host": LOOPBACK,
        "protocol_version": args.mqtt,
        "qos": scenario.qos,
        # A fresh topic tree and client ids per run: nothing left from an earlier run can match.
        "client_prefix": f"bench-{os.getpid()}-r{run_no}",
        "n_publishers": n,
        "payload_size": args.payload,
        "inflight": args.inflight,
        # Publishes per second in all: fan-out delivers each one to every subscriber.
        "rate": rate / plan.deliveries_per_publish if rate else None,
        "drain_timeout": args.drain_timeout,
        "mode": PUBLISHER_MODE[scenario.mode],
        "progress_path": str(progress_path),
    }
    # The subscribers are ready (subscribed) before any publisher starts, so nothing sent is
    # published to no one.
    roles = (
        [("generator", plan.subscribers, plan.publishers)]
        if args.procs == 1
        else [("subscribers", plan.subscribers, []), ("publishers", [], plan.publishers)]
    )
    workers: list[Worker] = []
    try:
        for name, subscribers, publishers in roles:
            workers.append(
                Worker(name, {**spec, "subscribers": subscribers, "publishers": publishers})
            )
            workers[-1].expect("ready", 60)
        sub_worker, pub_worker = workers[0], workers[-1]
        start = now_ns() + int(LEAD_S * 1e9)
        window = start + int(warmup * 1e9)
        window_end = window + int(duration * 1e9)
        stop = window_end + int(TAIL_S * 1e9)
        for w in workers:
            w.send(
                {
                    "cmd": "go",
                    "start": start,
                    "window": window,
                    "window_end": window_end,
                    "stop": stop,
                }
            )

        pids = {name: pid for b in all_brokers for name, pid in b.pids.items()}
        pids.update({f"gen-{w.name}": w.process.pid for w in workers})
        _sleep_until(window)
        before = cpu_snapshot(pids, now_ns())
        if at_window is not None:
            at_window(duration)
        _sleep_until(window_end)
        after = cpu_snapshot(pids, now_ns())

        wait = TAIL_S + args.drain_timeout + 30
        published = pub_worker.expect("published", wait)
        sub_worker.send(
            {"cmd": "expect", "sent": published["sent"], "unacked": published["unacked"]}
        )
        results = [w.expect("result", wait) for w in workers]
    finally:
        for w in workers:
            w.finish()
        progress_path.unlink(missing_ok=True)
    pub_result = next(r for r in results if r["publishers"] is not None)
    sub_result = next(r for r in results if r["subscriber"] is not None)
    run = summarise(
        broker, scenario, rate, duration, pub_result, sub_result, cpu_usage(before, after)
    )
    run["publish_rate"] = spec["rate"]
    run["clients"] = {
        "publishers": n,
        "subscribers": len(plan.subscribers),
        "per_node": plan.nodes_used(broker.ports),
    }
    return run


def summarise(
    broker: Broker,
    scenario: Scenario,
    rate: float | None,
    window: float,
    pub_result: dict[str, Any],
    sub_result: dict[str, Any],
    cpu: dict[str, Any],
) -> dict[str, Any]:
    pubs = pub_result["publishers"]
    sub = sub_result["subscriber"]
    sent = sum(p["sent"] for p in pubs.values())
    per_process = cpu.get("processes_pct", {})
    mine = {k: v for k, v in per_process.items() if k in broker.pids}
    generator = {k: v for k, v in per_process.items() if k.startswith("gen-")}
    cpu_view = {
        **cpu,
        "broker_pct": round(sum(v or 0 for v in mine.values()), 1),
        "generator_pct": round(sum(v or 0 for v in generator.values()), 1),
    }
    failures = [f"publisher {i}: {p['failure']}" for i, p in pubs.items() if p["failure"]]
    if sub["failure"]:
        failures.append(f"subscriber: {sub['failure']}")
    failures += [
        f"{sub[kind]} {kind} deliveries (not matching the subscription)"
        for kind in ("stray", "foreign")
        if sub.get(kind)
    ]
    # What the subscribers should have had: each message once per matching subscriber.
    expected = sub.get("expected", sent)
    return {
        "broker": broker.name,
        "label": broker.label,
        "suite": scenario.suite,
        "nodes": broker.nodes,
        "rf": broker.rf if isinstance(broker, Hexmq) else None,
        "scenario": scenario.name,
        "shape": scenario.shape,
        "mode": scenario.mode,
        "qos": scenario.qos,
        "rate": rate,
        "window_s": window,
        "offered_per_s": round(sum(p["window_sent"] for p in pubs.values()) / window, 1),
        "delivered_per_s": round(sub["window_deliveries"] / window, 1),
        "latency": sub["latency"],
        "sent": sent,
        "expected_deliveries": expected,
        "acked": sum(p["acked"] for p in pubs.values()) if scenario.qos else None,
        "unacked": sum(p["unacked"] for p in pubs.values()),
        "failed_acks": sum(p["failed_acks"] for p in pubs.values()),
        "delivered_unique": sub["unique"],
        "delivered_fraction": round(sub["unique"] / expected, 6) if expected else None,
        # At QoS 1 `lost` counts acknowledged messages that never arrived (the contract broken);
        # at QoS 0 losses are allowed, and the delivered fraction says how many.
        "lost": sub["lost"],
        "duplicates": sub["duplicates"],
        "reordered": sub["reordered"],
        "dup_flagged": sub["dup_flagged"],
        "wrong_qos": sub["wrong_qos"],
        "missing": sub["missing"],
        "drain_s": sub["drain_s"],
        "drain_timed_out": sub["drain_timed_out"],
        "qos0_window_resets": sum(p["window_resets"] for p in pubs.values()),
        "pacing_lag": pub_result.get("pacing_lag"),
        "cpu": cpu_view,
        "failures": failures,
    }


# --- the whole benchmark ------------------------------------------------------------------------


def select_scenarios(patterns: list[str] | None) -> tuple[list[Scenario], list[str]]:
    """The scenarios to run, plus notes (a paced run needs its saturated one for the rate)."""
    everything = all_scenarios()
    if not patterns:
        # The flood is a finding, not a figure: it runs when asked for by name.
        return [s for s in everything if s.mode != "flood"], []
    chosen = [s for s in everything if any(fnmatch.fnmatch(s.full_name, p) for p in patterns)]
    if not chosen:
        names = ", ".join(s.full_name for s in everything)
        raise SystemExit(f"bench: no scenario matches {patterns}; there are: {names}")
    return chosen, []


def pace_rates(
    saturated: dict[tuple[str, str], float],
    brokers: list[str],
    scenario: str,
    args: argparse.Namespace,
) -> dict[str, float | None]:
    """The paced rate per broker label; None where its saturated run failed (no rate)."""
    if args.rate:
        return dict.fromkeys(brokers, args.rate)
    known = {b: saturated[(b, scenario)] for b in brokers if saturated.get((b, scenario))}
    if args.pace_basis == "common" and known:
        common = round(min(known.values()) * args.pace)
        return {b: common if b in known else None for b in brokers}
    return {b: round(known[b] * args.pace) if b in known else None for b in brokers}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def compute_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """hexmq / mosquitto per scenario and mode (and, in the cluster suite, replication
    factor), for every hexmq of the run (hexmq, hexmq-2e, -plain, -colo, -base), each under
    its own label: >1 means hexmq is higher (better for throughput, slower for latency)."""
    ok = [r for r in runs if not r.get("error")]
    mosquitto = {
        (r["suite"], r["scenario"], r["mode"]): r for r in ok if r["broker"] == "mosquitto"
    }
    ratios = []
    for h in ok:
        m = mosquitto.get((h["suite"], h["scenario"], h["mode"]))
        if not h["broker"].startswith("hexmq") or m is None:
            continue
        ratios.append(
            {
                "suite": h["suite"],
                "label": h["label"],
                "rf": h["rf"],
                "scenario": h["scenario"],
                "shape": h["shape"],
                "mode": h["mode"],
                "throughput": _ratio(h["delivered_per_s"], m["delivered_per_s"]),
                "p50": _ratio(h["latency"].get("p50_us"), m["latency"].get("p50_us")),
                "p99": _ratio(h["latency"].get("p99_us"), m["latency"].get("p99_us")),
            }
        )
    return ratios


def _failed_run(
    broker: Broker, scenario: Scenario, rate: float | None, exc: Exception
) -> dict[str, Any]:
    return {
        "broker": broker.name,
        "label": broker.label,
        "suite": scenario.suite,
        "nodes": broker.nodes,
        "rf": broker.rf if isinstance(broker, Hexmq) else None,
        "scenario": scenario.name,
        "shape": scenario.shape,
        "mode": scenario.mode,
        "qos": scenario.qos,
        "rate": rate,
        "error": str(exc),
    }


class Bench:
    """The whole benchmark: the brokers it started, the runs so far, the results document."""

    def __init__(self, args: argparse.Namespace, doc: dict[str, Any]) -> None:
        self.args = args
        self.doc = doc
        self.runs: list[dict[str, Any]] = doc["runs"]
        self.run_no = 0
        self.live: list[Broker] = []  # started and not yet stopped

    def start(self, broker: Broker) -> Broker:
        print(f"bench: starting {broker.label}", file=sys.stderr)
        self.live.append(broker)
        broker.start()
        ports = ",".join(map(str, broker.ports))
        print(
            f"bench: {broker.label} {broker.version} on {LOOPBACK}:{ports} pids {broker.pids}",
            file=sys.stderr,
        )
        return broker

    def retire(self, broker: Broker) -> None:
        """Record its logs' findings, stop it, remove its files (unless --keep)."""
        if broker not in self.live:
            return
        self.live.remove(broker)
        self.doc["brokers"][broker.label] = {
            "version": broker.version,
            "ports": broker.ports,
            "nodes": broker.nodes,
            **({"rf": broker.rf} if isinstance(broker, Hexmq) else {}),
            "findings": broker.findings(),
            **({"settings": MOSQUITTO_SETTINGS} if broker.name == "mosquitto" else {}),
        }
        broker.stop()
        broker.cleanup(self.args.keep)
        if self.args.keep and broker.workdir is not None:
            print(f"bench: {broker.label} files kept in {broker.workdir}", file=sys.stderr)

    def run(
        self,
        broker: Broker,
        scenario: Scenario,
        rate: float | None,
        at_window: Callable[[float], None] | None = None,
        record: bool = True,
        window_s: float | None = None,
    ) -> dict[str, Any]:
        """One run, redone up to --redo-disturbed times while other work on the machine took
        more than DISTURBED_PCT of a core in its window; the least disturbed one counts."""
        attempts: list[dict[str, Any]] = []
        redo = self.args.redo_disturbed if record else 0
        for attempt in range(1 + redo):
            run = self._attempt(broker, scenario, rate, at_window, window_s)
            if run.get("error"):
                break
            attempts.append(run)
            other = run["cpu"].get("others_pct", 0.0)
            if other <= DISTURBED_PCT:
                break
            again = "; again" if attempt < redo else ""
            print(f"bench:   disturbed: cpu other {other:.0f}%{again}", file=sys.stderr)
        if attempts and not run.get("error"):
            run = min(attempts, key=lambda r: float(r["cpu"].get("others_pct", 0.0)))
            run["disturbed_attempts"] = [
                a["cpu"].get("others_pct") for a in attempts if a is not run
            ]
        if record:
            self.runs.append(run)
        return run

    def _attempt(
        self,
        broker: Broker,
        scenario: Scenario,
        rate: float | None,
        at_window: Callable[[float], None] | None,
        window_s: float | None,
    ) -> dict[str, Any]:
        self.run_no += 1
        label = f"{broker.label} {scenario.full_name}"
        if rate:
            label += f" at {rate:,.0f} msg/s"
        print(f"bench: run {self.run_no}: {label}", file=sys.stderr)
        busy_before = wait_for_quiet(self.args.quiet_wait)
        started = report.utc_now()
        # The batching stages' counters around the run (every service's /metrics).
        ports = broker.metrics_ports if isinstance(broker, Hexmq) else []
        counters = batch_counters(ports) if ports else {}
        try:
            run = run_once(
                broker,
                scenario,
                rate,
                self.args,
                self.run_no,
                list(self.live),
                at_window,
                window_s,
            )
            run["machine_busy_before_pct"] = busy_before
            run["started_utc"] = started
            if ports:
                run["batching"] = batching(counters, batch_counters(ports))
        except (WorkerFailure, BrokerFailure) as exc:
            print(f"bench: run {self.run_no} failed: {exc}", file=sys.stderr)
            run = _failed_run(broker, scenario, rate, exc)
        report.print_run(run)
        return run

    def suite(
        self,
        groups: list[list[Scenario]],
        brokers: list[Broker],
        after: Callable[[Broker, Scenario, dict[str, Any]], None] | None = None,
    ) -> None:
        """Each group shares a paced rate: its saturated runs first, then the rest. Within a
        scenario the brokers take turns, so drift on a shared machine touches them alike."""
        saturated: dict[tuple[str, str], float] = {}
        labels = [b.label for b in brokers]
        for group in groups:
            for scenario in group:
                rates: dict[str, float | None]
                if scenario.mode == "paced":
                    rates = pace_rates(saturated, labels, scenario.name, self.args)
                else:
                    rates = dict.fromkeys(labels)
                for b in brokers:
                    rate = rates[b.label]
                    if scenario.mode == "paced" and not rate:
                        print(
                            f"bench: {b.label} {scenario.full_name} skipped: no rate",
                            file=sys.stderr,
                        )
                        continue
                    run = self.run(b, scenario, rate)
                    if scenario.mode == "saturated" and not run.get("error"):
                        saturated[(b.label, scenario.name)] = run["delivered_per_s"]
                    if after is not None:
                        after(b, scenario, run)


def _groups(scenarios: list[Scenario], key: Callable[[Scenario], Any]) -> list[list[Scenario]]:
    """Scenarios grouped by `key` in first-seen order, saturated before paced in each group."""
    order = {"saturated": 0, "paced": 1, "flood": 2}
    groups: dict[Any, list[Scenario]] = {}
    for s in scenarios:
        groups.setdefault(key(s), []).append(s)
    return [sorted(g, key=lambda s: order[s.mode]) for g in groups.values()]


def profile_hook(
    bench: Bench, broker: Hexmq, scenario: Scenario, stem: str
) -> Callable[[Broker, Scenario, dict[str, Any]], None]:
    """--profile: after the measured run of `scenario` on `broker`, the same again with py-spy
    on node 1's edge and partition. Its figures go to the JSON, not the tables: the sampler
    costs the broker some CPU."""

    def after(b: Broker, s: Scenario, run: dict[str, Any]) -> None:
        if b is not broker or s != scenario or run.get("error"):
            return
        binary = pyspy.find_py_spy()
        if binary is None:
            bench.doc["profile"] = {"error": "py-spy not found (pip install py-spy)"}
            print("bench: --profile: py-spy not found (pip install py-spy)", file=sys.stderr)
            return
        targets = {f"n1-{role}": broker.node_pids[0][role] for role in ("edge", "partition")}
        sampler = pyspy.Sampler(binary, report.RESULTS_DIR, f"{stem}-profile")
        print(f"bench: --profile: py-spy on {targets} during a repeat run", file=sys.stderr)
        again = bench.run(
            b,
            s,
            None,
            at_window=lambda d: sampler.start(targets, d),
            record=False,
            window_s=bench.args.profile_duration,
        )
        results = sampler.finish()
        path = report.RESULTS_DIR / f"{stem}-profile.txt"
        header = (
            f"py-spy on {broker.label} node 1 during a repeat of {s.full_name} "
            f"({again.get('delivered_per_s', 0):,.0f} msg/s delivered with the sampler attached, "
            f"{run['delivered_per_s']:,.0f} without; cpu other "
            f"{again.get('cpu', {}).get('others_pct', 0):.0f}%); --nonblocking, Python frames "
            "only, line numbers merged"
        )
        path.write_text(pyspy.format_report(results, header) + "\n")
        bench.doc["profile"] = {
            "broker": broker.label,
            "scenario": s.full_name,
            "targets": targets,
            "file": str(path),
            "run": again,
            "processes": results,
        }
        print(f"bench: --profile: written to {path}", file=sys.stderr)

    return after


def single_hexmqs(args: argparse.Namespace) -> list[Hexmq]:
    """The single suite's one-node hexmqs, taking turns within each scenario."""
    return hexmq_variants(
        1, 1, edges=args.edges_per_node, colocated=args.colocated, baseline=args.baseline
    )


def cluster_hexmqs(args: argparse.Namespace) -> list[Hexmq]:
    """The cluster suite's clusters, all up for the whole suite: per replication factor each
    count of edges, co-located and the baseline as asked, and at the highest one plain-text
    links too (what TLS inside the cluster costs, where it costs most)."""
    return [
        h
        for rf in args.rf
        for h in hexmq_variants(
            args.nodes,
            rf,
            edges=args.edges_per_node,
            plain=args.plain and rf == args.rf[-1],
            colocated=args.colocated,
            baseline=args.baseline,
        )
    ]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 2.0, 1.0
        args.cluster_duration, args.cluster_warmup = 2.0, 1.0
        args.profile_duration = min(args.profile_duration, 4.0)
    if args.inflight > 65535:
        raise SystemExit("bench: --inflight is at most 65535 (MQTT packet ids)")
    scenarios, notes = select_scenarios(args.scenario)
    if any(s.cluster for s in scenarios) and args.rf[-1] > args.nodes:
        raise SystemExit(f"bench: --rf {args.rf[-1]} needs at least that many --nodes")
    names = list(BROKERS) if args.broker == "both" else [args.broker]
    if not args.rate:
        for s in [s for s in scenarios if s.mode == "paced"]:
            base = Scenario(s.qos, "saturated", s.shape, s.cluster)
            if base not in scenarios:
                scenarios.append(base)
                notes.append(f"{base.full_name} added: the paced run takes its rate from it")
    single = [s for s in all_scenarios() if s in scenarios and not s.cluster]
    cluster = [s for s in all_scenarios() if s in scenarios and s.cluster]
    if args.profile and (PROFILED not in cluster or "hexmq" not in names):
        notes.append(f"--profile ignored: it samples the {PROFILED.full_name} run on hexmq")
        args.profile = False

    machine = report.machine_facts()
    stem = report.result_stem(machine)
    doc: dict[str, Any] = {
        "machine": machine,
        "config": {
            "brokers": names,
            "scenarios": sorted(s.full_name for s in scenarios),
            "publishers": args.publishers,
            "payload_bytes": args.payload,
            "qos1_inflight_per_publisher": args.inflight,
            "warmup_s": args.warmup,
            "window_s": args.duration,
            "pace": args.rate or args.pace,
            "pace_basis": "fixed rate" if args.rate else args.pace_basis,
            "generator_processes": args.procs,
            "mqtt_protocol_level": args.mqtt,
            "edges_per_node": args.edges_per_node,
            "colocated": args.colocated,
            "baseline": args.baseline,
            "baseline_checkout": baseline_facts(args.baseline),
            "cluster": {
                "nodes": args.nodes,
                "rf": args.rf,
                "warmup_s": args.cluster_warmup,
                "window_s": args.cluster_duration,
                "fanin_publishers": args.fanin_publishers,
                "fanout_subscribers": args.fanout_subscribers,
                "pairs": args.pairs,
            },
        },
        "notes": notes,
        "brokers": {},
        "runs": [],
    }
    for note in notes:
        print(f"bench: {note}", file=sys.stderr)
    bench = Bench(args, doc)
    try:
        mosquitto = bench.start(make_broker("mosquitto")) if "mosquitto" in names else None
        others = [mosquitto] if mosquitto is not None else []
        if single:
            one = single_hexmqs(args) if "hexmq" in names else []
            for b in one:
                bench.start(b)
            bench.suite(_groups(single, lambda s: s.qos), one + others)
            for b in one:
                bench.retire(b)  # its idle processes stay out of the cluster suite
        if cluster:
            clusters = cluster_hexmqs(args) if "hexmq" in names else []
            for c in clusters:
                bench.start(c)
            after = None
            if args.profile:
                # The first of separate processes (with TLS) at the highest replication factor.
                target = next(c for c in clusters if c.rf == args.rf[-1] and c.profileable)
                after = profile_hook(bench, target, PROFILED, stem)
            bench.suite(_groups(cluster, lambda s: s.shape), [*clusters, *others], after)
    except KeyboardInterrupt:
        print("bench: interrupted; stopping the brokers", file=sys.stderr)
    except BrokerFailure as exc:
        print(f"bench: {exc}", file=sys.stderr)
        doc["error"] = str(exc)
    finally:
        for b in list(bench.live):
            bench.retire(b)
    runs = bench.runs
    doc["machine"]["loadavg_after"] = report.loadavg()
    doc["ratios"] = compute_ratios(runs)
    path = report.write_json(doc, args.out, stem)
    report.print_summary(doc, path)
    failed = any(r.get("error") or r.get("failures") or (r["qos"] and r.get("lost")) for r in runs)
    return 1 if failed or not runs or doc.get("error") else 0
