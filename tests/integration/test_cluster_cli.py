"""`hexmq cluster` end to end: real redis-server and hexmq services as background processes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.membership.v1 import membership_pb2_grpc as mpb_grpc
from hexmq.hashring import assign, partition_of
from hexmq.mqtt import ConnAck, Connect
from hexmq.trust.identity import MEMBERSHIP, Identity
from hexmq_cli import clusterstate
from services.edge.auth import PasswordFile
from tests.conftest import (
    HEXMQ,
    HexmqCluster,
    pick_base_port,
    run_up,
    running_processes,
)
from tests.support import start_bounds
from tests.support.rawclient import RawClient
from tests.support.trust import cluster_channel, node_redis

ClusterFactory = Callable[..., HexmqCluster]


def mqtt_connect(port: int, client_id: str = "clustercli") -> int | None:
    """A client's MQTT 3.1.1 CONNECT, written here independently of the manager's probe:
    the CONNACK return code, or None if there was no CONNACK."""
    cid = client_id.encode()
    body = b"\x00\x04MQTT\x04\x02\x00\x1e" + len(cid).to_bytes(2, "big") + cid
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(bytes([0x10, len(body)]) + body)
            answer = b""
            while len(answer) < 4:
                chunk = s.recv(4 - len(answer))
                if not chunk:
                    return None
                answer += chunk
            s.sendall(b"\xe0\x00")
    except OSError:
        return None
    return answer[3] if answer[:2] == b"\x20\x02" else None


def client_id_mastered_by(node_id: str, nodes: int = 2) -> str:
    """A client id whose session partition the default 2-node table places on node_id."""
    partitions = clusterstate.DEFAULT_PARTITIONS
    table = assign([f"n{i}" for i in range(1, nodes + 1)], partitions, 1)
    return next(
        cid
        for cid in (f"clustercli{k}" for k in range(1000))
        if table[partition_of(cid, partitions)][0] == node_id
    )


def agreed_view(cluster: HexmqCluster, node: int = 1, host: str = "127.0.0.1") -> mpb.View:
    """The view a node's membership agent serves (GetView)."""
    target = f"{host}:{cluster.node(node)['membership_port']}"
    with cluster_channel(cluster.dir, target, Identity(MEMBERSHIP, f"n{node}")) as channel:
        stub = mpb_grpc.MembershipServiceStub(channel)
        view: mpb.View = stub.GetView(mpb.GetViewRequest(), timeout=5)
        return view


