"""`python -m bench.moderate`: hexmq at the loads users run, beside mosquitto, in one session.

The saturated and half-saturated runs of `python -m bench` say what hexmq can carry; this
suite says what a message costs and how long it takes at fixed, moderate rates:

- **shape**: 20 QoS 1 publisher/subscriber pairs (`--pairs`), each pair on its own topic, every
  publisher on node 1 and every subscriber on node 2 (bench.shapes "split"; one node: both on
  it), 64-byte payloads, MQTT 3.1.1, open loop at the rate (within each publisher's QoS 1
  window of 64);
- **topologies** (`--topologies`): one node (`1n`), 3 nodes at RF 1 (`3n-rf1`) and at RF 3
  (`3n-rf3`), each a `hexmq cluster up` of its own, up only while its runs take place;
- **rates** (`--rates`): 1,000, 5,000 and 10,000 messages a second;
- **figures** per run: delivered rate, p50/p99/max publish-to-delivery latency, the drain
  (how long after the publishers stopped the last message arrived: a backlog means the
  broker fell behind), the CPU of every process of the broker (hexmq: each node's edge,
  partition, membership agent and Redis, plus the cluster's agreement server) and deliveries
  per CPU-second of all of them together;
- **memory per 1,000 connections** (`--memory N`): the edge's resident memory with N idle
  clean-session clients against without, on a fresh one-node hexmq, beside mosquitto's; then
  again once they left, for N more (the warm figure: what a connection keeps, without what
  a fresh process grows by the first time).

`--colocated` (on by default) adds each topology co-located, as `hexmq-colo` (`hexmq cluster
up --colocated`: a node's three services in one process), and `--plain` (on) one with the
cluster's links in plain text, `hexmq-plain`; they take turns with the default.
mosquitto runs each rate once, during the first topology. `--baseline PYTHON` adds a second
hexmq started with another checkout's interpreter (its venv: `/path/.venv/bin/python`; that
checkout's own `hexmq` command, run without PYTHONPATH: bench.brokers.checkout), named
`hexmq-base`: within each topology and rate the runs take turns (hexmq, hexmq-base,
mosquitto), so both commits meet the same machine and the same load from other people.
`python -m bench` has both options too (bench.cli.add_variant_options).
`--profile TOPOLOGY@RATE` (repeatable) repeats that run with py-spy on every Python process of
each hexmq (bench/pyspy.py) and writes their hottest functions next to the JSON results.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import pyspy, report
from bench.batches import print_batching
from bench.brokers import LOOPBACK, Broker, BrokerFailure, Hexmq, Mosquitto, hexmq_variants
from bench.cli import Bench, Scenario, _positive, add_variant_options, baseline_facts
from bench.stats import DISTURBED_PCT

TOPOLOGIES: dict[str, tuple[int, int]] = {"1n": (1, 1), "3n-rf1": (3, 1), "3n-rf3": (3, 3)}
DEFAULT_RATES = (1000, 5000, 10000)
SCENARIO = Scenario(1, "paced", "split", cluster=True)
# A run delivering less than this share of what was offered, or still delivering this long
# after the publishers stopped, fell behind.
BEHIND_SHARE = 0.98
BEHIND_DRAIN_S = 1.0
# py-spy's rate when it samples every process of a cluster at once (bench/pyspy.py uses 200 Hz
# for two): ten samplers at 200 Hz would take a good part of a core from the broker.
PROFILE_RATE_HZ = 100


def _topologies(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in TOPOLOGIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"topologies are a comma-separated list of {', '.join(TOPOLOGIES)}; got {text!r}"
        )
    return names


def _rates(text: str) -> list[int]:
    try:
        rates = [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"rates are integers, got {text!r}") from None
    if not rates or min(rates) <= 0:
        raise argparse.ArgumentTypeError(f"rates are more than 0, got {text!r}")
    return rates


def _profile_spec(text: str) -> tuple[str, int]:
    topology, _, rate = text.partition("@")
    if topology not in TOPOLOGIES or not rate.isdigit():
        raise argparse.ArgumentTypeError(
            f"--profile takes TOPOLOGY@RATE, e.g. 3n-rf3@5000; got {text!r}"
        )
    return topology, int(rate)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.moderate",
        description="hexmq at fixed moderate rates (QoS 1 pairs, publishers on node 1, "
        "subscribers on node 2) on one node and on 3 nodes at RF 1 and 3, beside mosquitto: "
        "latency, delivered rate, deliveries per CPU-second of the whole cluster, and memory "
        "per 1,000 idle connections. About 6 minutes on 2 cores (12 with --baseline).",
    )
    p.add_argument("--broker", choices=("hexmq", "mosquitto", "both"), default="both")
    p.add_argument(
        "--topologies",
        type=_topologies,
        default=list(TOPOLOGIES),
        metavar="LIST",
        help=f"of {', '.join(TOPOLOGIES)} (default: all)",
    )
    p.add_argument(
        "--rates",
        type=_rates,
        default=list(DEFAULT_RATES),
        metavar="LIST",
        help="messages a second, in all (default 1000,5000,10000)",
    )
    p.add_argument("--pairs", type=_positive(int), default=20, metavar="N")
    p.add_argument("--duration", type=_positive(float), default=4.0, metavar="S")
    p.add_argument("--warmup", type=_positive(float), default=1.5, metavar="S")
    p.add_argument("--payload", type=_positive(int), default=64, metavar="BYTES")
    p.add_argument("--inflight", type=_positive(int), default=64, metavar="N")
    p.add_argument(
        "--memory",
        type=int,
        default=1000,
        metavar="N",
        help="idle connections for the memory figure, on a fresh one-node hexmq and on "
        "mosquitto (default %(default)s; 0: skip)",
    )
    p.add_argument(
        "--plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run each hexmq topology with its cluster links in plain text "
        "(--insecure-cluster), as hexmq-plain, taking turns with the default mutual TLS: "
        "what TLS inside the cluster costs (default: on)",
    )
    add_variant_options(p, "each hexmq topology")
    p.add_argument(
        "--profile",
        type=_profile_spec,
        action="append",
        default=[],
        metavar="TOPOLOGY@RATE",
        help="repeat that run with py-spy on every Python process of each hexmq (needs "
        "py-spy: pip install py-spy); repeatable",
    )
    p.add_argument(
        "--profile-native",
        action="store_true",
        help="--profile with native frames (py-spy --native): C time (garbage collection, "
        "protobuf, gRPC's core) under its own name",
    )
    p.add_argument("--drain-timeout", type=_positive(float), default=15.0, metavar="S")
    p.add_argument("--quiet-wait", type=float, default=5.0, metavar="S")
    p.add_argument("--redo-disturbed", type=int, default=0, metavar="N")
    p.add_argument("--keep", action="store_true", help="keep the brokers' directories and logs")
    p.add_argument("--out", type=Path, help="JSON results file (default bench/results/...)")
    p.add_argument(
        "--table",
        type=Path,
        metavar="RESULTS.json",
        help="print that results file's tables as Markdown (for docs/benchmarks.md) and exit",
    )
    return p


def _run_args(args: argparse.Namespace) -> argparse.Namespace:
    """What bench.cli's run machinery reads from its own arguments."""
    return argparse.Namespace(
        mqtt=4,
        payload=args.payload,
        inflight=args.inflight,
        drain_timeout=args.drain_timeout,
        procs=2,
        pairs=args.pairs,
        fanin_publishers=0,
        fanout_subscribers=0,
        cluster_warmup=args.warmup,
        cluster_duration=args.duration,
        quiet_wait=args.quiet_wait,
        redo_disturbed=args.redo_disturbed,
        keep=args.keep,
        profile_duration=args.duration,
    )


