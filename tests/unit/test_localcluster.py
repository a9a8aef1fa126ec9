"""The local cluster manager without services: ports, arguments, process identity, probes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from hexmq import __version__
from hexmq.readiness import Readiness
from hexmq.telemetry.metrics import start_metrics_server
from hexmq_cli import cli, clusterstate, localcluster, localmembers, localsecurity, procs
from hexmq_cli.clusterstate import NodePorts
from tests.conftest import pick_base_port, running_processes

# --- port scheme ----------------------------------------------------------------------------


def test_port_scheme_default_base() -> None:
    assert clusterstate.node_ports(1883, 1) == NodePorts(
        mqtt=1883, redis=2883, membership=2884, partition=2885
    )
    assert clusterstate.node_ports(1883, 3) == NodePorts(
        mqtt=1885, redis=2903, membership=2904, partition=2905
    )


def test_port_scheme_never_overlaps_for_the_largest_cluster() -> None:
    nodes = clusterstate.MAX_NODES
    ports = clusterstate.cluster_ports(20000, nodes)
    every = [p.of(s) for p in ports for s in clusterstate.SERVICES]
    every += [p.metrics(s) for p in ports for s in clusterstate.METRICS_SLOTS]
    every.append(clusterstate.agreement_port(20000, nodes))
    assert len(every) == len(set(every)) == 7 * nodes + 1
    assert max(every) <= clusterstate.highest_port(20000, nodes)


def test_the_agreement_server_has_the_block_after_the_last_node() -> None:
    assert clusterstate.agreement_port(1883, 3) == 1883 + 1000 + 30
    assert clusterstate.highest_port(1883, 3) == 1883 + 1000 + 39


def test_port_scheme_fits_up_to_the_last_valid_base_port() -> None:
    top = 65535 - clusterstate.INTERNAL_OFFSET - clusterstate.NODE_STRIDE * 4 + 1
    clusterstate.validate_cluster_args(nodes=3, base_port=top, partitions=256, rf=1)
    assert clusterstate.highest_port(top, 3) == 65535
    with pytest.raises(clusterstate.UsageError, match="too high"):
        clusterstate.validate_cluster_args(nodes=3, base_port=top + 1, partitions=256, rf=1)


# --- argument validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "--nodes: must be at least 1"),
        (["--nodes", "-2"], "--nodes: must be at least 1"),
        (["--nodes", "two"], "--nodes: expected a whole number"),
        (["--nodes", "101"], "--nodes must be between 1 and 100"),
        (["--base-port", "0"], "--base-port: a port is 1-65535"),
        (["--base-port", "70000"], "--base-port: a port is 1-65535"),
        (["--base-port", "http"], "--base-port: expected a port number"),
        (["--base-port", "80"], "--base-port must be between 1024 and 65535"),
        (["--base-port", "65000"], "too high for 1 node(s)"),
        (["--nodes", "2", "--rf", "3"], "--rf 3 needs at least 3 nodes, got --nodes 2"),
        (["--rf", "0"], "--rf: must be at least 1"),
        (["--partitions", "0"], "--partitions: must be at least 1"),
        (["--timeout", "0"], "--timeout: must be more than 0"),
        (["--hosts", "127.0.0.2,localhost"], "--hosts: 'localhost' is not an IPv4 address"),
        (["--hosts", "127.0.0.2,10.0.0.3"], "--hosts: 10.0.0.3 is not a loopback address"),
        (["--hosts", "127.0.0.2,127.0.0.2"], "--hosts: 127.0.0.2 listed more than once"),
        (["--hosts", "127.0.0.2,127.0.0.3", "--nodes", "3"], "lists 2 address(es) for --nodes 3"),
        (["--agreement-listen", "127.0.0.4"], "--agreement-listen must be HOST:PORT"),
        (["--agreement-listen", "127.0.0.4:0"], "--agreement-listen port must be 1-65535"),
        (["--agreement-listen", "192.168.1.2:8500"], "192.168.1.2 is not a loopback address"),
        (
            ["--agreement-listen", "127.0.0.4:8500", "--consul", "127.0.0.1:8500"],
            "with --consul (or CONSUL_HTTP_ADDR: an external Consul) there is none",
        ),
        (["--node-wrapper", "no-such-command-hexmq -x"], "'no-such-command-hexmq' not found"),
        (["--node-wrapper", "nice 'unclosed"], "--node-wrapper: No closing quotation"),
        (["--node-wrapper", " "], "--node-wrapper: empty command"),
        (
            ["--colocated", "--edges-per-node", "2"],
            "--edges-per-node 2 needs separate processes: a --colocated node runs one edge",
        ),
    ],
)
def test_up_rejects_bad_arguments_with_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    cluster_dir = tmp_path / "c"
    code = cli.main(["cluster", "up", "--dir", str(cluster_dir), *args])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert not cluster_dir.exists()


@pytest.mark.parametrize(
    ("args", "colocated"),
    [
        ([], True),  # co-located by default (issue 28: it measured better here)
        (["--colocated"], True),
        (["--separate"], False),
        (["--edges-per-node", "2"], False),  # several edges need separate processes
        (["--separate", "--edges-per-node", "3"], False),
    ],
)
def test_up_and_run_colocate_by_default_unless_told_or_given_several_edges(
    args: list[str], colocated: bool
) -> None:
    for action in ("up", "run"):
        parsed = cli.build_parser().parse_args(["cluster", action, "--dir", "x", *args])
        assert cli._colocated(parsed) is colocated


def test_up_takes_one_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["cluster", "up", "--dir", "x", "--colocated", "--separate"])
    assert code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["cluster", "stop", "0", "--dir", "x"],
        ["cluster", "kill", "one", "--dir", "x"],
        ["cluster", "start", "1"],  # --dir missing
        ["cluster", "explode", "--dir", "x"],
        ["cluster"],
    ],
)
def test_other_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert cli.main(argv) == 2
    assert "error:" in capsys.readouterr().err


def test_node_number_beyond_the_cluster_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=8, rf=1, python="py", redis_server="rs"
    )
    clusterstate.save_state(state)
    assert cli.main(["cluster", "kill", "3", "--dir", str(tmp_path)]) == 2
    assert "node 3 does not exist" in capsys.readouterr().err


def test_start_with_python_that_cannot_run_hexmq_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=1, base_port=30000, partitions=8, rf=1, python="py", redis_server="rs"
    )
    clusterstate.save_state(state)
    start = ["cluster", "start", "1", "--dir", str(tmp_path), "--python"]
    assert cli.main([*start, str(tmp_path / "nope")]) == 2
    assert f"--python {tmp_path / 'nope'}: not an executable file" in capsys.readouterr().err
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'hexmq'\" >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    assert cli.main([*start, str(fake)]) == 2
    err = capsys.readouterr().err
    assert "cannot import hexmq.cli (ModuleNotFoundError: No module named 'hexmq')" in err
    # Nothing changed: the node still runs from the Python it had.
    node = clusterstate.require_state(tmp_path).node(1)
    assert clusterstate.interpreter_of(node) == "py"


def test_a_nodes_interpreter_changes_for_its_services_not_its_redis(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=8, rf=1, python="old", redis_server="rs"
    )
    clusterstate.set_interpreter(state.node(2), "/new/venv/bin/python")
    clusterstate.save_state(state)
    loaded = clusterstate.require_state(tmp_path)
    for service in ("membership", "partition", "edge"):
        assert loaded.node(2).processes[service].argv[:4] == [
            "/new/venv/bin/python",
            "-P",
            "-m",
            "hexmq.cli",
        ]
        assert loaded.node(1).processes[service].argv[0] == "old"
    assert loaded.node(2).processes["redis"].argv[0] == "rs"
    assert clusterstate.interpreter_of(loaded.node(2)) == "/new/venv/bin/python"
    assert localcluster.check_interpreter(sys.executable) == str(Path(sys.executable).absolute())


def test_commands_on_a_directory_without_cluster_fail_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["cluster", "status", "--dir", str(tmp_path)]) == 1
    assert "no cluster in" in capsys.readouterr().err


def test_help_works_for_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--help"], ["cluster", "--help"], ["cluster", "up", "--help"]):
        assert cli.main(argv) == 0
    for action in ("run", "status", "stop", "kill", "start", "down"):
        assert cli.main(["cluster", action, "--help"]) == 0
    assert "--base-port" in capsys.readouterr().out


def test_cluster_commands_do_not_import_the_services() -> None:
    code = (
        "import sys; from hexmq_cli import cli; cli.build_parser(); "
        "print([m for m in sys.modules if m.startswith(('services', 'grpc'))])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_python_m_hexmq_cli_still_runs_the_command() -> None:
    # What every cluster.json records, of this release and the ones before it (and what
    # check_interpreter imports): the command's old module path runs the command...
    ran = subprocess.run(
        [sys.executable, "-P", "-m", "hexmq.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (ran.returncode, ran.stdout.strip(), ran.stderr) == (0, f"hexmq {__version__}", "")
    ran = subprocess.run(
        [sys.executable, "-P", "-m", "hexmq.cli", "cluster", "status", "--dir", "/nonexistent"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 1
    assert "no cluster in /nonexistent" in ran.stderr
    # ... but importing it (as check_interpreter does) loads nothing of the command's package,
    # nor the services or gRPC it would bring.
    code = (
        "import sys, hexmq.cli; "
        "print(sorted(m for m in sys.modules if m.startswith(('hexmq_cli', 'services', 'grpc'))))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# --- port in use ----------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        yield s


def bind_in_a_free_range(
    listener: socket.socket, port_of: Callable[[int], int], attempts: int = 20
) -> tuple[int, int]:
    """A base port of a free 2-node range, with `listener` listening on port_of(base) in it
    (another test's cluster may take a port between the check and the bind: another range)."""
    for _ in range(attempts):
        base = pick_base_port(2)
        try:
            listener.bind(("127.0.0.1", port_of(base)))
        except OSError:
            continue
        listener.listen()
        return base, port_of(base)
    raise RuntimeError(f"no free port range to bind in after {attempts} attempts")


@pytest.mark.parametrize("service", clusterstate.SERVICES)
def test_up_fails_on_a_port_in_use_and_starts_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    listener: socket.socket,
    service: str,
) -> None:
    base, taken = bind_in_a_free_range(
        listener, lambda b: clusterstate.node_ports(b, 2).of(service)
    )
    cluster_dir = tmp_path / "c"
    argv = ["cluster", "up", "--nodes", "2", "--dir", str(cluster_dir), "--base-port", str(base)]
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 1
    assert f"127.0.0.1:{taken} (node 2 {service})" in err
    assert "already in use" in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (cluster_dir / clusterstate.STATE_FILE).exists()
    assert running_processes(cluster_dir) == []


