"""The brokers under test: hexmq clusters (one node, or several at a replication factor) and
Debian's mosquitto, each started in a throwaway directory on loopback ports, and stopped by what
we started (cluster dir, pid).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from services.edge.config import DEFAULT_MAX_INFLIGHT_V311
from tests.support.ports import free_port, port_free

LOOPBACK = "127.0.0.1"

# Log lines worth a look after a run; INFO chatter is not.
_FINDING = re.compile(r"\b(WARNING|ERROR|CRITICAL|Traceback|Exception)\b|Error:|Warning:")
# Known and harmless here: redis-server's advice about vm.overcommit_memory (a host setting;
# the benchmark's redis never forks for a background save).
_BENIGN = re.compile(r"Memory overcommit must be enabled")
# mosquitto settings that differ from its defaults, and why (printed in the report):
MOSQUITTO_SETTINGS = {
    "persistence": "false",  # nothing on disk: hexmq's durability is not being compared here
    "allow_anonymous": "true",
    # The same QoS 1 delivery window hexmq's edge gives a 3.1.1 subscriber (mosquitto's default
    # is 20, which would throttle it).
    "max_inflight_messages": str(DEFAULT_MAX_INFLIGHT_V311),
    # Default 1000 queued QoS 1 messages per client, then silent drops: raised far above what
    # the benchmark can have outstanding (8 publishers x the QoS 1 window).
    "max_queued_messages": "1000000",
    # asyncio (hexmq's edge and our clients) sets TCP_NODELAY on every TCP socket; mosquitto
    # does not by default, and Nagle's algorithm would then be measured instead of the broker.
    "set_tcp_nodelay": "true",
}


# hexmq settings that differ from its defaults in the benchmarks, as MOSQUITTO_SETTINGS: a
# session's queue as deep as mosquitto's here (the defaults, 1,000 messages and 16 MiB, are
# what a broker facing unknown clients keeps; a benchmark subscriber may lag further at full
# rate). bench/attacks.py runs the defaults.
HEXMQ_SETTINGS = {
    "HEXMQ_MAX_QUEUED_MESSAGES": MOSQUITTO_SETTINGS["max_queued_messages"],
    "HEXMQ_MAX_QUEUED_BYTES": str(1 << 40),
}


class BrokerFailure(Exception):
    pass


def tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def log_findings(paths: list[Path], limit: int = 8, root: Path | None = None) -> dict[str, Any]:
    """Warning/error lines in the given logs: a count and the first few, per file (named by
    its path under `root`, or its name)."""
    findings: dict[str, Any] = {}
    for path in paths:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        hits = [line for line in lines if _FINDING.search(line) and not _BENIGN.search(line)]
        if hits:
            name = str(path.relative_to(root)) if root is not None else path.name
            findings[name] = {"count": len(hits), "first": hits[:limit]}
    return findings


@dataclass
class Broker:
    name: str
    port: int = 0  # the first node's MQTT port
    # Every node's MQTT port, in node order (one for a single broker).
    ports: list[int] = field(default_factory=list)
    # Processes to account CPU to, by role ("edge", "partition", "mosquitto", ...).
    pids: dict[str, int] = field(default_factory=dict)
    workdir: Path | None = None
    version: str = ""
    nodes: int = 1
    rf: int = 1

    @property
    def label(self) -> str:
        """How runs and tables name it: "hexmq", "mosquitto", or "hexmq 3n rf2"."""
        return self.name if self.nodes == 1 else f"{self.name} {self.nodes}n rf{self.rf}"

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        return all(pid_alive(pid) for pid in self.pids.values())

    def findings(self) -> dict[str, Any]:
        return {}

    def cleanup(self, keep: bool) -> None:
        if self.workdir is not None and not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


class Hexmq(Broker):
    """`hexmq cluster up --nodes N --rf R` in a temporary directory; `cluster down` to stop.

    `python` runs the hexmq of another checkout (its venv's interpreter) under the name
    `hexmq-<variant>`: the moderate-load suite compares a baseline commit with this one in
    one session of runs (bench/moderate.py --baseline). `insecure`: the cluster's links in
    plain text (`up --insecure-cluster`) instead of mutual TLS, to show what TLS costs
    (variant "plain"). `colocated`: each node's services as one process (`up --colocated`,
    `hexmq node`; variant "colo"), calling each other in process, beside separate processes.
    `edges`: edge processes per node (`up --edges-per-node`, sharing the node's MQTT port;
    separate processes only, as `cluster up` has it), named `hexmq-<edges>e` unless a variant
    names it; each edge's CPU is counted as its own role (edge, edge2 ...)."""

    def __init__(
        self,
        nodes: int = 1,
        rf: int = 1,
        *,
        python: str | None = None,
        variant: str = "",
        insecure: bool = False,
        colocated: bool = False,
        settings: dict[str, str] | None = None,
        edges: int = 1,
    ) -> None:
        if colocated and edges > 1:
            # As `cluster up`: a co-located node runs one edge, in its hexmq node process.
            raise ValueError(f"edges={edges} needs separate processes, not colocated")
        variant = variant or (f"{edges}e" if edges > 1 else "")
        super().__init__(f"hexmq-{variant}" if variant else "hexmq", nodes=nodes, rf=rf)
        self.python = python or sys.executable
        # Another checkout's hexmq (`python` given, even this interpreter: the bench may run
        # from a worktree by PYTHONPATH): run as that checkout, see checkout().
        self.foreign = python is not None
        self.insecure = insecure
        self.colocated = colocated
        self.edges = edges
        # HEXMQ_* variables for every service of the cluster (`hexmq cluster` passes them on).
        self.settings = HEXMQ_SETTINGS if settings is None else settings
        # Per node (in order), its processes by role (a co-located node: redis and node): what
        # --profile attaches to.
        self.node_pids: list[dict[str, int]] = []
        # The cluster's agreement server (hexmq consul-dev), counted with the cluster's CPU.
        self.agreement_pid: int | None = None
        # Every service's Prometheus port (bench/moderate.py reads the batching counters).
        self.metrics_ports: list[int] = []

    @cached_property
    def _checkout(self) -> dict[str, str]:
        """checkout() of a foreign hexmq's interpreter, probed once: every `cluster` command
        (the status polls while followers catch up among them) needs its command module."""
        return checkout(self.python)

    @property
    def profileable(self) -> bool:
        """bench.cli's --profile target: this checkout's hexmq, separate processes, TLS."""
        return not (self.foreign or self.colocated or self.insecure)

    def _cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        module, env, cwd = "hexmq_cli", dict(os.environ), None
        if self.foreign:
            # That checkout's own command, nothing of this one on its path.
            module, env, cwd = self._checkout["cli_module"], foreign_env(), self.workdir
        return subprocess.run(
            [self.python, "-m", module, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**env, **self.settings},
            cwd=cwd,
        )

    def _mode_options(self) -> list[str]:
        """--colocated or --separate, as this hexmq runs: `cluster up` co-locates by default
        since issue 28; a checkout from before it has no --separate and separates by default."""
        if self.colocated:
            return ["--colocated"]
        if self.foreign and self._checkout["separate_option"] != "True":
            return []
        return ["--separate"]

    def _base_port(self) -> int:
        # MQTT on P..P+nodes-1; node i's internal services on P+1000+10*(i-1)+0..5, and its
        # further edges' metrics on +6.. (one each): all free.
        slots = 6 + self.edges - 1
        for _ in range(200):
            p = random.randrange(20000, 29000)
            wanted = [*range(p, p + self.nodes)]
            wanted += [p + 1000 + 10 * i + k for i in range(self.nodes) for k in range(slots)]
            if all(port_free(q) for q in wanted):
                return p
        raise BrokerFailure("no free port range for hexmq")

    def start(self) -> None:
        from hexmq import __version__

        self.version = self._checkout["version"] if self.foreign else __version__
        self.workdir = Path(tempfile.mkdtemp(prefix="hexmq-bench-"))
        done = self._cli(
            "cluster",
            "up",
            "--nodes",
            str(self.nodes),
            "--rf",
            str(self.rf),
            "--dir",
            str(self.workdir),
            "--base-port",
            str(self._base_port()),
            *(["--insecure-cluster"] if self.insecure else []),
            *self._mode_options(),
            *(["--edges-per-node", str(self.edges)] if self.edges > 1 else []),
            timeout=90,
        )
        if done.returncode != 0:
            raise BrokerFailure(f"hexmq cluster up failed ({done.returncode}): {done.stderr}")
        summary = json.loads(done.stdout)
        nodes = summary["nodes"]
        self.ports = [node["mqtt_port"] for node in nodes]
        self.port = self.ports[0]
        # One node keeps the names of the one-node benchmark; several are told apart by node.
        name = self.name

        def key(node: dict[str, Any], role: str) -> str:
            if self.nodes == 1:
                return f"{name}-{role}"
            return f"{name}-rf{self.rf}-n{node['node']}-{role}"

        self.pids = {key(node, role): pid for node in nodes for role, pid in node["pids"].items()}
        self.node_pids = [dict(node["pids"]) for node in nodes]
        self.metrics_ports = [
            port
            for node in nodes
            for role, port in (node.get("metrics_ports") or {}).items()
            # A co-located node's process has one registry, which each of its ports shows:
            # one of them, or its counters would count three times.
            if port and (role == "edge" or not node.get("colocated"))
        ]
        self.agreement_pid = (summary.get("consul") or {}).get("pid")
        if self.agreement_pid:
            suffix = "" if self.nodes == 1 else f"-rf{self.rf}"
            self.pids[f"{name}{suffix}-agreement"] = self.agreement_pid
        if self.rf > 1:
            self._wait_in_sync(timeout=30)

    def _wait_in_sync(self, timeout: float) -> None:
        """Wait until every follower of every partition is in sync: a run that starts while
        followers still catch up measures the catching up."""
        assert self.workdir is not None
        deadline = time.monotonic() + timeout
        while True:
            done = self._cli("cluster", "status", "--dir", str(self.workdir), "--json", timeout=30)
            behind = None
            if done.returncode == 0:
                behind = 0
                for node in json.loads(done.stdout)["nodes"]:
                    parts = node.get("partitions") or {}
                    followers = parts.get("followers")
                    if "error" in parts or followers is None:
                        behind = None
                        break
                    behind += sum(f["partitions"] - f["in_sync"] for f in followers.values())
            if behind == 0:
                return
            if time.monotonic() > deadline:
                print(
                    f"bench: {self.label}: followers not all in sync after {timeout:g} s "
                    f"({behind if behind is not None else 'unknown'} behind); going on",
                    file=sys.stderr,
                )
                return
            time.sleep(0.5)

    def stop(self) -> None:
        if self.workdir is None or not self.pids:
            return
        done = self._cli("cluster", "down", "--dir", str(self.workdir), timeout=120)
        if done.returncode != 0:
            print(f"bench: hexmq cluster down failed: {done.stderr}", file=sys.stderr)
        self.pids = {}

    def findings(self) -> dict[str, Any]:
        if self.workdir is None:
            return {}
        if self.nodes == 1:
            return log_findings(sorted((self.workdir / "node1").glob("*.log")))
        # Several nodes have logs of the same names: "node2/partition.log".
        return log_findings(sorted(self.workdir.glob("node*/*.log")), root=self.workdir)