def derive(run: dict[str, Any], topology: str) -> dict[str, Any]:
    """Add what this suite reports beyond a run's own figures: its topology, deliveries per
    CPU-second of every process of the broker, and whether it fell behind."""
    run["topology"] = topology
    if run.get("error"):
        return run
    cpu = run.get("cpu", {}).get("broker_pct") or 0.0
    delivered = run.get("delivered_per_s") or 0.0
    run["deliveries_per_cpu_s"] = round(delivered / (cpu / 100), 1) if cpu > 0 else None
    # Against the rate asked for, not what the publishers managed to send: a broker that
    # acknowledges slowly holds paced publishers back at their QoS 1 window.
    target = run.get("rate") or 0.0
    run["behind"] = bool(
        (target and delivered < BEHIND_SHARE * target)
        or run.get("drain_s", 0) > BEHIND_DRAIN_S
        or run.get("drain_timed_out")
    )
    return run


def rss_kib(pid: int) -> int | None:
    """Resident memory of a process, in KiB (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _hold_idle(
    broker: Broker, pids: dict[str, int], count: int, prefix: str
) -> tuple[dict[str, int | None], dict[str, int | None]] | str:
    """Resident memory of `pids` before `count` idle clean-session clients connect to the
    broker's first port and while they are held (each read 1 s after the change settled);
    the clients then leave. An error message if they could not all connect."""
    time.sleep(1.0)
    before = {role: rss_kib(pid) for role, pid in pids.items()}
    holder = subprocess.Popen(
        [sys.executable, "-m", "bench.idle", LOOPBACK, str(broker.port), str(count), prefix],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=report.REPO,
    )
    try:
        assert holder.stdout is not None
        line = holder.stdout.readline()
        answer = json.loads(line) if line else {"event": "error", "error": "no answer"}
        if answer.get("event") != "ready":
            return str(answer.get("error", "no answer"))
        time.sleep(1.0)
        after = {role: rss_kib(pid) for role, pid in pids.items()}
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        try:
            holder.wait(30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
    return before, after


def measure_memory(broker: Broker, pids: dict[str, int], count: int) -> dict[str, Any]:
    """Resident memory `pids` gain with `count` idle clean-session clients, twice on the same
    broker: the first clients on a fresh broker (what a just-started node grows by, heap and
    buffers warming up included), then, once they left, as many again (what each connection
    keeps once the process is warm). A process keeps some of what the first wave's connects
    and closes made it grow by, so the second figure is the one per connection; both are
    reported."""
    found: dict[str, Any] = {"connections": count}
    for wave in ("fresh", "again"):
        held = _hold_idle(broker, pids, count, f"idle-{wave}")
        if isinstance(held, str):
            return {"error": held, "connections": count}
        before, after = held
        per_1000: dict[str, float | None] = {}
        for role in pids:
            b, a = before.get(role), after.get(role)
            per_1000[role] = round((a - b) / 1024 * 1000 / count, 2) if a and b else None
        found[wave] = {"rss_before_kib": before, "rss_after_kib": after, "mib_per_1000": per_1000}
    return found


class ModerateSuite:
    def __init__(self, args: argparse.Namespace, doc: dict[str, Any], stem: str) -> None:
        self.args = args
        self.doc = doc
        self.stem = stem
        self.bench = Bench(_run_args(args), doc)
        self.doc.setdefault("memory", {})
        self.doc.setdefault("profiles", [])

    def hexmqs(self, nodes: int, rf: int) -> list[Hexmq]:
        return hexmq_variants(
            nodes,
            rf,
            plain=self.args.plain,
            colocated=self.args.colocated,
            baseline=self.args.baseline,
        )

    def run(self, names: list[str]) -> None:
        args, bench = self.args, self.bench
        mosquitto = bench.start(Mosquitto()) if "mosquitto" in names else None
        if mosquitto is not None and args.memory:
            self.doc["memory"]["mosquitto"] = measure_memory(
                mosquitto, {"mosquitto": mosquitto.pids["mosquitto"]}, args.memory
            )
        mosquitto_done = False
        for topology in args.topologies:
            nodes, rf = TOPOLOGIES[topology]
            clusters = []
            if "hexmq" in names:
                for cluster in self.hexmqs(nodes, rf):
                    clusters.append(bench.start(cluster))
                    if nodes == 1 and args.memory:
                        pids = {
                            role: pid
                            for role, pid in cluster.node_pids[0].items()
                            # A co-located node's "node" holds its edge.
                            if role in ("edge", "partition", "redis", "node")
                        }
                        self.doc["memory"][cluster.name] = measure_memory(
                            cluster, pids, args.memory
                        )
            turn: list[Broker] = [*clusters]
            if mosquitto is not None and not mosquitto_done:
                turn.append(mosquitto)
            for rate in args.rates:
                for broker in turn:
                    # (Bench reads the batching counters around every hexmq run.)
                    run = derive(bench.run(broker, SCENARIO, rate), topology)
                    if isinstance(broker, Hexmq) and (topology, rate) in args.profile:
                        self.profile(broker, topology, rate, run)
            mosquitto_done = mosquitto_done or mosquitto in turn
            for cluster in clusters:
                bench.retire(cluster)
        if mosquitto is not None:
            bench.retire(mosquitto)

    def profile(self, broker: Hexmq, topology: str, rate: int, measured: dict[str, Any]) -> None:
        """The same run again with py-spy on every Python process of `broker`."""
        binary = pyspy.find_py_spy()
        if binary is None:
            self.doc["profiles"].append({"error": "py-spy not found (pip install py-spy)"})
            print("bench: --profile: py-spy not found (pip install py-spy)", file=sys.stderr)
            return
        targets = {
            f"n{i + 1}-{role}": pid
            for i, roles in enumerate(broker.node_pids)
            for role, pid in roles.items()
            if role != "redis"
        }
        if broker.agreement_pid:
            targets["agreement"] = broker.agreement_pid
        stem = f"{self.stem}-profile-{broker.name}-{topology}-{rate}"
        sampler = pyspy.Sampler(
            binary,
            report.RESULTS_DIR,
            stem,
            rate_hz=PROFILE_RATE_HZ,
            native=self.args.profile_native,
        )
        print(f"bench: --profile: py-spy on {broker.label} {targets}", file=sys.stderr)
        again = self.bench.run(
            broker,
            SCENARIO,
            rate,
            at_window=lambda d: sampler.start(targets, d),
            record=False,
        )
        results = sampler.finish()
        path = report.RESULTS_DIR / f"{stem}.txt"
        cpu = again.get("cpu", {})
        header = (
            f"py-spy at {PROFILE_RATE_HZ} Hz on every Python process of {broker.label} during a "
            f"repeat of {topology} at {rate:,}/s ({again.get('delivered_per_s', 0):,.0f} msg/s "
            f"delivered with the samplers attached, {measured.get('delivered_per_s', 0):,.0f} "
            f"without; cpu other {cpu.get('others_pct', 0):.0f}%); CPU per process in the "
            f"repeat: {json.dumps(cpu.get('processes_pct', {}))}"
        )
        path.write_text(pyspy.format_report(results, header, rate_hz=PROFILE_RATE_HZ) + "\n")
        self.doc["profiles"].append(
            {
                "broker": broker.label,
                "topology": topology,
                "rate": rate,
                "file": str(path),
                "run": again,
                "processes": results,
            }
        )
        print(f"bench: --profile: written to {path}", file=sys.stderr)


def table(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per run: topology, broker, rate and its figures."""
    headers = [
        "topology",
        "broker",
        "rate/s",
        "deliv/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "drain s",
        "behind",
        "cpu broker",
        "deliv/cpu-s",
        "lost",
        "cpu other",
    ]
    rows = []
    for run in doc["runs"]:
        if run.get("error"):
            rows.append([run.get("topology", "?"), run["label"], str(run["rate"]), "failed"])
            rows[-1] += [""] * (len(headers) - len(rows[-1]))
            continue
        lat = run.get("latency", {})
        cpu = run.get("cpu", {})
        per_cpu = run.get("deliveries_per_cpu_s")
        rows.append(
            [
                run["topology"] if run["broker"] != "mosquitto" else "-",
                run["label"],
                f"{run['rate']:,.0f}",
                f"{run['delivered_per_s']:,.0f}",
                report._ms(lat.get("p50_us")),
                report._ms(lat.get("p99_us")),
                report._ms(lat.get("max_us")),
                f"{run.get('drain_s', 0):.2f}",
                "yes" if run.get("behind") else "no",
                f"{cpu.get('broker_pct', 0):.0f}%",
                "-" if per_cpu is None else f"{per_cpu:,.0f}",
                str(run.get("lost", "-")),
                f"{cpu.get('others_pct', 0):.0f}%",
            ]
        )
    return headers, rows


