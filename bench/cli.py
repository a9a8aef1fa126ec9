"""`python -m bench`: start the brokers, run the scenarios against each, report, stop.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import report
from bench.brokers import (
    LOOPBACK,
    MOSQUITTO_SETTINGS,
    Broker,
    BrokerFailure,
    make_broker,
)
from bench.clients import now_ns
from bench.stats import cpu_snapshot, cpu_usage

BROKERS = ("hexmq", "mosquitto")
QOS_LEVELS = (0, 1)
MODES = ("saturated", "paced", "flood")
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

    @property
    def name(self) -> str:
        return f"fanin-qos{self.qos}"

    @property
    def full_name(self) -> str:
        return f"{self.name}-{self.mode}"


class WorkerFailure(Exception):
    pass


def _positive(kind: type[float] | type[int]) -> Any:
    def parse(text: str) -> float | int:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="Fan-in benchmark (N publishers -> 1 wildcard subscriber) of hexmq and "
        "mosquitto on this machine, QoS 0 and 1, saturated and paced. Whole run: about "
        "(warm-up + duration + ~2 s) x runs; the default 8 runs take under 3 minutes.",
    )
    p.add_argument("--broker", choices=(*BROKERS, "both"), default="both")
    p.add_argument(
        "--scenario",
        action="append",
        metavar="PATTERN",
        help="run only scenarios matching this glob (repeatable): fanin-qos0-saturated, "
        "fanin-qos0-paced, fanin-qos1-saturated, fanin-qos1-paced, and fanin-qos0-flood (QoS 0 "
        "with no window; only when named); e.g. '*qos1*'. Default: all but the flood",
    )
    p.add_argument(
        "--duration",
        type=_positive(float),
        default=8.0,
        metavar="S",
        help="measurement window per run (default %(default)g s)",
    )
    p.add_argument(
        "--warmup",
        type=_positive(float),
        default=2.0,
        metavar="S",
        help="load before the window that is not measured (default %(default)g s)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: 2 s window, 1 s warm-up")
    p.add_argument("--publishers", type=_positive(int), default=8, metavar="N")
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
        help="common: both brokers paced at FRACTION of the slower one's saturated rate, so "
        "their latencies are compared under the same load; own: each at FRACTION of its own",
    )
    p.add_argument(
        "--rate",
        type=_positive(float),
        metavar="MSG_S",
        help="pace at this total rate (messages/s) instead of --pace",
    )
    p.add_argument(
        "--procs",
        type=int,
        choices=(1, 2),
        default=2,
        help="load-generator processes: 2 puts the subscriber in its own process, so its "
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


def run_once(
    broker: Broker,
    scenario: Scenario,
    rate: float | None,
    args: argparse.Namespace,
    run_no: int,
    all_brokers: list[Broker],
) -> dict[str, Any]:
    if not broker.alive():
        raise BrokerFailure(f"{broker.name} is not running (see its logs)")
    n = args.publishers
    progress_path = _progress_file(n)
    spec = {
        "host": LOOPBACK,
        "port": broker.port,
        "protocol_version": args.mqtt,
        "qos": scenario.qos,
        # A fresh topic tree and client ids per run: nothing left from an earlier run can match.
        "topic_prefix": f"bench/r{run_no}",
        "client_prefix": f"bench-{os.getpid()}-r{run_no}",
        "n_publishers": n,
        "payload_size": args.payload,
        "inflight": args.inflight,
        "rate": rate,
        "drain_timeout": args.drain_timeout,
        "mode": PUBLISHER_MODE[scenario.mode],
        "progress_path": str(progress_path),
    }
    # The subscriber is ready (subscribed) before any publisher starts, so nothing sent is
    # published to no one.
    roles = (
        [("generator", True, list(range(n)))]
        if args.procs == 1
        else [("subscriber", True, []), ("publishers", False, list(range(n)))]
    )
    workers: list[Worker] = []
    try:
        for name, subscriber, publishers in roles:
            workers.append(
                Worker(name, {**spec, "subscriber": subscriber, "publishers": publishers})
            )
            workers[-1].expect("ready", 30)
        sub_worker, pub_worker = workers[0], workers[-1]
        start = now_ns() + int(LEAD_S * 1e9)
        window = start + int(args.warmup * 1e9)
        window_end = window + int(args.duration * 1e9)
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
    return summarise(broker, scenario, rate, args, pub_result, sub_result, cpu_usage(before, after))


def summarise(
    broker: Broker,
    scenario: Scenario,
    rate: float | None,
    args: argparse.Namespace,
    pub_result: dict[str, Any],
    sub_result: dict[str, Any],
    cpu: dict[str, Any],
) -> dict[str, Any]:
    pubs = pub_result["publishers"]
    sub = sub_result["subscriber"]
    sent = sum(p["sent"] for p in pubs.values())
    window = args.duration
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
    return {
        "broker": broker.name,
        "scenario": scenario.name,
        "mode": scenario.mode,
        "qos": scenario.qos,
        "rate": rate,
        "window_s": window,
        "offered_per_s": round(sum(p["window_sent"] for p in pubs.values()) / window, 1),
        "delivered_per_s": round(sub["window_deliveries"] / window, 1),
        "latency": sub["latency"],
        "sent": sent,
        "acked": sum(p["acked"] for p in pubs.values()) if scenario.qos else None,
        "unacked": sum(p["unacked"] for p in pubs.values()),
        "failed_acks": sum(p["failed_acks"] for p in pubs.values()),
        "delivered_unique": sub["unique"],
        "delivered_fraction": round(sub["unique"] / sent, 6) if sent else None,
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
    everything = [Scenario(0, "flood")] + [
        Scenario(q, m) for q in QOS_LEVELS for m in MODES if m != "flood"
    ]
    if not patterns:
        # The flood is a finding, not a figure: it runs when asked for by name.
        return [s for s in everything if s.mode != "flood"], []
    chosen = [s for s in everything if any(fnmatch.fnmatch(s.full_name, p) for p in patterns)]
    if not chosen:
        names = ", ".join(s.full_name for s in everything)
        raise SystemExit(f"bench: no scenario matches {patterns}; there are: {names}")
    return chosen, []


def pace_rates(
    saturated: dict[tuple[str, int], float], brokers: list[str], qos: int, args: argparse.Namespace
) -> dict[str, float | None]:
    """The paced rate per broker; None where its saturated run failed (no rate to pace at)."""
    if args.rate:
        return dict.fromkeys(brokers, args.rate)
    known = {b: saturated[(b, qos)] for b in brokers if saturated.get((b, qos))}
    if args.pace_basis == "common" and known:
        common = round(min(known.values()) * args.pace)
        return {b: common if b in known else None for b in brokers}
    return {b: round(known[b] * args.pace) if b in known else None for b in brokers}


def compute_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """hexmq / mosquitto per scenario and mode: >1 means hexmq is higher (slower, for latency)."""
    by_key = {(r["broker"], r["scenario"], r["mode"]): r for r in runs if not r.get("error")}
    ratios = []
    for (broker, scenario, mode), h in by_key.items():
        m = by_key.get(("mosquitto", scenario, mode))
        if broker != "hexmq" or m is None:
            continue

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 3) if a is not None and b else None

        ratios.append(
            {
                "scenario": scenario,
                "mode": mode,
                "throughput": ratio(h["delivered_per_s"], m["delivered_per_s"]),
                "p50": ratio(h["latency"].get("p50_us"), m["latency"].get("p50_us")),
                "p99": ratio(h["latency"].get("p99_us"), m["latency"].get("p99_us")),
            }
        )
    return ratios


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.duration, args.warmup = 2.0, 1.0
    if args.inflight > 65535:
        raise SystemExit("bench: --inflight is at most 65535 (MQTT packet ids)")
    scenarios, notes = select_scenarios(args.scenario)
    names = list(BROKERS) if args.broker == "both" else [args.broker]
    need_saturated = {s.qos for s in scenarios if s.mode == "paced"} if not args.rate else set()
    for qos in sorted(need_saturated):
        if Scenario(qos, "saturated") not in scenarios:
            scenarios.append(Scenario(qos, "saturated"))
            notes.append(f"fanin-qos{qos}-saturated added: the paced run takes its rate from it")

    doc: dict[str, Any] = {
        "machine": report.machine_facts(),
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
        },
        "notes": notes,
        "brokers": {},
        "runs": [],
    }
    for note in notes:
        print(f"bench: {note}", file=sys.stderr)
    brokers = [make_broker(name) for name in names]
    runs: list[dict[str, Any]] = doc["runs"]
    run_no = 0
    try:
        for b in brokers:
            print(f"bench: starting {b.name}", file=sys.stderr)
            b.start()
            print(
                f"bench: {b.name} {b.version} on {LOOPBACK}:{b.port} pids {b.pids}", file=sys.stderr
            )
        saturated: dict[tuple[str, int], float] = {}
        for qos in QOS_LEVELS:
            # Interleaved by broker, saturated before paced: drift on a shared machine then
            # touches both brokers alike, and the paced rate is known when it is needed.
            for mode in MODES:
                scenario = Scenario(qos, mode)
                if scenario not in scenarios:
                    continue
                rates: dict[str, float | None]
                if mode == "paced":
                    rates = pace_rates(saturated, names, qos, args)
                else:
                    rates = dict.fromkeys(names)
                for b in brokers:
                    if mode == "paced" and not rates[b.name]:
                        print(
                            f"bench: {b.name} {scenario.full_name} skipped: no rate",
                            file=sys.stderr,
                        )
                        continue
                    run_no += 1
                    label = f"{b.name} {scenario.full_name}"
                    if rates[b.name]:
                        label += f" at {rates[b.name]:,.0f} msg/s"
                    print(f"bench: run {run_no}: {label}", file=sys.stderr)
                    busy_before = wait_for_quiet(args.quiet_wait)
                    try:
                        run = run_once(b, scenario, rates[b.name], args, run_no, brokers)
                        run["machine_busy_before_pct"] = busy_before
                    except (WorkerFailure, BrokerFailure) as exc:
                        print(f"bench: run {run_no} failed: {exc}", file=sys.stderr)
                        run = {
                            "broker": b.name,
                            "scenario": scenario.name,
                            "mode": mode,
                            "qos": qos,
                            "rate": rates[b.name],
                            "error": str(exc),
                        }
                    runs.append(run)
                    if mode == "saturated" and not run.get("error"):
                        saturated[(b.name, qos)] = run["delivered_per_s"]
                    report.print_run(run)
    except KeyboardInterrupt:
        print("bench: interrupted; stopping the brokers", file=sys.stderr)
    finally:
        for b in brokers:
            doc["brokers"][b.name] = {
                "version": b.version,
                "port": b.port,
                "findings": b.findings(),
                **({"settings": MOSQUITTO_SETTINGS} if b.name == "mosquitto" else {}),
            }
            b.stop()
            b.cleanup(args.keep)
            if args.keep and b.workdir is not None:
                print(f"bench: {b.name} files kept in {b.workdir}", file=sys.stderr)
    doc["machine"]["loadavg_after"] = report.loadavg()
    doc["ratios"] = compute_ratios(runs)
    path = report.write_json(doc, args.out)
    report.print_summary(doc, path)
    failed = any(r.get("error") or r.get("failures") or (r["qos"] and r.get("lost")) for r in runs)
    return 1 if failed or not runs else 0