def test_up_fails_on_the_agreement_servers_port_in_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], listener: socket.socket
) -> None:
    base, taken = bind_in_a_free_range(listener, lambda b: clusterstate.agreement_port(b, 2))
    cluster_dir = tmp_path / "c"
    argv = ["cluster", "up", "--nodes", "2", "--dir", str(cluster_dir), "--base-port", str(base)]
    assert cli.main(argv) == 1
    assert f"already in use: 127.0.0.1:{taken} (agreement server)" in capsys.readouterr().err
    assert running_processes(cluster_dir) == []


def test_an_agreement_server_that_never_serves_is_stopped_when_up_gives_up(
    tmp_path: Path,
) -> None:
    """`up` stops what it started when a step fails, but the agreement server's own wait
    failing left it running (make test at load 20: consul-dev kept running after `up` timed
    out on it)."""
    state = clusterstate.plan_cluster(
        tmp_path / "c",
        nodes=1,
        base_port=pick_base_port(1),
        partitions=8,
        rf=1,
        python=sys.executable,
        redis_server="redis-server",
    )
    assert state.consul is not None
    state.dir.mkdir()
    state.consul.argv = [sys.executable, "-c", "import time; time.sleep(60)"]  # never listens
    with pytest.raises(localcluster.StartFailure, match="not serving"):
        localcluster.start_agreement(state, timeout=0.5)
    assert state.consul.identity is not None
    assert not state.consul.running()


def test_port_in_use_detection(listener: socket.socket) -> None:
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.listen()
    assert procs.port_in_use(port)
    listener.close()
    assert not procs.port_in_use(port)


def test_time_wait_leftovers_do_not_count_as_in_use() -> None:
    # After `kill` and `start` the old server side of a connection sits in TIME_WAIT on the
    # service's port; the restarted service binds anyway (SO_REUSEADDR), so must the check.
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio and redis do
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            conn, _ = server.accept()
            conn.close()  # the server closes first: its side goes to TIME_WAIT
            assert client.recv(1) == b""
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the premise: the port is in TIME_WAIT
    assert not procs.port_in_use(port)


def test_state_round_trips_through_json(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=16, rf=1, python="py", redis_server="rs"
    )
    state.nodes[1].processes["edge"].identity = procs.ProcessIdentity(42, 1234, "boot")
    assert state.consul is not None
    state.consul.identity = procs.ProcessIdentity(43, 1235, "boot")
    clusterstate.save_state(state)
    loaded = clusterstate.load_state(tmp_path)
    assert loaded is not None
    assert loaded.to_json() == state.to_json()
    assert loaded.summary()["nodes"][1]["pids"] == {
        "redis": None,
        "membership": None,
        "partition": None,
        "edge": 42,
    }