class Mosquitto(Broker):
    """/usr/sbin/mosquitto with a throwaway config; stopped by the pid we started."""

    def __init__(self, binary: str = "/usr/sbin/mosquitto") -> None:
        super().__init__("mosquitto")
        self.binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if not Path(self.binary).exists():
            raise BrokerFailure(f"{self.binary} not found (apt-get install mosquitto)")
        self.workdir = Path(tempfile.mkdtemp(prefix="mosquitto-bench-"))
        self.port = free_port()
        lines = [f"listener {self.port} {LOOPBACK}", "log_dest stderr"]
        lines += [f"{key} {value}" for key, value in MOSQUITTO_SETTINGS.items()]
        config = self.workdir / "mosquitto.conf"
        config.write_text("\n".join(lines) + "\n")
        # stderr to a file we opened: run as root, mosquitto drops to its own user and could not
        # open a log file in our private temp dir itself.
        with (self.workdir / "mosquitto.log").open("wb") as log:
            # Own session: a Ctrl-C at the terminal reaches us, and we stop it in order.
            self.process = subprocess.Popen(
                [self.binary, "-c", str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pids = {"mosquitto": self.process.pid}
        self.ports = [self.port]
        deadline = time.monotonic() + 10
        while not tcp_accepts(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                log_text = (self.workdir / "mosquitto.log").read_text(errors="replace")
                raise BrokerFailure(f"mosquitto did not start: {log_text[-2000:]}")
            time.sleep(0.05)
        version = subprocess.run(
            [self.binary, "-h"], capture_output=True, text=True, check=False
        ).stdout.split("\n", 1)[0]
        self.version = version.removeprefix("mosquitto version ").strip()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(5)
        self.pids = {}

    def findings(self) -> dict[str, Any]:
        if self.workdir is None:
            return {}
        return log_findings([self.workdir / "mosquitto.log"])


def foreign_env() -> dict[str, str]:
    """The environment another checkout's interpreter runs in: without PYTHONPATH, which
    points at this checkout when the bench runs from a worktree (and would win over the
    other checkout's own path)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@cache
def checkout(python: str) -> dict[str, str]:
    """Which checkout another interpreter (a venv's python: `--baseline`) runs: the directory
    its `hexmq` package is imported from, that directory's commit, hexmq's version, and the
    module of its `hexmq` command: hexmq_cli, or hexmq.cli before issue 26 moved it (a venv
    whose site-packages have an editable install of another checkout finds that checkout's
    hexmq_cli when its own has none: a hybrid of both, so the module is chosen by what the
    checkout itself has). Run without PYTHONPATH and from a directory of no checkout, as its
    clusters are."""
    if not Path(python).exists():
        raise BrokerFailure(f"{python}: no such interpreter")
    probe = (
        "import hexmq, pathlib; "
        "print(pathlib.Path(hexmq.__file__).parent.parent, hexmq.__version__)"
    )
    try:
        done = subprocess.run(
            [python, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=foreign_env(),
            cwd="/",
        )
    except OSError as exc:
        raise BrokerFailure(f"{python} cannot import hexmq: {exc}") from None
    if done.returncode != 0:
        raise BrokerFailure(f"{python} cannot import hexmq: {done.stderr.strip()[-500:]}")
    root, _, version = done.stdout.strip().rpartition(" ")
    commit = subprocess.run(
        ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "python": python,
        "checkout": root,
        "commit": commit or "unknown",
        "version": version,
        "cli_module": "hexmq_cli" if (Path(root) / "hexmq_cli").is_dir() else "hexmq.cli",
        # Whether its `cluster up` takes --separate (co-located by default since issue 28; a
        # checkout without it runs separate processes by default).
        "separate_option": str(_cli_has(Path(root), '"--separate"')),
    }


def _cli_has(root: Path, text: str) -> bool:
    source = root / "hexmq_cli" / "cli.py"
    return source.is_file() and text in source.read_text(encoding="utf-8")


def hexmq_variants(
    nodes: int,
    rf: int,
    *,
    edges: list[int] | None = None,
    plain: bool = False,
    colocated: bool = False,
    baseline: str | None = None,
) -> list[Hexmq]:
    """The hexmqs that take turns in a suite, at one size and replication factor: one per
    count of edges per node (`hexmq`, `hexmq-2e` ...), then with plain-text cluster links
    (`hexmq-plain`), co-located (`hexmq-colo`: one edge per node, its node process's) and
    another checkout's (`hexmq-base`), each as asked. bench.cli and bench.moderate both."""
    variants = [Hexmq(nodes, rf, edges=e) for e in edges or [1]]
    if plain:
        variants.append(Hexmq(nodes, rf, variant="plain", insecure=True))
    if colocated:
        variants.append(Hexmq(nodes, rf, variant="colo", colocated=True))
    if baseline:
        variants.append(Hexmq(nodes, rf, python=baseline, variant="base"))
    return variants


def make_broker(name: str, nodes: int = 1, rf: int = 1, edges: int = 1) -> Broker:
    if name == "hexmq":
        return Hexmq(nodes, rf, edges=edges)
    if name == "mosquitto":
        return Mosquitto()
    raise ValueError(name)
