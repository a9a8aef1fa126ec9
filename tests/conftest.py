"""Fixtures shared by every test module: free ports and real local clusters.

    def test_something(hexmq_cluster):
        cluster = hexmq_cluster(nodes=2)
        port = cluster.mqtt_port(1)       # node numbers are 1-based, as on the command line
        cluster.kill(2); cluster.start(2)
        assert all(n["alive"] for n in cluster.status()["nodes"])

A cluster is started by the real `hexmq cluster up` of this venv and stopped by
`hexmq cluster down` when the test ends, pass or fail; the teardown then fails the test if any
process of that cluster is still running. `hexmq_cluster_module` is the same factory shared
by the tests of a module (down after its last test). `pick_base_port(nodes)` gives a free
port range for tests that run `hexmq cluster` themselves.

The time bounds of tests that start clusters follow how long starts take on this machine
(tests/support/start_bounds.py): every start here is timed, its `--timeout` and the pytest
timeout of every test using these fixtures are scaled by the pace that shows, and a start does
not count against the timeout of the test waiting for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hexmq_cli import clusterstate, procs
from tests.support import start_bounds
from tests.support.ports import LOW, ephemeral_low, worker_window

HEXMQ = Path(sys.executable).with_name("hexmq")

# Vendored third-party suites (Paho's client_test.py matches pytest's `*_test.py`): our own
# tests run them (tests/conformance/test_paho.py).
collect_ignore = ["third_party"]


def pick_base_port(nodes: int = 1, *, attempts: int = 100) -> int:
    """A base port whose whole cluster port range (see hexmq_cli.clusterstate) is free right now.

    Random rather than fixed, so that test runs of several people on one machine rarely
    collide; `hexmq_cluster` also retries `up` on another base port if one is taken meanwhile.
    """
    # Below the ephemeral range, in this worker's share (tests/support/ports.py).
    span = clusterstate.highest_port(0, nodes) + 1
    top = ephemeral_low()
    if top - span <= LOW:
        top = 65536
    low, top = worker_window(LOW, top, span)
    for _ in range(attempts):
        base = random.randint(low, top - span)
        if not clusterstate.busy_ports(clusterstate.cluster_ports(base, nodes)):
            return base
    raise RuntimeError(f"no free port range for {nodes} node(s) after {attempts} attempts")


@pytest.fixture(scope="session")
def cluster_prerequisites() -> None:
    """Fail, never skip, when the machine lacks what real clusters need: a skipped cluster
    test would hide a broken setup as a green run."""
    missing = []
    if shutil.which("redis-server") is None:
        missing.append("redis-server is not on PATH (Debian: apt-get install redis-server)")
    if not HEXMQ.exists():
        missing.append(f"{HEXMQ} does not exist (run `make venv`)")
    if missing:
        pytest.fail("cluster tests cannot run: " + "; ".join(missing), pytrace=False)


# How long each test file took in a recorded run of `make test` (seconds; `make test-durations`
# writes it again). Only the order of the run depends on it.
FILE_DURATIONS = Path(__file__).with_name("file_durations.json")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-file-durations",
        metavar="PATH",
        default=None,
        help="write how long each test file took (setup, call and teardown) to PATH as JSON",
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest test files first. `make test` hands out whole files to its workers in
    collection order (pytest-xdist `--dist loadfile --no-loadscope-reorder`; xdist's own reorder
    puts the files with the fewest tests last, which is where the Spark and cluster files are,
    so a run ended on its longest files, one or two workers busy and the rest idle). Files are
    ordered by their recorded duration (FILE_DURATIONS), longest first; a file with no record
    counts as the longest, so a new file is never the one a run waits for at its end. A file's
    tests stay together and in order."""
    try:
        recorded: dict[str, float] = json.loads(FILE_DURATIONS.read_text())
    except (OSError, ValueError):
        return
    unknown = max(recorded.values(), default=0.0) + 1.0
    items.sort(key=lambda item: -recorded.get(_file(item.nodeid), unknown))


class _FileDurations:
    """Sums each file's test phases as the reports arrive (on the controller under xdist)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        path = _file(report.nodeid)
        self.seconds[path] = self.seconds.get(path, 0.0) + report.duration

    def pytest_sessionfinish(self) -> None:
        ordered = dict(
            sorted(((f, round(s, 1)) for f, s in self.seconds.items()), key=lambda x: -x[1])
        )
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--record-file-durations")
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_FileDurations(Path(path)), "hexmq-file-durations")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """A test that starts clusters (or uses the Spark JVM) gets its timeout times the pace of
    this machine's starts (tests/support/start_bounds.py), set before pytest-timeout reads it."""
    pace = start_bounds.pace()
    timeout = start_bounds.configured_timeout(item)
    starts = {"cluster_prerequisites", "spark"} & set(getattr(item, "fixturenames", ()))
    if starts and pace > 1 and timeout:
        marker = item.get_closest_marker("timeout")
        options = {k: v for k, v in marker.kwargs.items() if k != "timeout"} if marker else {}
        if marker is not None and len(marker.args) > 1:
            options["method"] = marker.args[1]
        item.add_marker(pytest.mark.timeout(timeout * pace, **options), append=False)
    return (yield)