def test_plan_passes_the_service_flags_exactly(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=64, rf=1, python="py", redis_server="rs"
    )
    n2 = state.nodes[1].processes
    assert n2["redis"].argv == ["rs", str(tmp_path / "node2" / "redis.conf")]
    assert n2["edge"].argv[:4] == ["py", "-P", "-m", "hexmq.cli"]
    assert n2["membership"].argv[4:] == [
        *("membership", "--node-id", "n2", "--metrics-listen", "127.0.0.1:31015"),
        *("--listen", "127.0.0.1:31011"),
        *("--consul", "127.0.0.1:31020", "--cluster", tmp_path.name),
        *("--partition-addr", "127.0.0.1:31012", "--mqtt-addr", "127.0.0.1:30001"),
        *("--expect", "2", "--partitions", "64", "--rf", "1"),
    ]
    assert state.consul is not None
    assert state.consul.argv == [
        *("py", "-P", "-m", "hexmq.cli", "consul-dev", "--listen", "127.0.0.1:31020"),
        *("--data-dir", str(tmp_path / "consul")),
    ]
    assert state.consul.log == tmp_path / "consul.log"
    external = clusterstate.plan_cluster(
        tmp_path / "ext dir!",
        nodes=1,
        base_port=30000,
        partitions=64,
        rf=1,
        python="py",
        redis_server="rs",
        consul_addr="127.0.0.9:8500",
    )
    assert external.consul is None  # an external Consul: no agreement server of its own
    membership = external.nodes[0].processes["membership"].argv
    assert membership[membership.index("--consul") + 1] == "127.0.0.9:8500"
    assert membership[membership.index("--cluster") + 1] == "ext-dir"
    assert n2["partition"].argv[4:] == [
        *("partition", "--node-id", "n2", "--metrics-listen", "127.0.0.1:31014"),
        *("--listen", "127.0.0.1:31012"),
        *("--redis", "redis://127.0.0.1:31010/0", "--membership", "127.0.0.1:31011"),
    ]
    assert n2["edge"].argv[4:] == [
        *("edge", "--node-id", "n2", "--metrics-listen", "127.0.0.1:31013"),
        *("--listen", "127.0.0.1:30001"),
        *("--membership", "127.0.0.1:31011"),
    ]
    # Extra service flags and a trace directory land on every node's command lines.
    traced = clusterstate.plan_cluster(
        tmp_path,
        nodes=1,
        base_port=30000,
        partitions=64,
        rf=1,
        python="py",
        redis_server="rs",
        service_args={"edge": ["--sys-interval=1"]},
        trace_dir=tmp_path / "traces",
    )
    edge = traced.nodes[0].processes["edge"].argv
    assert edge[-1] == "--sys-interval=1"
    assert edge[edge.index("--trace-dir") + 1] == str(tmp_path / "traces")
    assert "--sys-interval=1" not in traced.nodes[0].processes["partition"].argv
    conf = clusterstate.redis_config(state.nodes[1]).splitlines()
    for line in (
        "port 31010",
        "bind 127.0.0.1",
        f'dir "{tmp_path}/node2/redis"',
        "appendonly yes",
        "appendfsync everysec",
        'save ""',
        "daemonize no",
        "protected-mode yes",
    ):
        assert line in conf


def test_plan_up_gives_every_process_what_up_starts_it_with_and_starts_nothing(
    tmp_path: Path,
) -> None:
    cluster_dir = tmp_path / "hexmq"
    state = localcluster.plan_up(cluster_dir, nodes=2, base_port=30000, partitions=64, rf=2)
    planned = localcluster.planned_processes(state)
    assert [(p.node, p.service) for p in planned] == [
        (None, "consul-dev"),
        *((n, s) for n in (1, 2) for s in clusterstate.SERVICES),
    ]
    by = {(p.node, p.service): p for p in planned}
    # The command lines are the state's, as `up` records and `start` runs them.
    assert list(by[2, "membership"].argv) == state.nodes[1].processes["membership"].argv
    assert by[2, "membership"].argv[by[2, "membership"].argv.index("--cluster") + 1] == "hexmq"
    # Secure by default: each service's own certificate, the node's Redis password, the
    # agreement server's token; the files exist, by name only.
    edge = by[1, "edge"].env
    assert edge["HEXMQ_CLUSTER_CERT"] == str(cluster_dir / "tls" / "n1" / "edge.crt")
    assert Path(edge["HEXMQ_CLUSTER_KEY"]).is_file()
    assert "HEXMQ_INSECURE_CLUSTER" not in edge
    partition = by[2, "partition"].env
    assert partition["HEXMQ_REDIS_USER"] == "hexmq"
    assert Path(partition["HEXMQ_REDIS_PASSWORD_FILE"]).is_file()
    assert by[1, "membership"].env["HEXMQ_CONSUL_TOKEN_FILE"] == str(cluster_dir / "consul.token")
    assert by[None, "consul-dev"].env == {"HEXMQ_ACL_TOKEN_FILE": str(cluster_dir / "consul.token")}
    config = by[1, "redis"].config
    assert config is not None
    assert "appendonly yes" in config.splitlines()
    assert [ln.split()[1] for ln in config.splitlines() if ln.startswith("user ")] == [
        "default",
        "hexmq",
        "operator",
    ]
    # Nothing started, no state file, no Redis config written: only the secrets.
    assert all(r.identity is None for n in state.nodes for r in n.processes.values())
    assert not (cluster_dir / clusterstate.STATE_FILE).exists()
    assert not (cluster_dir / "node1" / "redis.conf").exists()
    # An external Consul: no agreement server, no token of the cluster's.
    external = localcluster.planned_processes(
        localcluster.plan_up(tmp_path / "ext", nodes=1, consul="10.0.0.9:8500")
    )
    assert [p.service for p in external] == list(clusterstate.SERVICES)
    assert "HEXMQ_CONSUL_TOKEN_FILE" not in external[1].env


def test_edges_per_node_plans_edges_sharing_the_mqtt_port_each_with_its_own_id(
    tmp_path: Path,
) -> None:
    cluster_dir = tmp_path / "hexmq"
    state = localcluster.plan_up(
        cluster_dir,
        nodes=2,
        base_port=30000,
        partitions=16,
        rf=1,
        edges_per_node=3,
        service_args={"edge": ["--sys-interval=1"]},
    )
    n2 = state.nodes[1]
    assert list(n2.processes) == [*clusterstate.SERVICES, "edge2", "edge3"]
    assert n2.edges == ["edge", "edge2", "edge3"]
    assert [n2.process_id(e) for e in n2.edges] == ["n2", "n2-e2", "n2-e3"]
    assert n2.processes_of("edge") == ["edge", "edge2", "edge3"]
    assert n2.processes["edge"].argv[4:] == [
        *("edge", "--node-id", "n2", "--metrics-listen", "127.0.0.1:31013"),
        *("--listen", "127.0.0.1:30001", "--membership", "127.0.0.1:31011"),
        *("--reuse-port", "--sys-interval=1"),
    ]
    # Edge k: its own id and metrics port (the block's slot 4+k), the node's MQTT port.
    assert n2.processes["edge3"].argv[4:] == [
        *("edge", "--node-id", "n2", "--edge-id", "n2-e3"),
        *("--metrics-listen", "127.0.0.1:31017"),
        *("--listen", "127.0.0.1:30001", "--membership", "127.0.0.1:31011"),
        *("--reuse-port", "--sys-interval=1"),
    ]
    assert n2.processes["edge2"].log == cluster_dir / "node2" / "edge2.log"
    assert n2.summary()["metrics_ports"] == {
        "edge": 31013,
        "partition": 31014,
        "membership": 31015,
        "edge2": 31016,
        "edge3": 31017,
    }
    # Each edge presents a certificate of its own id.
    by = {(p.node, p.service): p for p in localcluster.planned_processes(state)}
    cert = Path(by[2, "edge2"].env["HEXMQ_CLUSTER_CERT"])
    assert cert == cluster_dir / "tls" / "n2-e2" / "edge.crt"
    assert cert.is_file()
    assert by[2, "edge"].env["HEXMQ_CLUSTER_CERT"] == str(cluster_dir / "tls" / "n2" / "edge.crt")
    # cluster.json keeps them, in start order.
    clusterstate.save_state(state)
    loaded = clusterstate.load_state(cluster_dir)
    assert loaded is not None
    assert loaded.to_json() == state.to_json()
    assert list(loaded.nodes[0].processes) == [*clusterstate.SERVICES, "edge2", "edge3"]
    assert clusterstate.edges_per_node(loaded) == 3
    # One edge per node: the command lines as before.
    single = clusterstate.plan_cluster(
        tmp_path, nodes=1, base_port=30000, partitions=16, rf=1, python="py", redis_server="rs"
    )
    assert "--reuse-port" not in single.nodes[0].processes["edge"].argv
    assert single.nodes[0].edges == ["edge"]