def process_gone(pid: int) -> bool:
    """No such process, or only its zombie (an orphan's exit status waits for PID 1 to reap
    it, which some container inits never do)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def alive_map(status: dict[str, object], node: int) -> dict[str, bool]:
    nodes = status["nodes"]
    assert isinstance(nodes, list)
    return {s: p["alive"] for s, p in nodes[node - 1]["processes"].items()}


ALL_ALIVE = dict.fromkeys(clusterstate.SERVICES, True)
ALL_DEAD = dict.fromkeys(clusterstate.SERVICES, False)


@pytest.mark.timeout(120)
def test_one_node_up_kill_start_down(hexmq_cluster: ClusterFactory) -> None:
    cluster = hexmq_cluster(nodes=1)
    (node,) = cluster.nodes
    assert node["node"] == 1
    assert node["node_id"] == "n1"
    base = node["mqtt_port"]
    assert (node["redis_port"], node["membership_port"], node["partition_port"]) == (
        base + 1000,
        base + 1001,
        base + 1002,
    )
    first_pids = cluster.pids(1)
    assert set(first_pids) == set(clusterstate.SERVICES)

    assert alive_map(cluster.status(), 1) == ALL_ALIVE
    assert mqtt_connect(cluster.mqtt_port(1)) == 0

    cluster.kill(1)
    assert alive_map(cluster.status(), 1) == ALL_DEAD
    assert all(process_gone(pid) for pid in first_pids.values())
    assert mqtt_connect(cluster.mqtt_port(1)) is None

    cluster.start(1)
    assert alive_map(cluster.status(), 1) == ALL_ALIVE
    assert set(cluster.pids(1).values()).isdisjoint(first_pids.values())
    assert mqtt_connect(cluster.mqtt_port(1)) == 0

    last_pids = cluster.pids(1)
    cluster.down()
    assert alive_map(cluster.status(), 1) == ALL_DEAD
    assert all(process_gone(pid) for pid in last_pids.values())
    assert cluster.running_processes() == []


@pytest.mark.timeout(120)
def test_two_nodes_stop_and_start_one(hexmq_cluster: ClusterFactory) -> None:
    cluster = hexmq_cluster(nodes=2, extra=["--edge-arg=--failover-hold=1"])
    assert [n["node_id"] for n in cluster.nodes] == ["n1", "n2"]
    assert cluster.mqtt_port(2) == cluster.mqtt_port(1) + 1
    assert cluster.node(2)["redis_port"] == cluster.node(1)["redis_port"] + 10
    for i in (1, 2):
        assert mqtt_connect(cluster.mqtt_port(i)) == 0

    view = agreed_view(cluster)
    assert [m.mqtt_addr for m in view.members] == [
        f"127.0.0.1:{cluster.mqtt_port(1)}",
        f"127.0.0.1:{cluster.mqtt_port(2)}",
    ]

    # With RF 1 a session lives only on its partition's master: while node 2 is down, a client
    # whose session partition is on n2 is held and, past the edge's failover hold (1 s here),
    # refused with 3; one whose partition is on n1 is not.
    on_n1, on_n2 = client_id_mastered_by("n1"), client_id_mastered_by("n2")
    cluster.stop(2)
    status = cluster.status()
    assert alive_map(status, 1) == ALL_ALIVE
    assert alive_map(status, 2) == ALL_DEAD
    assert mqtt_connect(cluster.mqtt_port(1), on_n1) == 0
    assert mqtt_connect(cluster.mqtt_port(1), on_n2) == 3

    cluster.start(2)
    assert alive_map(cluster.status(), 2) == ALL_ALIVE
    for i in (1, 2):
        for client_id in (on_n1, on_n2):
            assert mqtt_connect(cluster.mqtt_port(i), client_id) == 0

    human = cluster.cli("status").stdout
    assert human.count("alive") == 9  # 4 processes a node, and the agreement server


@pytest.mark.timeout(120)
def test_stop_and_start_keep_the_redis_data(hexmq_cluster: ClusterFactory) -> None:
    cluster = hexmq_cluster(nodes=1)
    with node_redis(cluster.dir, 1, cluster.node(1)["redis_port"]) as r:
        r.set("hexmq-test:survives", "yes")
    cluster.stop(1)  # graceful: Redis flushes its append-only file on SIGTERM
    cluster.start(1)
    with node_redis(cluster.dir, 1, cluster.node(1)["redis_port"]) as r:
        assert r.get("hexmq-test:survives") == b"yes"
    assert (cluster.dir / "node1" / "redis" / "appendonlydir").is_dir()


@pytest.mark.timeout(120)
def test_up_again_after_down_keeps_the_data_of_the_same_shape(
    hexmq_cluster: ClusterFactory,
) -> None:
    cluster = hexmq_cluster(nodes=1, partitions=16)
    with node_redis(cluster.dir, 1, cluster.node(1)["redis_port"]) as r:
        r.set("hexmq-test:survives", "yes")
    cluster.down()

    other_shape = run_up(cluster.dir, 2, pick_base_port(2), ["--partitions", "16"])
    assert other_shape.returncode == 1
    assert "holds the data of a cluster with 1 node(s) and 16 partitions" in other_shape.stderr
    assert cluster.running_processes() == []

    base = pick_base_port(1)  # another base port is fine: the data does not depend on it
    again = run_up(cluster.dir, 1, base, ["--partitions", "16"])
    assert again.returncode == 0, again.stderr
    cluster.nodes = json.loads(again.stdout)["nodes"]
    assert cluster.mqtt_port(1) == base
    with node_redis(cluster.dir, 1, cluster.node(1)["redis_port"]) as r:
        assert r.get("hexmq-test:survives") == b"yes"
    assert mqtt_connect(base) == 0


@pytest.mark.timeout(60)
def test_up_refuses_a_directory_with_a_running_cluster(hexmq_cluster: ClusterFactory) -> None:
    cluster = hexmq_cluster(nodes=1)
    before = cluster.status()
    result = run_up(cluster.dir, 1, pick_base_port(1))
    assert result.returncode == 1
    assert "holds a running cluster" in result.stderr
    assert cluster.status() == before


@pytest.mark.timeout(60)
def test_start_of_a_running_node_changes_nothing(hexmq_cluster: ClusterFactory) -> None:
    cluster = hexmq_cluster(nodes=1)
    pids = dict(cluster.pids(1))
    cluster.start(1)
    assert cluster.pids(1) == pids


# --- failures during startup leave nothing behind --------------------------------------------


def _fake_redis_path(tmp_path: Path, script: str) -> dict[str, str]:
    """An environment whose PATH finds `script` as redis-server first."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "redis-server"
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.timeout(60)
def test_a_process_that_fails_stops_everything_started(
    tmp_path: Path, cluster_prerequisites: None
) -> None:
    real = shutil.which("redis-server")
    env = _fake_redis_path(
        tmp_path,
        'case "$1" in */node2/*) echo "fake redis: node 2 refuses to start" >&2; exit 3;; esac\n'
        f'exec {real} "$@"\n',
    )
    cluster_dir = tmp_path / "c"
    result = run_up(cluster_dir, 2, pick_base_port(2), env=env)
    assert result.returncode == 1
    assert result.stdout == ""
    assert "node 2 redis" in result.stderr
    assert "exited with code 3" in result.stderr
    assert "fake redis: node 2 refuses to start" in result.stderr  # the log tail
    assert running_processes(cluster_dir) == []
    state = clusterstate.load_state(cluster_dir)
    assert state is not None
    node1_redis = state.node(1).processes["redis"].identity
    assert node1_redis is not None  # it was started, and then stopped again
    assert process_gone(node1_redis.pid)


