"""One fault run, inside its own network namespace: a cluster, the workload, a schedule of
faults with quiet periods, the heal, the drain, and every check; the result as JSON and the
latency plot as PNG.

Entered through `python -m tests.faults run` (tests/faults/__main__.py), which re-executes
itself under `unshare --net` first; everything here assumes it runs there.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hexmq.hashring import partition_of
from tests.faults import clock, nemesis, netns, plot
from tests.faults.clients import RunClients, arrivals, on_topics, read_retained
from tests.faults.cluster import AGREEMENT_ADDRESS, FaultCluster, node_address
from tests.faults.observe import (
    EpochWatch,
    LinkWatch,
    ViewRecorder,
    divergence,
    handed_over,
    wait_converged,
)
from tests.faults.verdict import (
    LINKS_CLEAR_S,
    SILENT_BOUND_S,
    Reachability,
    judge,
    nothing_silent,
)
from tests.support.checker import ack_stats, check, check_shared, retained_check
from tests.support.workload import DEEP_QUEUES

FAILOVER_HOLD_S = 10.0  # the edge's default --failover-hold
# The run's supervisor looks this often for processes that exited on a node no fault holds down.
SUPERVISE_EVERY_S = 2.0
# Faults that stop a node's processes on purpose: the supervisor leaves those nodes alone.
HOLDS_DOWN = (*nemesis.KILLS, "redis-kill", "pause", "leave-rejoin", "join-leave")
# The edge's default --unreachable-disconnect (3 x --failover-hold, at least 30 s): a live
# connection whose session's master stays unreachable that long is ended (issue 30).
UNREACHABLE_DISCONNECT_S = 30.0


@dataclass
class RunConfig:
    seed: int
    nodes: int = 3
    rf: int = 3
    partitions: int = 32
    kinds: list[str] | None = None  # None: every kind the cluster size allows
    length: float = 45.0  # faults start until this many seconds into the workload
    trace: bool = False
    colocated: bool = False  # each node one process (cluster up --colocated)
    out: Path = Path(".hexmq/faults")
    name: str = ""
    keep_data: bool = False

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"seed-{self.seed}"


@dataclass
class FaultRecord:
    fault: nemesis.Fault
    targets: nemesis.Targets
    start: float = 0.0
    end: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.fault.to_json(),
            "targets": self.targets.to_json(),
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "notes": self.notes,
        }

    def label(self) -> str:
        who = ",".join(f"n{n}" for n in self.targets.nodes)
        jump = f" {self.fault.jump_s:+d}s" if self.fault.kind == "clock-jump" else ""
        return f"{self.fault.kind} {who}{jump}".strip()


class Run:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.dir = (config.out / config.name).absolute()
        if self.dir.exists():
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        self.cluster = FaultCluster(self.dir / "cluster", config.nodes)
        self.skipped: dict[str, str] = {}
        self.kinds = nemesis.kinds_for(config.nodes, config.kinds, colocated=config.colocated)
        # The node a join-leave adds (and takes away again): its address, group id and clock
        # are ready from the start.
        self.spare = config.nodes + 1 if "join-leave" in self.kinds else 0
        numbers = range(1, config.nodes + 1 + (1 if self.spare else 0))
        self.network = netns.Network({i: node_address(i) for i in numbers}, AGREEMENT_ADDRESS)
        self.clocks: clock.Clocks | None = None
        self.records: list[FaultRecord] = []
        self.t0 = 0.0
        # The supervisor (`_supervise`): nodes a fault holds down, whether the agreement server
        # is down on purpose, and what it started again.
        self._held: set[int] = set()
        self._agreement_held = False
        self._next_supervise = 0.0
        self.restarts: list[dict[str, Any]] = []

    # --- set up -------------------------------------------------------------------------

    def _wrapper(self) -> str:
        if "clock-jump" in self.kinds:
            why = clock.why_unavailable()
            library = clock.find_libfaketime()
            if why is not None or library is None:
                self.skipped["clock-jump"] = why or "libfaketime not found"
                self.kinds = [k for k in self.kinds if k != "clock-jump"]
            else:
                nodes = self.config.nodes + (1 if self.spare else 0)
                self.clocks = clock.Clocks(self.dir / "clocks", nodes, library)
                return netns.node_wrapper(self.clocks.wrapper_args())
        return netns.node_wrapper()

    def _address(self, node: int) -> str:
        if node == nemesis.CLIENTS:
            return netns.CLIENT_ADDR
        return AGREEMENT_ADDRESS if node == nemesis.AGREEMENT else node_address(node)

    @staticmethod
    def _cuts_clients(targets: nemesis.Targets) -> list[int]:
        """The nodes a plain cut separates from 127.0.0.1 (the clients avoid them meanwhile)."""
        if not any(nemesis.CLIENTS in pair for pair in targets.plain):
            return []
        return list(targets.nodes)

    # --- faults -------------------------------------------------------------------------

    def _apply(self, record: FaultRecord, clients: RunClients) -> None:
        kind, t = record.fault.kind, record.targets
        if kind in HOLDS_DOWN:
            self._held |= set(t.nodes)
        self._agreement_held |= kind == "agreement-restart"
        if kind in nemesis.KILLS:
            clients.down |= set(t.nodes)
            for node in t.nodes:
                self.cluster.kill(node)
        elif kind == "pause":
            clients.down |= set(t.nodes)
            for node in t.nodes:
                self.cluster.pause(node)
        elif kind in nemesis.NETWORK:
            if t.groups:
                self.network.partition([[self._address(n) for n in g] for g in t.groups])
            for a, b in t.one_way:
                self.network.cut(self._address(a), self._address(b))
            for node in t.nodes if t.own else ():
                info = self.cluster.nodes[node]
                ports = {"partition": info.partition_port, "membership": info.membership_port}
                for service in t.own:
                    self.network.cut_own(info.host, ports[service])
            if t.plain:
                clients.down |= set(self._cuts_clients(t))
                kept = [
                    (self.cluster.nodes[n].host, self.cluster.nodes[n].redis_port) for n in t.nodes
                ]
                pairs = [(self._address(a), self._address(b)) for a, b in t.plain]
                self.network.plain_cut(pairs, keep=kept)
        elif kind == "agreement-restart":
            pid = self.cluster.kill_agreement()
            record.notes.append(f"agreement server pid {pid} killed")
        elif kind == "redis-kill":
            for node in t.nodes:
                record.notes.append(f"redis pids {self.cluster.kill_redis(node)} killed")
        elif kind == "clock-jump":
            assert self.clocks is not None
            for node in t.nodes:
                self.clocks.set(node, record.fault.jump_s)
                faked = self.cluster.preloaded(node, "libfaketime")
                record.notes.append(f"n{node}: libfaketime in {', '.join(faked) or 'nothing'}")
        elif kind == "leave-rejoin":
            clients.down |= set(t.nodes)
            for node in t.nodes:
                why = self.cluster.leave(node)
                record.notes.append(f"n{node} left" if why is None else f"n{node} leave: {why}")
        elif kind == "join-leave":
            for node in t.nodes:
                why = self.cluster.join(node)
                record.notes.append(f"n{node} joined" if why is None else f"n{node} join: {why}")

    def _heal(self, record: FaultRecord, clients: RunClients) -> None:
        kind, t = record.fault.kind, record.targets
        try:
            self._mend(record, clients)
        finally:
            if kind in HOLDS_DOWN:
                self._held -= set(t.nodes)
            if kind == "agreement-restart":
                self._agreement_held = False

    def _mend(self, record: FaultRecord, clients: RunClients) -> None:
        kind, t = record.fault.kind, record.targets
        if kind in nemesis.KILLS or kind == "redis-kill":
            for node in t.nodes:
                why = self.cluster.start(node)
                if why:
                    record.notes.append(f"start n{node} failed: {why}")
            clients.down -= set(t.nodes)
        elif kind == "pause":
            for node in t.nodes:
                self.cluster.resume(node)
            clients.down -= set(t.nodes)
        elif kind in nemesis.NETWORK:
            self.network.heal()
            clients.down -= set(self._cuts_clients(t))
        elif kind == "agreement-restart":
            why = self.cluster.start(1)
            if why:
                record.notes.append(f"agreement restart via start n1 failed: {why}")
        elif kind == "clock-jump":
            assert self.clocks is not None
            for node in t.nodes:
                self.clocks.set(node, 0)
        elif kind == "leave-rejoin":
            for node in t.nodes:
                why = self.cluster.join(node)
                record.notes.append(f"n{node} rejoined" if why is None else f"n{node}: {why}")
            clients.down -= set(t.nodes)
        elif kind == "join-leave":
            for node in t.nodes:
                record.notes.append(self._leave_for_good(node))

    def _leave_for_good(self, node: int) -> str:
        if node not in self.cluster.nodes:
            return f"n{node} never joined"
        why = self.cluster.leave(node)
        if why is not None:
            return f"n{node} leave: {why}"
        self.cluster.forget(node)
        return f"n{node} left"

    def _heal_everything(self) -> list[str]:
        """After the schedule, whatever is still broken (a start that failed, a spare node
        whose leave failed) is mended."""
        notes = []
        self.network.heal()
        for node in self.cluster.nodes:
            self.cluster.resume(node)
            if self.clocks is not None:
                self.clocks.set(node, 0)
        for node in self.cluster.nodes:
            if not self.cluster.running(node) or not self.cluster.agreement_running():
                why = self.cluster.start(node)
                notes.append(f"n{node} started after the schedule" + (f": {why}" if why else ""))
        if self.spare in self.cluster.nodes:
            notes.append(self._leave_for_good(self.spare))
        return notes

    def _sides(self, record: FaultRecord) -> dict[str, list[int]]:
        t = record.targets
        if record.fault.kind in ("isolate", "halves"):
            minority = set(t.minority)
            return {
                "minority": sorted(minority),
                "majority": sorted(set(self.cluster.nodes) - minority),
            }
        if record.fault.kind in ("cut-agreement", "one-way", "intra-node", "plain-cut"):
            return {
                "cut": list(t.nodes),
                "others": sorted(set(self.cluster.nodes) - set(t.nodes)),
            }
        return {f"n{n}": [n] for n in t.nodes}

    def _play(self, faults: Sequence[nemesis.Fault], clients: RunClients) -> None:
        """Each fault after the quiet period the schedule gives it, counted from the actual
        end of the one before (a restart can take longer than the fault was planned to)."""
        previous: FaultRecord | None = None
        for fault in faults:
            if previous is None:
                self._sleep_until(fault.at)
            else:
                planned = previous.fault
                quiet = fault.at - planned.at - planned.duration
                self._sleep_until(previous.end + quiet)
            view = self.cluster.view()
            table = self.cluster.table(view) if view is not None else []
            live = [n for n in self.cluster.nodes if n not in clients.down]
            record = FaultRecord(fault, nemesis.targets(fault, live, table, spare=self.spare))
            if view is not None:
                record.notes.append(f"view {view.epoch} at the start")
            self.records.append(record)
            record.start = self._now()
            self._apply(record, clients)
            if fault.kind in nemesis.NETWORK:
                self._sleep_until(record.start + min(1.0, fault.duration / 3))
                clients.subscribe_during(fault.index, self._sides(record))
            self._sleep_until(record.start + fault.duration)
            self._heal(record, clients)
            record.end = self._now()
            previous = record

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _sleep_until(self, at: float) -> None:
        while (delay := at - self._now()) > 0:
            self._supervise()
            time.sleep(min(delay, 1.0))

    def _supervise(self) -> None:
        """Start again what exited on a node no fault holds down, as systemd, compose's
        restart policy or Kubernetes do in every deployment: a partition service stops when it
        loses its Redis, so that it reloads from it on its restart, which after a redis-kill
        can come once the fault has healed (seed 4063: 12 s after; nothing started it again,
        and the cluster never converged). Each restart is recorded (`restarts`) and judged
        (verdict.py: one that a redis-kill of its node explains is a warning, any other a
        failure). The spare of a join-leave comes and goes with its fault."""
        now = self._now()
        if now < self._next_supervise or self._agreement_held:
            return
        self._next_supervise = now + SUPERVISE_EVERY_S
        for node in list(self.cluster.nodes):
            if node in self._held or node == self.spare:
                continue
            exited = self.cluster.exited(node)
            if exited:
                why = self.cluster.start(node)
                self.restarts.append(
                    {"node": node, "at": round(now, 3), "exited": exited, "start_failed": why or ""}
                )

    # --- the run ------------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        config = self.config
        netns.bring_up_loopback()
        self.network.install()
        wrapper = self._wrapper()
        faults = nemesis.schedule(config.seed, self.kinds, config.length)
        trace_dir = self.dir / "traces" if config.trace else None
        started = time.monotonic()
        self.cluster.up(
            rf=config.rf,
            partitions=config.partitions,
            wrapper=wrapper,
            trace_dir=trace_dir,
            colocated=config.colocated,
            # A subscriber cut off for a 20 s split misses more than the default 1,000
            # queued messages a session may hold; G1 wants every one.
            service_args=[DEEP_QUEUES],
        )
        up_s = time.monotonic() - started
        watch = EpochWatch(self.cluster)
        views = ViewRecorder(self.cluster)
        links = LinkWatch(self.cluster)
        tag = f"{config.seed:x}"
        clients = RunClients(tag, list(self.cluster.nodes.values()), config.seed, FAILOVER_HOLD_S)
        result: dict[str, Any] = {}
        try:
            clients.start()
            self.t0 = clients.t0
            # The wall clock at t0, for matching trace spans (unix ns) to the run's timeline.
            t0_wall_ns = time.time_ns() - int((time.monotonic() - self.t0) * 1e9)
            watch.start(self.t0)
            views.start(self.t0)
            links.start(self.t0)
            self._play(faults, clients)
            self._sleep_until(max(config.length, self._now()) + 3.0)
            heal_notes = self._heal_everything()
            healed_at = self._now()
            links.final_heal(healed_at)
            convergence = wait_converged(self.cluster, config.rf, timeout=120, tick=self._supervise)
            clients.stop_moving()
            unreconnected = clients.reconnect_all()
            clients.stop_publishers()
            stopped_at = self._now()
            drain_s = clients.drain(timeout=30)
            drained_at = self._now()
            clients.probe_split_subscriptions()
            links.wait_clear(within=max(SILENT_BOUND_S, LINKS_CLEAR_S) + 1.0)
            watch.stop()
            views.stop()
            links.stop()
            # Settled again before the replicas are compared: the view can change after the
            # first convergence (seed 4098: a node reported silent at load 39, its rejoin's
            # rebalance), and replicas compared while partitions move are not yet alike.
            settled = wait_converged(self.cluster, config.rf, timeout=120, tick=self._supervise)
            diverged = divergence(self.cluster)
            retained = retained_check(
                clients.retained, read_retained(tag, list(self.cluster.nodes.values())).by_node
            )
            prefix = f"f/{tag}/"
            report = check(clients.publishers, [on_topics(s, prefix) for s in clients.subscribers])
            group = check_shared(
                clients.publishers, "g", [on_topics(m, prefix) for m in clients.group]
            )
            acks = ack_stats(clients.publishers, start=0.0 + self.t0, end=stopped_at + self.t0)
            faults_json = [r.to_json() for r in self.records]
            silence = nothing_silent(
                [
                    *((f"fault {r.fault.index} ({r.fault.kind})", r.end) for r in self.records),
                    ("final heal", healed_at),
                ],
                [arrivals(s, prefix, self.t0) for s in clients.subscribers],
                clients.log.snapshot(),
                [
                    (at - self.t0, p.payload(n))
                    for p in clients.publishers
                    for n, at in list(p.acked.items())
                ],
                Reachability(faults_json, views.changes),
                partition_of=lambda cid: partition_of(cid, config.partitions),
                t0=self.t0,
                end=drained_at,
            )
            end = self._now()
            result = {
                "name": config.name,
                "seed": config.seed,
                "tag": tag,
                "t0_wall_ns": t0_wall_ns,
                "trace_dir": str(trace_dir) if trace_dir else None,
                "config": {
                    **{k: v for k, v in asdict(config).items() if k != "out"},
                    "kinds": self.kinds,
                },
                "skipped_nemeses": self.skipped,
                "machine": machine(),
                "timing": {
                    "cluster_up_s": round(up_s, 1),
                    "healed_at": round(healed_at, 1),
                    "converged_s": round(convergence.seconds, 1),
                    "publishers_stopped_at": round(stopped_at, 1),
                    "drain_s": round(drain_s, 1),
                    "drained_at": round(drained_at, 1),
                    "end": round(end, 1),
                },
                "faults": faults_json,
                "heal_notes": heal_notes,
                "restarts": self.restarts,
                "convergence": asdict(convergence),
                "settled": asdict(settled),
                "unreconnected": unreconnected,
                "counts": report.counts(),
                "problems": report.problems(),
                "shared_group": {
                    **asdict(group),
                    "handed_over": handed_over(self.cluster.dir, f"$share/g/{prefix}#"),
                },
                "retained": retained.to_json(),
                "ack": {
                    "count": acks.count,
                    "p50_ms": round(acks.p50 * 1000, 1),
                    "p99_ms": round(acks.p99 * 1000, 1),
                    "max_ms": round(acks.max * 1000, 1),
                    "longest_gap_s": round(acks.longest_gap, 2),
                    "longest_gap_at": round(acks.longest_gap_at - self.t0, 2),
                },
                "per_publisher": {
                    p.client_id: {
                        "qos": p.qos,
                        "sent": p.sent,
                        "acked": len(p.acked),
                        "refused": len(p.refused),
                        "unanswered": len(p.unanswered),
                        "longest_gap_s": round(p.longest_gap(), 2),
                    }
                    for p in clients.publishers
                },
                "epoch_conflicts": watch.conflicts(),
                "views": {"changes": views.changes, "missed": views.missed},
                "epoch_polls": watch.polls,
                "divergence": diverged.to_json() if diverged else None,
                "split_subscriptions": [asdict(r) for r in clients.split_subscriptions],
                "moves": clients.moves,
                "connections": [c.to_json(self.t0) for c in clients.log.snapshot()],
                "silence": silence,
                "links": links.to_json(),
            }
            versions = {s.client_id: s.version for s in [*clients.subscribers, *clients.group]}
            for pub in [*clients.publishers, *clients.retained.values()]:
                versions[pub.client_id] = pub.version
            result["verdict"] = judge(
                result,
                clients.log.snapshot(),
                clients.publishers,
                self.t0,
                FAILOVER_HOLD_S,
                versions=versions,
                unreachable_s=UNREACHABLE_DISCONNECT_S,
            )
            kinds = ", ".join(sorted({r.fault.kind for r in self.records}))
            plot.draw(
                self.dir / "latency.png",
                title=f"{config.name}: {config.nodes} nodes, RF {config.rf}, "
                f"{len(self.records)} faults ({kinds})",
                publishers=clients.publishers,
                t0=self.t0,
                faults=[
                    {"kind": r.fault.kind, "start": r.start, "end": r.end, "label": r.label()}
                    for r in self.records
                ],
                gap=(acks.longest_gap_at - self.t0, acks.longest_gap),
                end=end,
            )
            result["plot"] = str(self.dir / "latency.png")
            if config.trace:
                # What every subscriber got, for the trace cross-check (tests/faults/crosscheck.py).
                seen = {
                    "sent": {p.client_id: p.sent for p in clients.publishers},
                    "acked": {p.client_id: sorted(p.acked) for p in clients.publishers},
                    "received": {
                        s.client_id: on_topics(s, prefix).payloads()
                        for s in [*clients.subscribers, *clients.group]
                    },
                }
                (self.dir / "deliveries.json").write_text(json.dumps(seen) + "\n")
        except Exception:
            result = {
                "name": config.name,
                "seed": config.seed,
                "machine": machine(),
                "faults": [r.to_json() for r in self.records],
                "verdict": {"ok": False, "failures": ["the run itself failed"]},
                "error": traceback.format_exc(),
            }
        finally:
            watch.stop()
            views.stop()
            links.stop()
            clients.stop_moving()
            clients.stop_publishers()
            clients.close()
            self.cluster.down()
            result["cli_log_tail"] = self.cluster.cli_log[-6:]
            (self.dir / "result.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
            if result.get("verdict", {}).get("ok") and not config.keep_data:
                self._drop_data()
        return result

    def _drop_data(self) -> None:
        """A passing run keeps its result, plot and logs; its Redis data goes."""
        for node_dir in (self.dir / "cluster").glob("node*"):
            shutil.rmtree(node_dir / "redis", ignore_errors=True)


def machine() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_avg": [round(x, 2) for x in load],
    }