def memory_rows(doc: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    headers = ["broker", "connections", "process", "MiB per 1,000 fresh", "again (warm)"]
    rows = []

    def mib(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for name, found in doc.get("memory", {}).items():
        if "error" in found:
            rows.append([name, str(found["connections"]), "failed", found["error"], ""])
            continue
        # (Result files from before the second wave have one figure, at the top.)
        first = found.get("fresh") or found
        again = (found.get("again") or {}).get("mib_per_1000", {})
        for role, fresh in first["mib_per_1000"].items():
            rows.append([name, f"{found['connections']:,}", role, mib(fresh), mib(again.get(role))])
    return headers, rows


def print_summary(doc: dict[str, Any], path: Path) -> None:
    m, c = doc["machine"], doc["config"]
    print()
    print(
        f"hexmq {m['hexmq_commit'][:10]}{' (dirty tree)' if m['hexmq_tree_dirty'] else ''} | "
        f"{m['nproc']} CPUs ({m['cpu_model']}) | Python {m['python']} | load avg before "
        f"{m['loadavg_before']}, after {m['loadavg_after']}"
        + (f" | baseline: {c['baseline']}" if c.get("baseline") else "")
        + (f" at {c['baseline_checkout']['commit'][:10]}" if c.get("baseline_checkout") else "")
    )
    print(
        f"{c['pairs']} QoS 1 pairs, publishers on node 1 and subscribers on node 2, "
        f"{c['payload_bytes']}-byte payloads, fixed rates; warm-up {c['warmup_s']:g} s, window "
        f"{c['window_s']:g} s. deliv/cpu-s: deliveries per CPU-second of every process of the "
        f"broker (Redis and the agreement server included). behind: delivered under "
        f"{BEHIND_SHARE:.0%} of the rate, or a drain over {BEHIND_DRAIN_S:g} s. cpu "
        f"other above {DISTURBED_PCT:g}%: disturbed by other work on the machine."
    )
    print()
    print(report._table(*table(doc)))
    print_batching(doc["runs"], lambda run: f"{run['label']} at {run['rate']:,}/s")
    if doc.get("memory"):
        print()
        print(report._table(*memory_rows(doc)))
    for profile in doc.get("profiles", []):
        if "error" in profile:
            print(f"\nprofile: unavailable: {profile['error']}")
        else:
            print(f"\nprofile of {profile['broker']} at {profile['rate']:,}/s: {profile['file']}")
    report.print_findings(doc)
    print(f"\nresults: {path}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.table is not None:
        doc = json.loads(args.table.read_text())
        print(report.markdown_table(*table(doc)))
        if doc.get("memory"):
            print()
            print(report.markdown_table(*memory_rows(doc)))
        return 0
    names = ["hexmq", "mosquitto"] if args.broker == "both" else [args.broker]
    machine = report.machine_facts()
    stem = report.result_stem(machine) + "-moderate"
    doc: dict[str, Any] = {
        "suite": "moderate",
        "machine": machine,
        "config": {
            "brokers": names,
            "topologies": args.topologies,
            "rates": args.rates,
            "pairs": args.pairs,
            "payload_bytes": args.payload,
            "qos1_inflight_per_publisher": args.inflight,
            "warmup_s": args.warmup,
            "window_s": args.duration,
            "memory_connections": args.memory,
            "baseline": args.baseline,
            "baseline_checkout": baseline_facts(args.baseline),
        },
        "brokers": {},
        "runs": [],
    }
    suite = ModerateSuite(args, doc, stem)
    try:
        suite.run(names)
    except KeyboardInterrupt:
        print("bench: interrupted; stopping the brokers", file=sys.stderr)
    except BrokerFailure as exc:
        print(f"bench: {exc}", file=sys.stderr)
        doc["error"] = str(exc)
    finally:
        for b in list(suite.bench.live):
            suite.bench.retire(b)
    doc["machine"]["loadavg_after"] = report.loadavg()
    path = report.write_json(doc, args.out, stem)
    print_summary(doc, path)
    runs = doc["runs"]
    failed = any(r.get("error") or r.get("failures") or r.get("lost") for r in runs)
    return 1 if failed or not runs or doc.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