def running_processes(cluster_dir: Path) -> list[int]:
    """Pids of processes of the cluster in cluster_dir that still run: those recorded in its
    cluster.json, and any process carrying its environment marker (one spawned but never
    recorded)."""
    pids = set(procs.pids_with_env(clusterstate.ENV_MARKER, str(cluster_dir)))
    state = clusterstate.load_state(cluster_dir)
    if state is not None:
        records = [r for node in state.nodes for r in node.processes.values()]
        records += [state.consul] if state.consul is not None else []
        for record in records:
            if record.identity is not None and procs.is_running(record.identity):
                pids.add(record.identity.pid)
    return sorted(pids)


@dataclass
class HexmqCluster:
    """A running local cluster, driven through the `hexmq cluster` command line."""

    dir: Path
    nodes: list[dict[str, Any]]  # as printed by `up` (refreshed by `start`)
    cli_log: list[str] = field(default_factory=list)

    def cli(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run `hexmq cluster ACTION ... --dir DIR`; fail the test if it fails and check.
        `start` and `add` start a node: they are timed and bounded as starts
        (tests/support/start_bounds.py; compared with an `up` of the whole cluster, as they
        wait until every node serves sessions of every other); `timeout` bounds the other
        actions, times the pace."""
        argv = [str(HEXMQ), "cluster", *args, "--dir", str(self.dir)]
        if args[0] in ("start", "add"):
            if "--timeout" not in args:
                argv += ["--timeout", f"{start_bounds.step_timeout():g}"]
            nodes = len(self.nodes) + (args[0] == "add")
            result = start_bounds.run_start(argv, nodes, at_least=start_bounds.scaled(timeout))
        else:
            result = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=start_bounds.scaled(timeout),
                check=False,
            )
        self.cli_log.append(f"$ {' '.join(argv)}  -> {result.returncode}\n{result.stderr}")
        if check and result.returncode != 0:
            pytest.fail(
                f"`{' '.join(argv)}` exited with {result.returncode}:\n{result.stderr}",
                pytrace=False,
            )
        return result

    def node(self, i: int) -> dict[str, Any]:
        return self.nodes[i - 1]

    def mqtt_port(self, i: int) -> int:
        port: int = self.node(i)["mqtt_port"]
        return port

    def pids(self, i: int) -> dict[str, int]:
        pids: dict[str, int] = self.node(i)["pids"]
        return pids

    def service_pid(self, i: int, service: str) -> int:
        """The pid of node i's `service` (edge, partition, membership, redis): a co-located
        node's process for the three it runs."""
        pids = self.pids(i)
        return pids[service] if service in pids else pids["node"]

    def service_log(self, i: int, service: str) -> Path:
        """Node i's log of `service`: its own file, or a co-located node's."""
        own = self.dir / f"node{i}" / f"{service}.log"
        return own if service in self.pids(i) else self.dir / f"node{i}" / "node.log"

    def kill(self, i: int) -> None:
        self.cli("kill", str(i))

    def stop(self, i: int) -> None:
        self.cli("stop", str(i))

    def start(self, i: int) -> None:
        result = self.cli("start", str(i))
        (node,) = json.loads(result.stdout)["nodes"]
        self.nodes[i - 1] = node

    def add(self) -> int:
        """`hexmq cluster add`: node N+1 joins; returns its number."""
        (node,) = json.loads(self.cli("add").stdout)["nodes"]
        self.nodes.append(node)
        number: int = node["node"]
        return number

    def leave(self, i: int) -> str:
        """`hexmq cluster leave I`; returns what it wrote on stderr."""
        return self.cli("leave", str(i)).stderr

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.cli("status", "--json").stdout)
        return doc

    def down(self) -> None:
        self.cli("down")

    def running_processes(self) -> list[int]:
        return running_processes(self.dir)