def test_an_added_node_runs_as_many_edges_as_the_others(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path,
        nodes=1,
        base_port=30000,
        partitions=16,
        rf=1,
        python="py",
        redis_server="rs",
        service_args={"edge": ["--sys-interval=1"]},
        edges_per_node=2,
    )
    n2 = localmembers.plan_added_node(state)
    assert n2.edges == ["edge", "edge2"]
    assert n2.processes["edge2"].argv[4:] == [
        *("edge", "--node-id", "n2", "--edge-id", "n2-e2"),
        *("--metrics-listen", f"127.0.0.1:{n2.ports.redis + 6}"),
        *("--listen", "127.0.0.1:30001", "--membership", f"127.0.0.1:{n2.ports.membership}"),
        *("--reuse-port", "--sys-interval=1"),
    ]
    assert n2.processes["edge"].argv[-2:] == ["--reuse-port", "--sys-interval=1"]


@pytest.mark.parametrize("count", [0, clusterstate.MAX_EDGES_PER_NODE + 1])
def test_edges_per_node_beyond_the_metrics_slots_is_a_usage_error(
    tmp_path: Path, count: int
) -> None:
    with pytest.raises(clusterstate.UsageError, match="--edges-per-node must be between 1 and 5"):
        localcluster.plan_up(tmp_path, nodes=1, edges_per_node=count)


def test_several_edges_per_node_take_separate_processes(tmp_path: Path) -> None:
    with pytest.raises(clusterstate.UsageError, match="needs separate processes"):
        localcluster.plan_up(tmp_path, nodes=1, edges_per_node=2, colocated=True)
    state = localcluster.plan_up(tmp_path, nodes=1, edges_per_node=1, colocated=True)
    assert list(state.nodes[0].process_names()) == ["redis", "node"]


def test_plan_places_each_node_on_its_host_and_wraps_its_command_lines(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path,
        nodes=2,
        base_port=30000,
        partitions=64,
        rf=1,
        python="py",
        redis_server="rs",
        hosts=["127.0.0.2", "127.0.0.3"],
        agreement_listen=("127.0.0.4", 8600),
        node_wrapper=["/usr/bin/env", "NODE={node}", "nice"],
    )
    n2 = state.nodes[1]
    assert n2.ports.host == "127.0.0.3"
    assert n2.ports.addr(n2.ports.mqtt) == "127.0.0.3:30001"  # the port scheme is unchanged
    assert state.consul_addr == "127.0.0.4:8600"
    assert (state.consul_host, state.consul_port) == ("127.0.0.4", 8600)
    assert state.consul is not None
    assert "127.0.0.4:8600" in state.consul.argv  # no wrapper on the agreement server
    procs_of_n2 = n2.processes
    for service in clusterstate.SERVICES:
        assert procs_of_n2[service].argv[:3] == ["/usr/bin/env", "NODE=2", "nice"], service
    assert procs_of_n2["redis"].argv[3:] == ["rs", str(tmp_path / "node2" / "redis.conf")]
    assert procs_of_n2["membership"].argv[7:] == [
        *("membership", "--node-id", "n2", "--metrics-listen", "127.0.0.3:31015"),
        *("--listen", "127.0.0.3:31011"),
        *("--consul", "127.0.0.4:8600", "--cluster", tmp_path.name),
        *("--partition-addr", "127.0.0.3:31012", "--mqtt-addr", "127.0.0.3:30001"),
        *("--expect", "2", "--partitions", "64", "--rf", "1"),
    ]
    assert procs_of_n2["partition"].argv[7:] == [
        *("partition", "--node-id", "n2", "--metrics-listen", "127.0.0.3:31014"),
        *("--listen", "127.0.0.3:31012"),
        *("--redis", "redis://127.0.0.3:31010/0", "--membership", "127.0.0.3:31011"),
    ]
    assert procs_of_n2["edge"].argv[7:] == [
        *("edge", "--node-id", "n2", "--metrics-listen", "127.0.0.3:31013"),
        *("--listen", "127.0.0.3:30001"),
        *("--membership", "127.0.0.3:31011"),
    ]
    conf = clusterstate.redis_config(n2).splitlines()
    assert "bind 127.0.0.3" in conf
    assert "protected-mode no" in conf  # its clients may come from 127.0.0.3, not 127.0.0.1
    assert state.nodes[0].processes["edge"].argv[1] == "NODE=1"
    # The hosts survive cluster.json (`start` finds the node where it was).
    clusterstate.save_state(state)
    loaded = clusterstate.load_state(tmp_path)
    assert loaded is not None
    assert loaded.to_json() == state.to_json()
    assert [n.ports.host for n in loaded.nodes] == ["127.0.0.2", "127.0.0.3"]
    assert loaded.summary()["nodes"][1]["host"] == "127.0.0.3"


def test_plan_refuses_hosts_that_do_not_match_the_nodes_and_a_listen_with_consul(
    tmp_path: Path,
) -> None:
    shape = {"base_port": 30000, "partitions": 8, "rf": 1, "python": "py", "redis_server": "rs"}
    with pytest.raises(clusterstate.UsageError, match="lists 1 address"):
        clusterstate.plan_cluster(tmp_path, nodes=2, hosts=["127.0.0.2"], **shape)
    with pytest.raises(clusterstate.UsageError, match="with --consul"):
        clusterstate.plan_cluster(
            tmp_path,
            nodes=1,
            consul_addr="127.0.0.1:8500",
            agreement_listen=("127.0.0.4", 8500),
            **shape,
        )


