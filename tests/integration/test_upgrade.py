"""The rolling upgrade from the previous release (issue 12, DESIGN.md G8; docs/releases.md,
docs/operations.md "Rolling upgrade and rollback").

A 3-node RF 3 cluster of the previous release (its own checkout and venv, started by its own
`hexmq cluster up`) has its nodes replaced one by one with the working tree's code under QoS 1
traffic (`hexmq cluster stop N`, then `start N --python` this venv's Python), then one node is
rolled back to the previous release. Nothing acknowledged is lost, and the gated feature
(zlib-snapshots) shows the protocol mechanism at work: snapshots sent to a catching-up node are
plain while any member runs the previous release, packed once every member runs this one, and
plain again for the rolled-back node, whose copy then serves its subscribers' queued messages.

The previous release is checked out with `git archive` (no worktree is added to the repository)
under .hexmq/releases/<tag>-<commit>/ with its own venv (pip from the local mirror, with that
release's constraints.txt), built on the first run (a few minutes) and reused after.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.hashring import assign, partition_of
from hexmq_cli import clusterstate
from tests.conftest import HEXMQ, HexmqCluster, pick_base_port, running_processes
from tests.support.cluster_watch import failovers_from
from tests.support.unique import uid
from tests.support.workload import DEEP_QUEUES, Publisher, Subscriber, check

# The release before this one: set to the newest tag and its commit when a release is made
# (releases.md). The commit is there because tags do not travel with every clone (this
# project's CI clones main without them); a tag that exists must name that commit.
PREVIOUS_RELEASE = "v0.2.0"
PREVIOUS_RELEASE_COMMIT = "a3c33eb811097006eb0dde03b7f2413db60ce9e7"
REPO = Path(__file__).resolve().parents[2]
RELEASES = REPO / ".hexmq" / "releases"
NODES = ("n1", "n2", "n3")
PARTITIONS = 32
# A short replication log, so that a node coming back after a few seconds of traffic is
# behind its masters' logs and catches up by snapshot: the transfer the gated feature changes.
LOG_ENTRIES = 50
SNAPSHOT_LINE = re.compile(
    r"snapshot of partition (\d+) at \S+ \S+ sent to (n\d) \((\d+) writes(?:, (plain|zlib))?"
)


def _commit_of(rev: str) -> str | None:
    found = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return found.stdout.strip() if found.returncode == 0 else None


def previous_release_commit() -> str:
    """The previous release's commit: its tag where the clone has it (it must name the
    recorded commit), else the recorded commit. Fails (never skips) when the clone has
    neither: a shallow clone cannot test the upgrade."""
    tagged = _commit_of(PREVIOUS_RELEASE)
    if tagged is not None and tagged != PREVIOUS_RELEASE_COMMIT:
        pytest.fail(
            f"tag {PREVIOUS_RELEASE} names {tagged}, but the upgrade test records "
            f"{PREVIOUS_RELEASE_COMMIT} as that release: one of them is wrong",
            pytrace=False,
        )
    if _commit_of(PREVIOUS_RELEASE_COMMIT) is None:
        pytest.fail(
            f"the upgrade test starts from the previous release, {PREVIOUS_RELEASE} "
            f"({PREVIOUS_RELEASE_COMMIT}), and this clone of {REPO} has no such commit "
            "(a shallow clone? `git fetch --unshallow --tags`)",
            pytrace=False,
        )
    return PREVIOUS_RELEASE_COMMIT


def previous_release_python() -> Path:
    """The Python of the previous release's venv, built on first use."""
    commit = previous_release_commit()
    home = RELEASES / f"{PREVIOUS_RELEASE}-{commit[:12]}"
    python = home / ".venv" / "bin" / "python"
    stamp = home / ".venv" / ".installed"
    if stamp.exists():
        return python
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    archive = home.parent / f"{home.name}.tar"
    steps = [
        ["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), commit],
        ["tar", "-x", "-f", str(archive), "-C", str(home)],
        [sys.executable, "-m", "venv", str(home / ".venv")],
        [str(python), "-m", "pip", "install", "-q", "-c", "constraints.txt", "-e", "."],
    ]
    for argv in steps:
        done = subprocess.run(
            argv, cwd=home, capture_output=True, text=True, timeout=1200, check=False
        )
        if done.returncode != 0:
            pytest.fail(
                f"building {PREVIOUS_RELEASE} in {home}: `{' '.join(argv)}` exited with "
                f"{done.returncode}:\n{done.stderr[-3000:]}",
                pytrace=False,
            )
    archive.unlink()
    stamp.touch()
    return python


def test_a_missing_previous_release_commit_fails_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "PREVIOUS_RELEASE", "v0.0.0-never-tagged")
    monkeypatch.setattr(sys.modules[__name__], "PREVIOUS_RELEASE_COMMIT", "0" * 40)
    with pytest.raises(pytest.fail.Exception, match="has no such commit") as failed:
        previous_release_python()
    assert "v0.0.0-never-tagged (0000000000" in str(failed.value)