@pytest.mark.timeout(60)
def test_a_process_that_never_serves_times_out_and_is_stopped(
    tmp_path: Path, cluster_prerequisites: None, consul_dev: str
) -> None:
    """A node process that never serves is named and stopped at the start timeout (1 s). The
    agents use a Consul that already serves: --timeout bounds each startup step, the start of
    the cluster's own agreement server too, which alone can take more than 1 s on a loaded
    machine (make test: "the agreement server is not serving ... after 1 s")."""
    env = _fake_redis_path(tmp_path, "echo 'fake redis: hanging'\nexec sleep 60\n")
    cluster_dir = tmp_path / "c"
    started = time.monotonic()
    result = run_up(cluster_dir, 1, pick_base_port(1), ["--consul", consul_dev], timeout=1, env=env)
    assert result.returncode == 1
    assert "node 1 redis is not serving on 127.0.0.1:" in result.stderr
    assert "after 1 s" in result.stderr
    assert "fake redis: hanging" in result.stderr
    # Well short of the 30 s a default --timeout would wait (Python's start of `hexmq` is
    # most of it).
    assert time.monotonic() - started < start_bounds.scaled(15)
    assert running_processes(cluster_dir) == []


# --- hexmq cluster run (make run) -------------------------------------------------------------


@pytest.mark.timeout(120)
def test_run_stays_in_the_foreground_until_ctrl_c(
    tmp_path: Path, cluster_prerequisites: None
) -> None:
    cluster_dir = tmp_path / "run"
    base = pick_base_port(1)
    argv = [str(HEXMQ), "cluster", "run", "--nodes", "1", "--dir", str(cluster_dir)]
    # Its own process group stands for the terminal: Ctrl-C goes to the whole group.
    manager = subprocess.Popen(
        [*argv, "--base-port", str(base)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert manager.stdout is not None
        banner = []
        for line in manager.stdout:
            banner.append(line)
            if "Ctrl-C" in line:
                break
        text = "".join(banner)
        assert f"MQTT on 127.0.0.1:{base}" in text, text
        assert "mosquitto_pub" in text
        assert mqtt_connect(base) == 0
        pids = running_processes(cluster_dir)
        # Co-located by default: the node's Redis and its `hexmq node`, and the agreement server.
        assert len(pids) == 3
        state = json.loads((cluster_dir / "cluster.json").read_text())
        assert [sorted(n["processes"]) for n in state["nodes"]] == [["node", "redis"]]

        os.killpg(manager.pid, signal.SIGINT)
        out, err = manager.communicate(timeout=start_bounds.scaled(60))
        assert manager.returncode == 0, err
        assert "cluster stopped" in out
        assert running_processes(cluster_dir) == []
        assert all(process_gone(pid) for pid in pids)
    finally:
        if manager.poll() is None:
            manager.kill()
            manager.communicate()
        subprocess.run([str(HEXMQ), "cluster", "down", "--dir", str(cluster_dir)], check=False)


def test_status_reports_each_nodes_partitions(hexmq_cluster) -> None:
    cluster = hexmq_cluster(nodes=2)
    nodes = cluster.status()["nodes"]
    masters = [n["partitions"]["roles"]["master"] for n in nodes]
    assert sum(masters) == 256  # every partition has exactly one master
    assert all(m > 0 for m in masters)
    assert [n["partitions"]["edges"] for n in nodes] == [2, 2]  # each edge links to each node
    cluster.kill(2)
    after = cluster.status()["nodes"]
    assert after[0]["partitions"]["roles"]["master"] == masters[0]
    assert after[1]["partitions"] is None  # its partition service is not running


@pytest.mark.timeout(120)
def test_status_shows_the_view_and_the_agreement_server(hexmq_cluster: ClusterFactory) -> None:
    cluster = hexmq_cluster(nodes=2, extra=["--rf", "2"])
    status = cluster.status()
    agreement = status["agreement"]
    assert agreement["embedded"]
    assert agreement["alive"]
    base = cluster.mqtt_port(1)
    assert agreement["addr"] == f"127.0.0.1:{base + 1000 + 10 * 2}"  # the block after node 2's
    view = status["membership"]
    assert view["view_epoch"] >= 1
    assert view["consul_reachable"]
    members = {m["node_id"]: m for m in view["members"]}
    assert set(members) == {"n1", "n2"}
    assert all(m["in_view"] and m["registered"] and m["incarnation"] > 0 for m in members.values())
    assert sum(r["masters"] for r in view["partitions"].values()) == 256
    assert all(r["follows"] > 0 for r in view["partitions"].values())  # rf 2
    human = cluster.cli("status").stdout
    assert f"agreement: hexmq consul-dev on {agreement['addr']}" in human
    assert f"view: epoch {view['view_epoch']}" in human
    assert "SUSPECTED-BY" in human
    # Both nodes run this release: the view has its protocol and features on.
    assert view["protocol"] == {"version": 2, "features": ["kick-acks", "zlib-snapshots"]}
    assert {m["protocol"] for m in members.values()} == {"1..2 +kick-acks +zlib-snapshots"}
    assert not any(m["not_admitted"] for m in members.values())
    assert "protocol: version 2, features: kick-acks, zlib-snapshots" in human

    cluster.kill(2)  # its partition service is gone: the view drops n2, n1 takes over
    deadline = time.monotonic() + 10
    while True:
        view = cluster.status()["membership"]
        if not next(m for m in view["members"] if m["node_id"] == "n2")["in_view"]:
            break
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    assert view["partitions"]["n1"]["masters"] == 256
    assert {r["kind"] for r in view["recent_failovers"]} == {"failover"}
    assert {(r["from"], r["to"]) for r in view["recent_failovers"]} == {("n2", "n1")}
    human = cluster.cli("status").stdout
    assert "failover" in human

    consul_pid = agreement["pid"]
    cluster.down()  # the agreement server last
    assert process_gone(consul_pid)
    assert cluster.running_processes() == []


@pytest.mark.timeout(120)
def test_up_with_an_external_consul_starts_no_agreement_server(
    hexmq_cluster: ClusterFactory, tmp_path: Path
) -> None:
    port = pick_base_port(1)
    addr = f"127.0.0.1:{port}"
    argv = [str(HEXMQ), "consul-dev", "--listen", addr, "--data-dir", str(tmp_path / "consul")]
    with (tmp_path / "consul.log").open("wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + start_bounds.step_timeout()
        while not _accepts(port):
            assert time.monotonic() < deadline, "consul-dev did not serve"
            time.sleep(0.05)
        cluster = hexmq_cluster(nodes=1, extra=["--consul", addr])
        status = cluster.status()
        assert status["agreement"] == {
            "addr": addr,
            "embedded": False,
            "pid": None,
            "alive": None,
            "log": None,
            "cluster_name": "cluster1",
        }
        assert status["membership"]["view_epoch"] >= 1
        assert len(cluster.running_processes()) == 4
        assert mqtt_connect(cluster.mqtt_port(1)) == 0
        cluster.down()
        assert server.poll() is None  # not ours to stop
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.timeout(120)
def test_up_with_static_discovery_forms_the_view_from_the_members_file(
    hexmq_cluster: ClusterFactory,
) -> None:
    cluster = hexmq_cluster(nodes=2, extra=["--discovery", "static"])
    members = (cluster.dir / clusterstate.MEMBERS_FILE).read_text().splitlines()
    base = cluster.mqtt_port(1)  # node i: MQTT on base+i-1, the rest from base+1000+10(i-1)
    partition_ports = [base + 1000 + 10 * (i - 1) + 2 for i in (1, 2)]
    assert members[1:] == [f"n{i} 127.0.0.1:{partition_ports[i - 1]}" for i in (1, 2)]
    view = cluster.status()["membership"]
    assert view["view_epoch"] >= 1
    assert {m["node_id"] for m in view["members"] if m["in_view"]} == {"n1", "n2"}
    # The agents were told the file, not a count: the first view waited for every listed node.
    state = json.loads((cluster.dir / clusterstate.STATE_FILE).read_text())
    argv = state["nodes"][0]["processes"]["membership"]["argv"]
    assert "--expect" not in argv
    assert argv[argv.index("--discovery-static-file") + 1] == str(
        cluster.dir / clusterstate.MEMBERS_FILE
    )
    log = (cluster.dir / "node1" / "membership.log").read_text()
    assert "discovery static (" in log
    assert f"lists: n1 at 127.0.0.1:{partition_ports[0]}, n2 at" in log
    cluster.down()


def _accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def _environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")


@pytest.mark.timeout(120)
def test_up_with_hosts_binds_each_node_on_its_address(hexmq_cluster: ClusterFactory) -> None:
    """--hosts: every port of node i on the i-th loopback address (nothing of it on
    127.0.0.1), the agreement server on --agreement-listen, every process of a node under the
    --node-wrapper; `kill` + `start` bring the node back on its address, wrapped again."""
    listen_port = pick_base_port(1)
    cluster = hexmq_cluster(
        nodes=2,
        extra=[
            *("--hosts", "127.0.0.2,127.0.0.3"),
            *("--agreement-listen", f"127.0.0.4:{listen_port}"),
            *("--node-wrapper", "env HEXMQ_TEST_WRAPPED=node{node}"),
        ],
    )
    assert [(n["node_id"], n["host"]) for n in cluster.nodes] == [
        ("n1", "127.0.0.2"),
        ("n2", "127.0.0.3"),
    ]
    for i, host in ((1, "127.0.0.2"), (2, "127.0.0.3")):
        node = cluster.node(i)
        for port in (node["mqtt_port"], node["redis_port"], node["partition_port"]):
            assert _accepts(port, host), (i, port)
            assert not _accepts(port, "127.0.0.1"), (i, port)
        for pid in cluster.pids(i).values():
            assert f"HEXMQ_TEST_WRAPPED=node{i}" in _environ(pid)
    assert _accepts(listen_port, "127.0.0.4")
    assert not _accepts(listen_port, "127.0.0.1")
    status = cluster.status()
    assert status["agreement"]["addr"] == f"127.0.0.4:{listen_port}"
    assert [n["host"] for n in status["nodes"]] == ["127.0.0.2", "127.0.0.3"]
    # The view carries the addresses the nodes reach each other by.
    view = agreed_view(cluster, 1, "127.0.0.2")
    addrs = {m.node_id: m.partition_addr for m in view.members}
    assert addrs == {
        "n1": f"127.0.0.2:{cluster.node(1)['partition_port']}",
        "n2": f"127.0.0.3:{cluster.node(2)['partition_port']}",
    }
    cluster.kill(2)
    cluster.start(2)
    assert cluster.node(2)["host"] == "127.0.0.3"
    assert _accepts(cluster.mqtt_port(2), "127.0.0.3")
    for pid in cluster.pids(2).values():
        assert "HEXMQ_TEST_WRAPPED=node2" in _environ(pid)


# ----- hexmq passwd, and clusters with a password file --------------------------------------


def hexmq_passwd(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # A new session has no controlling terminal: asked for, the password is read from stdin.
    return subprocess.run(
        [str(HEXMQ), "passwd", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        start_new_session=True,
    )


def test_passwd_adds_and_replaces_users(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    assert hexmq_passwd(str(path), "alice", "first").returncode == 0
    assert (path.stat().st_mode & 0o777) == 0o600
    asked = hexmq_passwd(str(path), "bob", stdin="b0b pw\nb0b pw\n")
    assert asked.returncode == 0, asked.stderr
    assert hexmq_passwd(str(path), "alice", "second").returncode == 0  # replaces her line
    lines = path.read_text().splitlines()
    assert [line.split(":")[0] for line in lines] == ["bob", "alice"]
    assert all(line.split(":", 1)[1].startswith("$7$101$") for line in lines)
    users = PasswordFile.load(path)
    assert users.verify("alice", b"second")
    assert not users.verify("alice", b"first")
    assert users.verify("bob", b"b0b pw")

    before = path.read_text()
    mismatch = hexmq_passwd(str(path), "carol", stdin="one\ntwo\n")
    assert mismatch.returncode == 1
    assert "passwords do not match" in mismatch.stderr
    bad_user = hexmq_passwd(str(path), "ca:rol", "pw")
    assert bad_user.returncode == 1
    assert f"{path}: a user name must be non-empty and hold no ':'" in bad_user.stderr
    assert path.read_text() == before  # nothing lost
    usage = hexmq_passwd(str(path))
    assert usage.returncode == 2
    assert "hexmq passwd: error:" in usage.stderr


async def login(port: int, client_id: str, user: str | None, password: str | None) -> int:
    """The 3.1.1 CONNACK return code for these credentials."""
    client = await RawClient.open(port)
    try:
        secret = None if password is None else password.encode()
        await client.send(Connect(client_id=client_id, username=user, password=secret))
        return (await client.expect(ConnAck)).reason_code
    finally:
        await client.close()


async def test_up_with_a_password_file_needs_no_allow_anonymous(
    hexmq_cluster: ClusterFactory, tmp_path: Path
) -> None:
    """`up` and `start` take a credentials refusal of their anonymous probe as serving."""
    path = tmp_path / "passwd"
    assert hexmq_passwd(str(path), "alice", "pw").returncode == 0
    cluster = hexmq_cluster(
        nodes=2, extra=[f"--edge-arg=--password-file={path}", "--edge-arg=--failover-hold=1"]
    )
    on_n1, on_n2 = client_id_mastered_by("n1"), client_id_mastered_by("n2")
    for node in (1, 2):
        port = cluster.mqtt_port(node)
        assert await login(port, on_n2, "alice", "pw") == 0
        assert await login(port, on_n1, None, None) == 5  # anonymous: not authorized
        assert await login(port, on_n1, "alice", "wrong") == 4

    cluster.kill(2)
    # Node 1's edge cannot reach n2's sessions: once it has seen its link drop (the kill takes
    # effect there within moments), a CONNECT waits for n2 before its credentials are looked
    # at, and is refused with 3 past the failover hold (1 s here); so a refusal for credentials
    # (the probe's answer) proves the session's node is reachable.
    deadline = time.monotonic() + 15
    while (code := await login(cluster.mqtt_port(1), on_n2, None, None)) != 3:
        assert code == 5, code
        assert time.monotonic() < deadline, "node 1's edge never saw n2 go"
        await asyncio.sleep(0.1)
    assert await login(cluster.mqtt_port(1), on_n2, "alice", "pw") == 3
    assert await login(cluster.mqtt_port(1), on_n1, None, None) == 5
    cluster.start(2)
    assert await login(cluster.mqtt_port(1), on_n2, "alice", "pw") == 0
    assert await login(cluster.mqtt_port(2), on_n1, "alice", "pw") == 0


async def test_up_with_a_max_packet_size_below_the_probes_connect(
    hexmq_cluster: ClusterFactory,
) -> None:
    """Issue 29 item 8: the readiness probe does not depend on client limits. Edges whose
    --max-packet-size (30 bytes) refuses the probe's own 36-byte CONNECT still come up, two
    nodes each routing to the other, and serve a client whose CONNECT fits."""
    cluster = hexmq_cluster(nodes=2, extra=["--edge-arg=--max-packet-size=30"])
    for node in (1, 2):
        client, connack = await RawClient.connect(cluster.mqtt_port(node), "c", version=4)
        assert connack.reason_code == 0
        await client.close()