def test_a_state_file_without_hosts_reads_as_127_0_0_1(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=1, base_port=30000, partitions=8, rf=1, python="py", redis_server="rs"
    )
    doc = state.to_json()
    for node in doc["nodes"]:
        del node["host"]  # as written before --hosts existed
    (tmp_path / clusterstate.STATE_FILE).write_text(json.dumps(doc))
    loaded = clusterstate.load_state(tmp_path)
    assert loaded is not None
    assert loaded.nodes[0].ports.host == "127.0.0.1"


# --- process identity -----------------------------------------------------------------------


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[procs.ProcessIdentity]:
    sleep = shutil.which("sleep")
    assert sleep is not None
    ident = procs.spawn([sleep, "30"], tmp_path / "sleep.log", os.environ)
    yield ident
    procs.kill([ident])


def test_spawned_process_has_its_own_session(sleeper: procs.ProcessIdentity) -> None:
    assert procs.is_running(sleeper)
    assert os.getsid(sleeper.pid) == sleeper.pid
    assert os.getpgid(sleeper.pid) != os.getpgid(0)


def test_a_reused_pid_is_never_signalled(sleeper: procs.ProcessIdentity) -> None:
    # The same pid with another start time is what a reused pid looks like.
    impostor = replace(sleeper, start_ticks=sleeper.start_ticks + 1)
    assert not procs.is_running(impostor)
    assert not procs.send_signal(impostor, signal.SIGKILL)
    assert procs.is_running(sleeper)
    other_boot = replace(sleeper, boot_id="00000000-0000-0000-0000-000000000000")
    assert not procs.send_signal(other_boot, signal.SIGKILL)
    assert procs.is_running(sleeper)


def test_terminate_stops_and_reports_the_exit(sleeper: procs.ProcessIdentity) -> None:
    assert procs.terminate([sleeper], grace=5) == []
    assert not procs.is_running(sleeper)
    assert procs.describe_exit(sleeper.pid) == "was killed by SIGTERM"
    assert not procs.send_signal(sleeper, signal.SIGTERM)


def _exited_child(tmp_path: Path, code: int) -> procs.ProcessIdentity:
    """A child that has exited with `code` and is a zombie nobody has reaped yet."""
    ident = procs.spawn(["/bin/sh", "-c", f"exit {code}"], tmp_path / "exit.log", os.environ)
    stat = Path(f"/proc/{ident.pid}/stat")
    deadline = time.monotonic() + 10
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)
    return ident


def test_the_exit_code_is_named_even_if_nothing_looked_before(tmp_path: Path) -> None:
    ident = _exited_child(tmp_path, 3)
    assert procs.describe_exit(ident.pid) == "exited with code 3"
    assert not procs.is_running(ident)


def test_a_child_that_exits_while_it_is_looked_at_keeps_its_exit_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI saw "node 2 redis ... exited during startup" without the code: the child exited after
    # is_running's reap and before its read of /proc, so nothing collected the status.
    ident = _exited_child(tmp_path, 3)
    real_reap, calls = procs.reap, []

    def reap_that_comes_too_early(pid: int) -> None:
        calls.append(pid)
        if len(calls) > 1:  # the first one ran while the child was still running
            real_reap(pid)

    monkeypatch.setattr(procs, "reap", reap_that_comes_too_early)
    assert not procs.is_running(ident)
    monkeypatch.setattr(procs, "reap", lambda pid: None)  # only what is_running collected
    assert procs.describe_exit(ident.pid) == "exited with code 3"


def test_terminate_escalates_to_sigkill(tmp_path: Path) -> None:
    script = "trap '' TERM; echo ready; while :; do sleep 0.1; done"
    log = tmp_path / "stubborn.log"
    ident = procs.spawn(["/bin/sh", "-c", script], log, os.environ)
    deadline = time.monotonic() + 10
    while "ready" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs.terminate([ident], grace=0.3) == [ident]
    assert not procs.is_running(ident)


def test_environment_marker_finds_the_process(tmp_path: Path) -> None:
    env = {**os.environ, clusterstate.ENV_MARKER: str(tmp_path)}
    ident = procs.spawn(["/bin/sleep", "30"], tmp_path / "s.log", env)
    try:
        # Until the child has exec'ed, /proc shows the parent's environment: give it a moment.
        deadline = time.monotonic() + 5
        found = procs.pids_with_env(clusterstate.ENV_MARKER, str(tmp_path))
        while not found and time.monotonic() < deadline:
            time.sleep(0.01)
            found = procs.pids_with_env(clusterstate.ENV_MARKER, str(tmp_path))
        assert found == [ident.pid]
    finally:
        procs.kill([ident])
    assert procs.pids_with_env(clusterstate.ENV_MARKER, str(tmp_path)) == []


# --- readiness probes -----------------------------------------------------------------------


def test_mqtt_connect_packet_golden_bytes() -> None:
    assert procs.mqtt_connect_packet("p1", keepalive=30) == bytes(
        [
            *(0x10, 14),  # CONNECT, remaining length
            *(0, 4, *b"MQTT"),  # protocol name
            4,  # protocol level: 3.1.1
            0x02,  # flags: clean session
            *(0, 30),  # keep alive
            *(0, 2, *b"p1"),  # client identifier
        ]
    )
    client_id = procs.probe_client_id()
    assert client_id.isalnum()
    assert len(client_id) <= 23


def _one_shot_broker(answer: bytes) -> tuple[int, threading.Thread, list[bytes]]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    received: list[bytes] = []

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(5)
                received.append(conn.recv(1024))
                conn.sendall(answer)
                try:  # the DISCONNECT, if the client sends one before closing
                    received.append(conn.recv(1024))
                except ConnectionResetError:
                    received.append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server.getsockname()[1], thread, received


@pytest.mark.parametrize(("code", "ends_with_disconnect"), [(0, True), (3, False)])
def test_mqtt_connack_reports_the_return_code(code: int, ends_with_disconnect: bool) -> None:
    port, thread, received = _one_shot_broker(bytes([0x20, 2, 0, code]))
    assert procs.mqtt_connack(port) == code
    thread.join(5)
    assert received[0][0] == 0x10
    assert (received[1] == procs.MQTT_DISCONNECT) is ends_with_disconnect