def test_the_recorded_commit_serves_a_clone_without_tags() -> None:
    """CI and most clones of main carry no tags: the recorded commit is what the test runs."""
    assert _commit_of(PREVIOUS_RELEASE_COMMIT) == PREVIOUS_RELEASE_COMMIT
    assert previous_release_commit() == PREVIOUS_RELEASE_COMMIT


def test_a_tag_naming_another_commit_fails_saying_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "PREVIOUS_RELEASE", "HEAD")
    with pytest.raises(pytest.fail.Exception, match="one of them is wrong"):
        previous_release_commit()


class Upgrade:
    """The cluster under test, driven by this tree's `hexmq cluster` (and the old one's where
    the test says so), with the state the checks need."""

    def __init__(self, cluster: HexmqCluster, old_python: Path) -> None:
        self.cluster = cluster
        self.old_python = old_python
        self.new_python = HEXMQ.with_name("python")
        self.goal_masters = Counter(row[0] for row in assign(NODES, PARTITIONS, 3))

    def old_cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [str(self.old_python.with_name("hexmq")), "cluster", *args]
        argv += ["--dir", str(self.cluster.dir)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
        assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stderr}"
        return done

    def membership(self) -> dict[str, Any]:
        doc: dict[str, Any] = self.cluster.status()["membership"] or {}
        return doc

    def wait_whole(self, timeout: float = 120.0) -> dict[str, Any]:
        """Until every node is in the view, holds every partition in sync (RF 3 of 3 nodes),
        and masters its goal share again (a returning node takes its partitions back by
        handover once in sync): the point at which the next node may go."""
        deadline = time.monotonic() + timeout
        doc: dict[str, Any] = {}
        while time.monotonic() < deadline:
            doc = self.membership()
            in_view = {m["node_id"] for m in doc.get("members", []) if m["in_view"]}
            roles = doc.get("partitions", {})
            if (
                in_view == set(NODES)
                and all(roles.get(n, {}).get("in_sync") == PARTITIONS for n in NODES)
                and all(roles[n]["masters"] == self.goal_masters[n] for n in NODES)
            ):
                return doc
            time.sleep(0.5)
        raise AssertionError(f"the cluster is not whole within {timeout:g} s: {doc}")

    def wait_protocol(self, version: int, features: list[str], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        protocol: dict[str, Any] = {}
        while time.monotonic() < deadline:
            protocol = self.membership().get("protocol", {})
            if protocol == {"version": version, "features": features}:
                return
            time.sleep(0.5)
        raise AssertionError(f"protocol {protocol}, not version {version} {features}")

    def log_sizes(self) -> dict[int, int]:
        return {i: self.partition_log(i).stat().st_size for i in (1, 2, 3)}

    def partition_log(self, i: int) -> Path:
        return self.cluster.dir / f"node{i}" / "partition.log"

    def snapshots_to(self, node: int, since: dict[int, int]) -> list[tuple[int, str | None]]:
        """(sending node, encoding) of every snapshot sent to `node` since the log sizes
        `since`; the encoding is None from a master of the previous release (its line says
        none)."""
        sent: list[tuple[int, str | None]] = []
        for i in (1, 2, 3):
            if i == node:
                continue
            with self.partition_log(i).open("rb") as f:
                f.seek(since[i])
                text = f.read().decode(errors="replace")
            sent += [(i, m[4]) for m in SNAPSHOT_LINE.finditer(text) if m[2] == f"n{node}"]
        return sent


@pytest.fixture
def old_cluster(tmp_path: Path, cluster_prerequisites: None) -> Iterator[Upgrade]:
    """A 3-node RF 3 cluster of the previous release, started by its own `hexmq cluster up`;
    brought down (by this tree's CLI) whatever happens."""
    old_python = previous_release_python()
    cluster_dir = tmp_path / "cluster"
    argv = [
        str(old_python.with_name("hexmq")),
        *("cluster", "up", "--nodes", "3", "--rf", "3"),
        *("--partitions", str(PARTITIONS), "--dir", str(cluster_dir)),
        *("--base-port", str(pick_base_port(3)), "--timeout", "60"),
        f"--partition-arg=--replication-log-entries={LOG_ENTRIES}",
        DEEP_QUEUES,
    ]
    up = subprocess.run(argv, capture_output=True, text=True, timeout=400, check=False)
    cluster = HexmqCluster(dir=cluster_dir, nodes=[])
    try:
        assert up.returncode == 0, f"{PREVIOUS_RELEASE} `hexmq cluster up`:\n{up.stderr}"
        cluster.nodes = json.loads(up.stdout)["nodes"]
        yield Upgrade(cluster, old_python)
    finally:
        if (cluster_dir / "cluster.json").exists():
            cluster.cli("down", check=False, timeout=300)
        for pid in running_processes(cluster_dir):  # carry this test's marker: ours
            os.kill(pid, signal.SIGKILL)


@pytest.mark.fault
@pytest.mark.timeout(1800)
def test_rolling_upgrade_from_the_previous_release_then_one_node_back(
    old_cluster: Upgrade,
) -> None:
    up = old_cluster
    cluster = up.cluster
    up.wait_whole()
    up.wait_protocol(1, [])  # the previous release's agents write no protocol into views
    tag = uid()
    # Subscribers whose sessions the goal placement gives to n3: the node rolled back at the
    # end masters them then, from the copy it caught up with.
    n3_ids = (
        cid
        for cid in (f"up-{tag}-{i}" for i in range(10_000))
        if assign(NODES, PARTITIONS, 3)[partition_of(cid, PARTITIONS)][0] == "n3"
    )
    subs = [
        Subscriber(next(n3_ids), cluster.mqtt_port(1), f"up/{tag}/#", qos=1, version=5),
        Subscriber(next(n3_ids), cluster.mqtt_port(1), f"up/{tag}/#", qos=1, version=4),
    ]
    for s in subs:
        s.connect()
    publishers: list[Publisher] = []

    def step(node: int, python: Path, *, old_cli_stops: bool = False) -> list[Publisher]:
        """Replace node `node`'s processes with those of `python`'s release under QoS 1
        traffic from clients of the two other nodes; back once the cluster is whole."""
        others = [i for i in (1, 2, 3) if i != node]
        for s in subs:
            if s.port == cluster.mqtt_port(node):  # the balancer sends them elsewhere first
                assert s.move(cluster.mqtt_port(others[0])), s.client_id
        pubs = [
            Publisher(f"p{i}-{tag}-{node}-{v}", cluster.mqtt_port(i), f"up/{tag}/{i}", 1, v)
            for i in others
            for v in (5, 4)
        ]
        for p in pubs:
            p.start(interval=0.01)
        time.sleep(1)
        if old_cli_stops:
            up.old_cli("stop", str(node))  # the old CLI reads what the new one wrote
        else:
            cluster.stop(node)
        time.sleep(1)
        result = cluster.cli("start", str(node), "--python", str(python), timeout=300)
        (started,) = json.loads(result.stdout)["nodes"]
        cluster.nodes[node - 1] = started
        up.wait_whole()
        for p in pubs:
            p.stop()
        return pubs

    # Upgrade n1, then n2: while any member runs the previous release, the view speaks
    # version 1 and snapshots (here to the node coming back) go out plain.
    for node in (1, 2):
        since = up.log_sizes()
        publishers += step(node, up.new_python)
        up.wait_protocol(1, [])
        snapshots = up.snapshots_to(node, since)
        assert all(encoding != "zlib" for _, encoding in snapshots), snapshots
    # n3, the last of the previous release: from its stop on, every member runs this release,
    # so its catch-up snapshots are packed, and the view says so.
    since = up.log_sizes()
    publishers += step(3, up.new_python)
    up.wait_protocol(2, ["kick-acks", "zlib-snapshots"])
    snapshots = up.snapshots_to(3, since)
    assert snapshots, "n3 caught up without a snapshot: the gate is not exercised"
    assert all(encoding == "zlib" for _, encoding in snapshots), snapshots
    members = {m["node_id"]: m for m in up.membership()["members"]}
    assert {m["protocol"] for m in members.values()} == {"1..2 +kick-acks +zlib-snapshots"}

    # Roll n3 back. Its subscribers' sessions queue meanwhile (the connections drop), so what
    # they get at the end comes from n3's own copy once it masters them again.
    for s in subs:
        s.drop()
    since = up.log_sizes()
    publishers += step(3, up.old_python, old_cli_stops=True)
    up.wait_protocol(1, [])
    snapshots = up.snapshots_to(3, since)
    assert snapshots, "n3 caught up without a snapshot: the gate is not exercised"
    assert all(encoding == "plain" for _, encoding in snapshots), snapshots
    doc = up.wait_whole()
    assert doc["partitions"]["n3"]["masters"] == up.goal_masters["n3"]
    for s in subs:  # through n3's own edge, of the previous release
        assert s.move(cluster.mqtt_port(3)), s.client_id

    delivered_and_clean(publishers, subs, at_least=1000)
    # The previous release's CLI still reads the state this one wrote.
    old_status = json.loads(up.old_cli("status", "--json").stdout)
    assert all(n["alive"] for n in old_status["nodes"]), old_status
    runs = {n["node"]: n["processes"]["partition"]["argv"][0] for n in _state(cluster.dir)}
    assert runs == {1: str(up.new_python), 2: str(up.new_python), 3: str(up.old_python)}


def delivered_and_clean(pubs: list[Publisher], subs: list[Subscriber], at_least: int) -> None:
    """Every subscriber got every acknowledged message (up to 60 s to drain), none lost,
    duplicated at QoS 2 or out of order; then the subscribers close."""
    wanted = {p.payload(n) for p in pubs for n in p.acked}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(wanted <= set(s.payloads()) for s in subs):
        time.sleep(0.3)
    report = check(pubs, subs)
    report.assert_clean()
    assert report.acknowledged > at_least, report
    for s in subs:
        s.close()


def _state(cluster_dir: Path) -> list[dict[str, Any]]:
    nodes: list[dict[str, Any]] = json.loads((cluster_dir / "cluster.json").read_text())["nodes"]
    return nodes


@pytest.mark.fault
@pytest.mark.timeout(1800)
def test_a_node_of_this_release_leaves_while_previous_release_nodes_are_members(
    old_cluster: Upgrade,
) -> None:
    """A leave in a mixed cluster (docs/operations.md, "Rolling upgrade and rollback"): n3 is
    upgraded, then leaves while n1 and n2 still run the previous release, under QoS 1 traffic
    through all three. The previous release's agents know no leave: the views they write
    lack `leaving` (this release's agents write it back), and they would admit again a
    registered node that is not a member. The leave still moves n3's master roles by
    handover, copies its replicas to n1 and n2 (2 of RF 3 are left), lets n3 go, and n3 stays
    out (once left, its registration says it serves nothing, so no agent admits it again while
    its services stop); nothing acknowledged is lost. A leave of n1, of the previous release,
    is refused saying why and what to do, and changes nothing."""
    up = old_cluster
    cluster = up.cluster
    up.wait_whole()
    cluster.stop(3)
    result = cluster.cli("start", "3", "--python", str(up.new_python), timeout=300)
    (started,) = json.loads(result.stdout)["nodes"]
    cluster.nodes[2] = started
    up.wait_whole()
    tag = uid()
    subs = [
        Subscriber(f"s{i}-{tag}-{v}", cluster.mqtt_port(i), f"mix/{tag}/#", qos=1, version=v)
        for i in (1, 3)
        for v in (5, 4)
    ]
    for s in subs:
        s.connect()
    pubs = [
        Publisher(f"p{i}-{tag}-{v}", cluster.mqtt_port(i), f"mix/{tag}/{i}-{v}", 1, v)
        for i in (1, 2, 3)
        for v in (5, 4)
    ]
    for p in pubs:
        p.start(interval=0.01)
    time.sleep(2)
    leave_line = len((cluster.dir / "node1" / "membership.log").read_text().splitlines())
    said = cluster.leave(3)
    assert "left the cluster" in said, said
    for s in subs:
        if s.port == cluster.mqtt_port(3):  # its edge sent them away: resume on n1
            deadline = time.monotonic() + 10
            while s.connected() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert s.move(cluster.mqtt_port(1)), f"{s.client_id}: session not present"

    def out_and_whole() -> bool:
        doc = up.membership()
        in_view = {m["node_id"] for m in doc.get("members", []) if m["in_view"]}
        roles = doc.get("partitions", {})
        n3 = roles.get("n3", {})
        return (
            in_view == {"n1", "n2"}
            and all(roles.get(n, {}).get("in_sync") == PARTITIONS for n in ("n1", "n2"))
            and n3.get("masters", 0) + n3.get("follows", 0) == 0
        )

    deadline = time.monotonic() + 120
    while not out_and_whole():
        assert time.monotonic() < deadline, f"not whole without n3: {up.membership()}"
        time.sleep(0.5)
    time.sleep(5)  # the previous release's agents do not take n3 back in
    assert out_and_whole(), up.membership()
    # Its master roles went by handover (the failovers of its upgrade's plain stop, before,
    # are in the same log).
    assert not failovers_from(cluster, "n3", log_node=3)
    # Nobody admitted it again once it had left: its registration said it serves nothing
    # (the previous release's agents read no `leaving`, and took it back in before).
    n1_log = (cluster.dir / "node1" / "membership.log").read_text().splitlines()
    readmitted = [line for line in n1_log[leave_line:] if "members +n3" in line]
    assert not readmitted, readmitted

    refused = cluster.cli("leave", "1", check=False)
    assert refused.returncode == 1, refused
    assert "node 1 cannot leave gracefully" in refused.stderr, refused.stderr
    assert "hexmq cluster stop 1" in refused.stderr, refused.stderr
    time.sleep(2)
    assert out_and_whole(), up.membership()

    for p in pubs:
        p.stop()
    delivered_and_clean(pubs, subs, at_least=500)


@pytest.mark.fault
@pytest.mark.timeout(2400)
def test_a_plain_text_cluster_of_the_previous_release_upgraded_and_switched_to_tls(
    old_cluster: Upgrade,
) -> None:
    """Issue 24's rolling upgrade: a cluster of the previous release (plain text, no Redis
    password, an agreement server without ACLs) upgrades node by node to this release, which
    keeps serving plain text for it (nothing in its cluster.json asks for more), then
    `hexmq cluster secure` switches it to mutual TLS, Redis passwords and the agreement
    server's token in three rolling restarts (docs/security.md, "From plain text to TLS"),
    under QoS 1 traffic: nothing acknowledged is lost, and afterwards the attacks of the
    issue fail."""
    up = old_cluster
    cluster = up.cluster
    up.wait_whole()
    for node in (1, 2, 3):
        cluster.stop(node)
        result = cluster.cli("start", str(node), "--python", str(up.new_python), timeout=300)
        (started,) = json.loads(result.stdout)["nodes"]
        cluster.nodes[node - 1] = started
        up.wait_whole()
    assert {n["security"] for n in cluster.status()["nodes"]} == {"plain"}
    tag = uid()
    subs = [
        Subscriber(f"sec-{tag}-{v}", cluster.mqtt_port(1), f"sec/{tag}/#", qos=1, version=v)
        for v in (5, 4)
    ]
    for s in subs:
        s.connect()
        s.drop()  # every node restarts three times: their sessions queue meanwhile
    ports = itertools.cycle([cluster.mqtt_port(i) for i in (1, 2, 3)])
    pubs = [
        Publisher(
            f"p-{tag}-{i}-{v}",
            cluster.mqtt_port(i),
            f"sec/{tag}/{i}-{v}",
            1,
            v,
            reconnect=lambda: ("127.0.0.1", next(ports)),
        )
        for i in (1, 2, 3)
        for v in (5, 4)
    ]
    for p in pubs:
        # A few a second each: the switch takes minutes (longer on a loaded machine), and the
        # subscribers' queues hold all of it until they come back.
        p.start(interval=0.2)
    time.sleep(2)
    done = cluster.cli("secure", timeout=2000)
    assert "step 3 of 3: node 3 back" in done.stderr, done.stderr
    time.sleep(2)
    for p in pubs:
        p.stop()
    for s in subs:
        assert s.move(cluster.mqtt_port(2)), f"{s.client_id}: session not present"
    # The queues drain at the subscribers' pace: wait while they still receive.
    wanted = {p.payload(n) for p in pubs for n in p.acked}
    received, still = -1, time.monotonic()
    while not all(wanted <= set(s.payloads()) for s in subs):
        now_received = sum(len(s.payloads()) for s in subs)
        if now_received != received:
            received, still = now_received, time.monotonic()
        assert time.monotonic() - still < 30, check(pubs, subs).problems()
        time.sleep(0.5)
    delivered_and_clean(pubs, subs, at_least=300)

    status = cluster.status()
    assert [n["security"] for n in status["nodes"]] == ["tls", "tls", "tls"]
    assert all(n["alive"] for n in status["nodes"]), status
    # What was open before is closed now.
    partition = f"127.0.0.1:{cluster.node(1)['partition_port']}"
    with grpc.insecure_channel(partition) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.PartitionServiceStub(channel).Status(pb.StatusRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    anonymous = redis.Redis(port=cluster.node(2)["redis_port"], socket_timeout=5)
    with pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    anonymous.close()
    state = clusterstate.require_state(cluster.dir)
    view_key = f"http://{state.consul_addr}/v1/kv/hexmq/{state.cluster_name}/view"
    with pytest.raises(urllib.error.HTTPError) as forbidden:
        urllib.request.urlopen(view_key, timeout=5)
    forbidden.value.close()
    assert forbidden.value.code == 403