def run_up(
    cluster_dir: Path,
    nodes: int,
    base_port: int,
    extra: Sequence[str] = (),
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`hexmq cluster up`, timed as a start; `timeout`: its --timeout (default
    `start_bounds.step_timeout()`); `env`: its environment (default this process's)."""
    if timeout is None:
        timeout = start_bounds.step_timeout()
    argv = [
        str(HEXMQ),
        "cluster",
        "up",
        *("--nodes", str(nodes)),
        *("--dir", str(cluster_dir)),
        *("--base-port", str(base_port)),
        *("--timeout", f"{timeout:g}"),
        *separate_unless_told(extra),
        *extra,
    ]
    return start_bounds.run_start(argv, nodes, env)


# HEXMQ_TEST_PACKING=colocated: the clusters of tests that name no packing run co-located
# nodes instead (`make test-colocated`, part of `make test-fault`: the conformance suite on
# `cluster up`'s default).
PACKING_VARIABLE = "HEXMQ_TEST_PACKING"


def separate_unless_told(extra: Sequence[str]) -> list[str]:
    """`--separate` unless `extra` names a packing (or HEXMQ_TEST_PACKING=colocated asks for
    co-located nodes): `cluster up` co-locates each node's services by default (issue 28), and
    make test's cluster tests run a process per service; tests/integration/test_colocated.py
    and the default's own test run co-located nodes, and so does `make test-colocated`."""
    told = any(
        a in ("--colocated", "--separate") or a.startswith("--edges-per-node") for a in extra
    )
    if told:
        return []
    packing = os.environ.get(PACKING_VARIABLE, "separate")
    if packing not in ("separate", "colocated"):
        raise pytest.UsageError(f"{PACKING_VARIABLE} is separate or colocated, not {packing!r}")
    return [f"--{packing}"]


@contextlib.contextmanager
def _cluster_factory(base_dir: Path) -> Iterator[Callable[..., HexmqCluster]]:
    made: list[HexmqCluster] = []

    def make(
        nodes: int = 1,
        *,
        partitions: int | None = None,
        timeout: float | None = None,
        extra: Sequence[str] = (),
    ) -> HexmqCluster:
        cluster_dir = base_dir / f"cluster{len(made) + 1}"
        args = list(extra)
        if partitions is not None:
            args += ["--partitions", str(partitions)]
        for attempt in range(3):
            if attempt:
                # The failed `up` may have reached a first view before it stopped: its
                # embedded Consul's state stays in the directory (a view without the stopped
                # node), and an `up` there would go on from it (view 3 where a fresh cluster
                # has 1).
                _tear_down([HexmqCluster(dir=cluster_dir, nodes=[])])
                if cluster_dir.exists():
                    shutil.rmtree(cluster_dir)
            result = run_up(cluster_dir, nodes, pick_base_port(nodes), args, timeout)
            # A port was taken between our check and `up` (by another test run, or by a port
            # the test chose for itself inside our range): try other ports.
            if result.returncode == 0 or "already in use" not in result.stderr:
                break
        cluster = HexmqCluster(dir=cluster_dir, nodes=[])
        made.append(cluster)  # tear down even a failed `up`: it may have left processes
        if result.returncode != 0:
            pytest.fail(
                f"hexmq cluster up exited with {result.returncode}:\n{result.stderr}",
                pytrace=False,
            )
        cluster.nodes = json.loads(result.stdout)["nodes"]
        return cluster

    try:
        yield make
    finally:
        _tear_down(made)


def _tear_down(clusters: Sequence[HexmqCluster]) -> None:
    problems = []
    for cluster in clusters:
        if (cluster.dir / clusterstate.STATE_FILE).exists():
            result = cluster.cli("down", check=False)
            if result.returncode != 0:
                problems.append(f"`hexmq cluster down` failed for {cluster.dir}:\n{result.stderr}")
        left = cluster.running_processes()
        if left:
            problems.append(f"processes {left} of {cluster.dir} still run after `down`")
            for pid in left:  # they carry this test's cluster marker: ours to remove
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def hexmq_cluster(
    tmp_path: Path, cluster_prerequisites: None
) -> Iterator[Callable[..., HexmqCluster]]:
    """Factory: `hexmq_cluster(nodes=1, partitions=None, timeout=None, extra=())` starts a
    cluster in a fresh directory under tmp_path and returns a `HexmqCluster` (`timeout`: the
    --timeout of `up`, default `start_bounds.step_timeout()`); every cluster it made is brought
    down when the test ends."""
    with _cluster_factory(tmp_path) as make:
        yield make


@pytest.fixture(scope="module")
def hexmq_cluster_module(
    tmp_path_factory: pytest.TempPathFactory, cluster_prerequisites: None
) -> Iterator[Callable[..., HexmqCluster]]:
    """The same factory with module scope: one cluster shared by the tests of a module (for
    tests that do not kill or stop nodes); brought down after the module's last test."""
    with _cluster_factory(tmp_path_factory.mktemp("clusters")) as make:
        yield make