def test_mqtt_connack_rejects_a_non_mqtt_answer() -> None:
    port, thread, _ = _one_shot_broker(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert procs.mqtt_connack(port) is None
    thread.join(5)


def test_a_connect_closed_without_connack_is_a_refusal_a_wrong_answer_is_not() -> None:
    # An edge that turns the probe away itself (a client limit) closes without a CONNACK.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def refuse() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    assert procs.mqtt_connect_answer(server.getsockname()[1]) == procs.ConnectAnswer(
        None, refused=True
    )
    thread.join(5)
    port, thread, _ = _one_shot_broker(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert procs.mqtt_connect_answer(port) == procs.ConnectAnswer(None, refused=False)
    thread.join(5)


@pytest.mark.parametrize(
    ("ready", "reason", "epoch"),
    [
        (True, "view 12: routes all 256 partitions", 12),
        (False, "view 12: 3 of 256 partitions have no master this edge can reach", None),
        (False, "no view from membership yet", None),
    ],
)
def test_ready_view_epoch_reads_an_edges_readyz(
    ready: bool, reason: str, epoch: int | None
) -> None:
    server = start_metrics_server("127.0.0.1", 0, readiness=lambda: Readiness(ready, reason))
    try:
        assert procs.ready_view_epoch(server.port) == epoch
    finally:
        server.close()


def test_mqtt_connack_against_mosquitto(tmp_path: Path) -> None:
    # A real broker checks the CONNECT bytes the way an edge will.
    mosquitto = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(mosquitto).exists():
        pytest.fail("mosquitto is not installed (Debian: apt-get install mosquitto)")
    port = pick_base_port(1)
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\n")
    ident = procs.spawn([mosquitto, "-c", str(conf)], tmp_path / "mosquitto.log", os.environ)
    try:
        deadline = time.monotonic() + 10
        while not procs.tcp_accepts(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs.mqtt_connack(port) == 0
    finally:
        procs.terminate([ident], grace=5)


def test_status_json_of_a_stopped_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=1, base_port=30000, partitions=8, rf=1, python="py", redis_server="rs"
    )
    clusterstate.save_state(state)
    assert cli.main(["cluster", "status", "--json", "--dir", str(tmp_path)]) == 0
    doc = json.loads(capsys.readouterr().out)
    (node,) = doc["nodes"]
    assert node["alive"] is False
    assert set(node["processes"]) == set(clusterstate.SERVICES)
    assert cli.main(["cluster", "status", "--dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "NODE" in table
    assert "dead" in table


def test_plan_with_static_discovery_lists_every_node_in_the_members_file(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path,
        nodes=3,
        base_port=30000,
        partitions=64,
        rf=1,
        python="py",
        redis_server="rs",
        discovery="static",
    )
    for node in state.nodes:
        argv = node.processes["membership"].argv
        # The first view waits for every node the file lists: no --expect.
        assert "--expect" not in argv
        start = argv.index("--discovery")
        assert argv[start : start + 4] == [
            *("--discovery", "static"),
            *("--discovery-static-file", str(tmp_path / "members")),
        ]
    text = clusterstate.members_file(state)
    assert text.startswith("#")
    # The agents' own parser reads what the manager writes: node ids and partition addresses.
    from services.membership.discovery.static import parse_members

    listing = parse_members(text, "members")
    assert {(n.node_id, n.host, n.port) for n in listing.nodes} == {
        ("n1", "127.0.0.1", 31002),
        ("n2", "127.0.0.1", 31012),
        ("n3", "127.0.0.1", 31022),
    }
    clusterstate.write_config(state)
    assert (tmp_path / "members").read_text() == text


def test_plan_without_discovery_writes_expect_as_before(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=8, rf=1, python="py", redis_server="rs"
    )
    argv = state.nodes[0].processes["membership"].argv
    assert argv[argv.index("--expect") + 1] == "2"
    assert not any(a.startswith("--discovery") for a in argv)


def test_plan_refuses_an_unknown_discovery(tmp_path: Path) -> None:
    with pytest.raises(
        clusterstate.UsageError, match="--discovery must be one of static, got 'dns'"
    ):
        clusterstate.plan_cluster(
            tmp_path,
            nodes=1,
            base_port=30000,
            partitions=8,
            rf=1,
            python="py",
            redis_server="rs",
            discovery="dns",
        )


def test_cluster_up_refuses_a_discovery_it_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["cluster", "up", "--dir", str(tmp_path / "c"), "--discovery", "dns"])
    assert code == 2
    assert "--discovery: invalid choice: 'dns' (choose from 'static')" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


# --- adding a node (hexmq_cli.localmembers) -------------------------------------------------------


def test_an_added_node_skips_the_agreement_servers_block_and_keeps_the_extra_arguments(
    tmp_path: Path,
) -> None:
    state = clusterstate.plan_cluster(
        tmp_path,
        nodes=2,
        base_port=30000,
        partitions=64,
        rf=1,
        python="py",
        redis_server="rs",
        service_args={"edge": ["--sys-interval=1"]},
    )
    n3 = localmembers.plan_added_node(state)
    # Block 2 (31020..) is the agreement server's: node 3 takes block 3.
    assert state.consul_port == 31020
    assert n3.node == 3
    assert n3.ports == NodePorts(mqtt=30002, redis=31030, membership=31031, partition=31032)
    assert n3.processes["edge"].argv[-1] == "--sys-interval=1"
    assert n3.processes["edge"].argv[4:9] == [
        "edge",
        "--node-id",
        "n3",
        "--metrics-listen",
        "127.0.0.1:31033",
    ]
    assert "--sys-interval=1" not in n3.processes["partition"].argv
    assert n3.processes["redis"].argv == ["rs", str(tmp_path / "node3" / "redis.conf")]
    state.nodes.append(n3)
    n4 = localmembers.plan_added_node(state)
    assert n4.ports.redis == 31040
    assert n4.ports.mqtt == 30003
    # Every port of the grown cluster is distinct.
    every = [n.ports.of(s) for n in [*state.nodes, n4] for s in clusterstate.SERVICES]
    every += [n.ports.metrics(s) for n in [*state.nodes, n4] for s in clusterstate.METRICS_SLOTS]
    assert len({*every, state.consul_port}) == len(every) + 1


def test_with_an_external_consul_an_added_node_takes_the_next_block(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path,
        nodes=2,
        base_port=30000,
        partitions=8,
        rf=1,
        python="py",
        redis_server="rs",
        consul_addr="127.0.0.1:8500",
    )
    assert localmembers.plan_added_node(state).ports.redis == 31020


def test_leave_and_add_need_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["cluster", "add", "--dir", str(tmp_path)]) == 1
    assert "no cluster in" in capsys.readouterr().err
    assert cli.main(["cluster", "leave", "1", "--dir", str(tmp_path)]) == 1
    assert "no cluster in" in capsys.readouterr().err


def test_a_stopped_node_cannot_leave(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=8, rf=1, python="py", redis_server="rs"
    )
    clusterstate.save_state(state)
    assert cli.main(["cluster", "leave", "3", "--dir", str(tmp_path)]) == 2
    assert "node 3 does not exist" in capsys.readouterr().err
    assert cli.main(["cluster", "leave", "2", "--dir", str(tmp_path)]) == 1
    assert "membership agent is not running, so it cannot leave" in capsys.readouterr().err
    assert cli.main(["cluster", "add", "--dir", str(tmp_path)]) == 1
    assert "no node of the cluster" in capsys.readouterr().err


def test_status_describes_a_rebalance_with_what_is_left(tmp_path: Path) -> None:
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=8, rf=2, python="py", redis_server="rs"
    )
    view = {
        "moving": 3,
        "under_replicated": 2,
        "offline": 0,
        "joining": ["n3"],
        "leaving": [],
        "target_members": ["n1", "n2", "n3"],
    }
    catching = {"catching_up": {"replicas": 2, "entries": 1500, "bytes": 2_400_000}}
    doc = {"membership": {"rebalance": view}, "nodes": [{"partitions": catching}, {}]}
    progress = localmembers.rebalance_progress(state, doc, sample_s=0)
    assert progress is not None
    assert progress["entries_left"] == 1500
    assert progress["bytes_left"] == 2_400_000
    assert progress["replicas_catching_up"] == 2
    assert localmembers.describe_progress(progress) == (
        "rebalance: 3 partition(s) moving (joining n3), 2 under-replicated; 2 replica(s) "
        "catching up, 1500 entries (2.4 MB) left; do not stop or add another node until it "
        "has finished"
    )
    # The estimate from bytes when bytes moved, else from entries.
    progress.update(entries_per_s=500, bytes_per_s=800_000, estimate_s=3.0)
    assert "(2.4 MB) left (~3 s at 0.8 MB/s)" in localmembers.describe_progress(progress)
    progress.update(bytes_per_s=None)
    assert "(2.4 MB) left (~3 s at 500 entries/s)" in localmembers.describe_progress(progress)
    view.update(moving=0, under_replicated=0, joining=[])
    doc["nodes"] = []
    settled = localmembers.rebalance_progress(state, doc, sample_s=0)
    assert localmembers.describe_progress(settled) == (
        "rebalance: none: every partition in sync at its placement"
    )
    assert localmembers.rebalance_progress(state, {"membership": None, "nodes": []}) is None


def test_the_rebalance_estimate_comes_from_the_bytes_copied_between_two_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot's entry lag is the partition's whole history: 100,000 entries that are
    copied in one go. Bytes say what is left: the estimate uses them."""
    state = clusterstate.plan_cluster(
        tmp_path, nodes=2, base_port=30000, partitions=8, rf=2, python="py", redis_server="rs"
    )
    view = {"moving": 1, "under_replicated": 1, "joining": ["n3"], "leaving": []}
    first = {"catching_up": {"replicas": 1, "entries": 100_000, "bytes": 3_000_000}}
    later = {"catching_up": {"replicas": 1, "entries": 100_000, "bytes": 2_000_000}}
    monkeypatch.setattr(localmembers, "_partition_statuses", lambda state: [{"partitions": later}])
    monkeypatch.setattr(localmembers.time, "sleep", lambda s: None)
    doc = {"membership": {"rebalance": view}, "nodes": [{"partitions": first}]}
    progress = localmembers.rebalance_progress(state, doc, sample_s=0.5)
    assert progress is not None
    assert (progress["bytes_left"], progress["bytes_per_s"]) == (2_000_000, 2_000_000)
    assert progress["entries_per_s"] is None  # no entry acknowledged in that second
    assert progress["estimate_s"] == 1.0
    # Nothing copied in bytes (a log catch-up measured by entries only): from entries.
    later["catching_up"] = {"replicas": 1, "entries": 40_000, "bytes": 3_000_000}
    progress = localmembers.rebalance_progress(state, doc, sample_s=0.5)
    assert progress is not None
    assert (progress["entries_per_s"], progress["bytes_per_s"]) == (120_000, None)
    assert progress["estimate_s"] == 0.3


def test_an_added_node_follows_static_discovery_and_refuses_what_add_cannot_repeat(
    tmp_path: Path,
) -> None:
    shape = {"base_port": 30000, "partitions": 8, "rf": 1, "python": "py", "redis_server": "rs"}
    state = clusterstate.plan_cluster(tmp_path / "a", nodes=2, discovery="static", **shape)
    n3 = localmembers.plan_added_node(state)
    argv = n3.processes["membership"].argv
    assert "--expect" not in argv
    assert argv[argv.index("--discovery-static-file") + 1] == str(tmp_path / "a" / "members")
    state.nodes.append(n3)
    assert "n3 127.0.0.1:31032" in clusterstate.members_file(state)
    legacy = clusterstate.plan_cluster(
        tmp_path / "b", nodes=2, node_wrapper=["nice", "-n", "5"], **shape
    )
    legacy.node_wrapper = None  # a cluster.json written before the wrapper was recorded
    with pytest.raises(clusterstate.UsageError, match=r"--node-wrapper that its cluster\.json"):
        localmembers.plan_added_node(legacy)
    placed = clusterstate.plan_cluster(
        tmp_path / "c", nodes=2, hosts=["127.0.0.2", "127.0.0.3"], **shape
    )
    with pytest.raises(clusterstate.UsageError, match="--host ADDR"):
        localmembers.plan_added_node(placed)
    with pytest.raises(clusterstate.UsageError, match="node 2 binds that address"):
        localmembers.plan_added_node(placed, "127.0.0.3")
    with pytest.raises(clusterstate.UsageError, match="is not a loopback address"):
        localmembers.plan_added_node(placed, "10.0.0.4")
    with pytest.raises(clusterstate.UsageError, match="one address"):
        localmembers.plan_added_node(placed, "127.0.0.4,127.0.0.5")
    with pytest.raises(clusterstate.UsageError, match=r"all bind 127\.0\.0\.1"):
        localmembers.plan_added_node(state, "127.0.0.4")


def test_an_added_node_repeats_the_node_wrapper_and_binds_its_own_address(
    tmp_path: Path,
) -> None:
    """The fault suite's clusters: nodes on addresses of their own, every process under a
    wrapper with {node} in it (tests/faults/node-exec); node 3 gets both, like nodes 1-2."""
    state = clusterstate.plan_cluster(
        tmp_path,
        nodes=2,
        base_port=30000,
        partitions=8,
        rf=1,
        python="py",
        redis_server="rs",
        hosts=["127.0.0.11", "127.0.0.12"],
        agreement_listen=("127.0.0.10", 31020),
        node_wrapper=["node-exec", "4710{node}", "--"],
        service_args={"edge": ["--sys-interval=1"]},
    )
    reloaded = clusterstate.ClusterState.from_json(state.to_json())
    with pytest.raises(clusterstate.UsageError, match="the agreement server binds"):
        localmembers.plan_added_node(reloaded, "127.0.0.10")
    n3 = localmembers.plan_added_node(reloaded, "127.0.0.13")
    assert n3.ports.host == "127.0.0.13"
    for service in clusterstate.SERVICES:
        argv = n3.processes[service].argv
        assert argv[:3] == ["node-exec", "47103", "--"], service
        first = state.nodes[0].processes[service].argv
        # The same command line as node 1's past the wrapper, but for node 3.
        assert len(argv) == len(first)
        assert argv[3] == first[3]
    edge = n3.processes["edge"].argv
    assert edge[-1] == "--sys-interval=1"
    assert edge[edge.index("--node-id") + 1] == "n3"
    assert edge[edge.index("--metrics-listen") + 1].startswith("127.0.0.13:")
    assert n3.processes["redis"].argv == [
        "node-exec",
        "47103",
        "--",
        "rs",
        str(n3.dir / "redis.conf"),
    ]


def test_a_leave_of_a_node_whose_agent_knows_no_leave_is_refused_saying_what_to_do() -> None:
    """v0.2.0's membership agent has no Leave RPC: `hexmq cluster leave` used to retry it,
    fail with "does not answer the leave" and leave the operator guessing."""
    import grpc

    from hexmq.api.membership.v1 import membership_pb2_grpc

    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    membership_pb2_grpc.add_MembershipServiceServicer_to_server(
        membership_pb2_grpc.MembershipServiceServicer(),
        server,  # implements nothing
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        node = SimpleNamespace(
            node=2,
            node_id="n2",
            security="plain",  # a v0.2.0 node serves plain text
            ports=SimpleNamespace(membership=port, addr=lambda p: f"127.0.0.1:{p}"),
        )
        # A cluster of that release has no certificates: the operator dials in plain text.
        state = SimpleNamespace(dir=Path("/nonexistent"))
        with pytest.raises(clusterstate.ClusterError) as refused:
            localmembers._ask_leave(cast(Any, state), cast(Any, node), wait_s=1.0, rpc_timeout=5.0)
    finally:
        server.stop(None)
    said = str(refused.value)
    assert "node 2 cannot leave gracefully" in said
    assert "`hexmq cluster stop 2`" in said


# --- co-located nodes (`up --colocated`, hexmq node) --------------------------------------------


def test_a_colocated_node_runs_redis_and_one_hexmq_node_with_each_services_options(
    tmp_path: Path,
) -> None:
    from hexmq_cli import node as node_command

    cluster_dir = tmp_path / "hexmq"
    separate = localcluster.plan_up(cluster_dir, nodes=2, base_port=30000, partitions=64, rf=2)
    state = localcluster.plan_up(
        cluster_dir,
        nodes=2,
        base_port=30000,
        partitions=64,
        rf=2,
        colocated=True,
        service_args={"edge": ["--sys-interval=1"]},
    )
    n2 = state.nodes[1]
    assert n2.colocated
    assert list(n2.processes) == ["redis", "node"] == list(n2.process_names())
    assert n2.record("edge") is n2.record("membership") is n2.processes["node"]
    assert n2.record("redis") is n2.processes["redis"]
    assert n2.processes["node"].log == cluster_dir / "node2" / "node.log"
    argv = n2.processes["node"].argv
    assert argv[1:5] == ["-P", "-m", "hexmq.cli", "node"]
    # Each section holds what the service's own process would run with (plus --edge-arg's).
    sections = clusterstate.node_sections(argv)
    for service in clusterstate.HEXMQ_SERVICES:
        alone = separate.nodes[1].processes[service].argv[5:]
        extra = ["--sys-interval=1"] if service == "edge" else []
        assert sections[service] == [*alone, *extra]
    # hexmq node takes that command line, with the variables `up` gives the process.
    planned = {(p.node, p.service): p for p in localcluster.planned_processes(state)}
    assert [s for n, s in planned if n == 2] == ["redis", "node"]
    env = planned[2, "node"].env
    assert env["HEXMQ_NODE_EDGE_CLUSTER_CERT"] == str(cluster_dir / "tls" / "n2" / "edge.crt")
    assert env["HEXMQ_NODE_PARTITION_REDIS_USER"] == "hexmq"
    assert "HEXMQ_CLUSTER_CERT" not in env
    parsed = {s.service: s.args for s in node_command.parse_sections(argv[5:], env)}
    assert parsed["edge"].cluster_cert == cluster_dir / "tls" / "n2" / "edge.crt"
    assert parsed["partition"].cluster_cert == cluster_dir / "tls" / "n2" / "partition.crt"
    assert parsed["edge"].sys_interval == 1
    assert parsed["membership"].listen == "127.0.0.1:31011"


def test_each_service_of_a_colocated_node_has_its_certificate(tmp_path: Path) -> None:
    state = localcluster.plan_up(tmp_path, nodes=1, base_port=30000, rf=1, colocated=True)
    added = localmembers.plan_added_node(state)
    localsecurity.ensure_certificates(state, [added])
    for node_id in ("n1", "n2"):
        names = sorted(p.name for p in (tmp_path / "tls" / node_id).glob("*.crt"))
        assert names == ["edge.crt", "membership.crt", "partition.crt"], node_id


@pytest.mark.parametrize(("colocated", "edges"), [(True, 1), (False, 1), (False, 2)])
def test_add_checks_every_port_an_added_nodes_processes_bind(
    tmp_path: Path, colocated: bool, edges: int
) -> None:
    state = clusterstate.plan_cluster(
        tmp_path,
        nodes=1,
        base_port=30000,
        partitions=16,
        rf=1,
        python="py",
        redis_server="rs",
        colocated=colocated,
        edges_per_node=edges,
    )
    n2 = localmembers.plan_added_node(state)
    block = n2.ports.redis
    ports = {
        "redis": [block],
        "membership": [block + 1, block + 5],
        "partition": [block + 2, block + 4],
        "edge": [30001, block + 3],
        **({"edge2": [block + 6]} if edges == 2 else {}),
    }
    want = [(name, port) for name in ports for port in ports[name]]
    assert sorted(localmembers.bound_ports(n2)) == sorted(want)


def test_a_colocated_cluster_json_says_so_and_loads_back(tmp_path: Path) -> None:
    state = localcluster.plan_up(
        tmp_path, nodes=2, base_port=30000, partitions=64, rf=1, colocated=True
    )
    state.nodes[1].processes["node"].identity = procs.ProcessIdentity(42, 1234, "boot")
    clusterstate.save_state(state)
    loaded = clusterstate.load_state(tmp_path)
    assert loaded is not None
    assert [n.colocated for n in loaded.nodes] == [True, True]
    assert loaded.node(2).record("partition").identity == procs.ProcessIdentity(42, 1234, "boot")
    summary = loaded.summary()["nodes"][1]
    assert summary["colocated"] is True
    assert summary["pids"] == {"redis": None, "node": 42}
    # A node's processes stop in reverse: the node (edge, partition, membership inside), redis.
    assert localcluster._layers(loaded.nodes) == ["redis", "node"]
    assert loaded.nodes[0].ports.of_process("node") == (31001, 31002, 30000)
    # Its links come from one metrics port (the process's one registry), none while it is down.
    assert localcluster._link_metrics(loaded.nodes[0]) == {}


def test_a_node_added_to_a_colocated_cluster_is_colocated_with_node_1s_extras(
    tmp_path: Path,
) -> None:
    from hexmq_cli import localmembers

    state = localcluster.plan_up(
        tmp_path,
        nodes=2,
        base_port=30000,
        partitions=64,
        rf=1,
        colocated=True,
        service_args={"edge": ["--sys-interval=1"], "partition": ["--log-level=DEBUG"]},
    )
    added = localmembers.plan_added_node(state)
    assert added.colocated
    assert list(added.processes) == ["redis", "node"]
    sections = clusterstate.node_sections(added.processes["node"].argv)
    assert sections["edge"][-1] == "--sys-interval=1"
    assert sections["partition"][-1] == "--log-level=DEBUG"
    assert sections["membership"][:2] == ["--node-id", "n3"]
    assert "--log-level=DEBUG" not in sections["membership"]
