"""The long join and leave runs against real processes (issue 12; `make test-fault`): a 3-node
RF 3 cluster grows to 5 and shrinks to 3 under QoS 1/2 traffic, every node is restarted in
turn, a joining node dies mid-transfer and a leave is cut short by a crash. Nothing
acknowledged is lost (G1), reordered (G2) or duplicated at QoS 2 (G3) in any of them.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from hexmq_cli import clusterstate, procs
from tests.conftest import HEXMQ
from tests.support.cluster_watch import (
    assert_balanced,
    drain,
    failovers_from,
    masters_of,
    members,
    membership,
    rebalanced,
    start_workload,
)
from tests.support.eventually import eventually_sync as wait_for
from tests.support.unique import uid
from tests.support.workload import Publisher, Subscriber, check

pytestmark = [pytest.mark.fault, pytest.mark.timeout(600)]

PARTITIONS = 32


def move_off(subs: list[Subscriber], port: int, to: int) -> None:
    """Subscribers of a node that left resume their sessions on another node."""
    for s in subs:
        if s.port == port:
            wait_for(lambda s=s: not s.connected(), 10, f"{s.client_id} disconnected")
            assert s.move(to), f"{s.client_id}: session not present after its node left"


def finish(pubs: list[Publisher], subs: list[Subscriber]) -> None:
    for p in pubs:
        p.stop()
    drain(subs, pubs, timeout=60)
    check(pubs, subs).assert_clean()
    for s in subs:
        s.close()


def test_three_nodes_grow_to_five_then_shrink_to_three_by_leave(hexmq_cluster: Any) -> None:
    """RF 3 under QoS 1/2 traffic: nodes 4 and 5 join one after the other, then nodes 1 and 2
    leave. Each step's rebalance finishes, mastership stays within 1.25x of the fair share,
    the leavers' partitions are handed over (never failed over) and nothing is lost."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "3"])
    tag = uid()
    pubs, subs = start_workload(cluster, [1, 2, 3], tag)
    time.sleep(1)
    for n in (4, 5):
        assert cluster.add() == n
        wait_for(lambda: rebalanced(cluster), 90, f"the rebalance after node {n} joined")
        assert_balanced(cluster, n, PARTITIONS)
    for n in (1, 2):
        said = cluster.leave(n)
        assert "left the cluster" in said, said
        assert f"n{n}" not in members(cluster)
        move_off(subs, cluster.mqtt_port(n), cluster.mqtt_port(3))
        wait_for(lambda: rebalanced(cluster), 90, f"the rebalance after node {n} left")
    assert_balanced(cluster, 3, PARTITIONS)
    assert set(masters_of(cluster)) == {"n3", "n4", "n5"}
    assert not failovers_from(cluster, "n1", log_node=3)
    assert not failovers_from(cluster, "n2", log_node=3)
    finish(pubs, subs)
    for p in pubs:
        if p.port == cluster.mqtt_port(3):
            assert not p.refused, (p.client_id, p.refused)
            assert not p.unanswered, (p.client_id, p.unanswered)


def test_a_rolling_restart_of_every_node_loses_nothing(hexmq_cluster: Any) -> None:
    """RF 2: nodes 1 and 2 leave and start again in turn, then node 3 is stopped plainly (a
    failover) and started again, each once the previous rebalance has finished (as the log
    line says), under QoS 1/2 traffic through a node not being restarted."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2"])
    tag = uid()
    subs = [
        Subscriber(f"s{q}-{tag}-n{i}", cluster.mqtt_port(i), f"r/{tag}/#", qos=q, version=v)
        for i in (1, 2, 3)
        for q, v in ((1, 4), (2, 5))
    ]
    for s in subs:
        s.connect()
    all_pubs: list[Publisher] = []

    def publish_through(node: int, phase: str) -> list[Publisher]:
        port = cluster.mqtt_port(node)
        pubs = [
            Publisher(f"p1-{tag}-{phase}", port, f"r/{tag}/{phase}/1", qos=1, version=5),
            Publisher(f"p2-{tag}-{phase}", port, f"r/{tag}/{phase}/2", qos=2, version=4),
        ]
        for p in pubs:
            p.start(interval=0.01)
        all_pubs.extend(pubs)
        return pubs

    for node, through, how in ((1, 3, "leave"), (2, 3, "leave"), (3, 1, "stop")):
        pubs = publish_through(through, f"{how}{node}")
        time.sleep(1)
        if how == "leave":
            assert "left the cluster" in cluster.leave(node)
        else:
            cluster.stop(node)
        move_off(subs, cluster.mqtt_port(node), cluster.mqtt_port(through))
        wait_for(lambda n=node: f"n{n}" not in members(cluster), 20, f"n{node} out")
        cluster.start(node)
        wait_for(lambda: rebalanced(cluster), 90, f"the rebalance after node {node} returned")
        for p in pubs:
            p.stop()
            assert not p.refused, (p.client_id, p.refused)
            assert not p.unanswered, (p.client_id, p.unanswered)
    assert_balanced(cluster, 3, PARTITIONS)
    finish(all_pubs, subs)


def _kill_node_processes(cluster_dir: Path, number: int) -> None:
    """SIGKILL a node's processes by the pids cluster.json records (a `hexmq cluster` command
    may hold the cluster's lock meanwhile)."""
    state = clusterstate.load_state(cluster_dir)
    assert state is not None
    idents = [r.identity for r in state.node(number).processes.values() if r.identity]
    procs.kill([i for i in idents if procs.is_running(i)])


def _wait_log(path: Path, text: str, timeout: float) -> None:
    wait_for(lambda: path.exists() and text in path.read_text(), timeout, f"{text!r} in {path}")


def _background(cluster: Any, *args: str) -> subprocess.Popen[str]:
    argv = [str(HEXMQ), "cluster", *args, "--dir", str(cluster.dir)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_joining_node_that_dies_mid_transfer_leaves_the_cluster_as_it_was(
    hexmq_cluster: Any,
) -> None:
    """RF 2 with queued messages to copy: node 4 is killed as soon as the view admits it,
    while its replicas are still catching up. The view drops it and takes it out of the
    target members, so the placement goes back to what it was (the same masters), and no
    acknowledged message is lost."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2"])
    tag = uid()
    before = masters_of(cluster)
    pubs, subs = start_workload(cluster, [1, 2, 3], tag)
    time.sleep(2)
    adding = _background(cluster, "add")
    try:
        _wait_log(cluster.dir / "node1" / "membership.log", "(joining n4)", 60)
        _kill_node_processes(cluster.dir, 4)
        adding.communicate(timeout=120)
    finally:
        if adding.poll() is None:
            adding.kill()
            adding.wait()
    wait_for(lambda: "n4" not in members(cluster), 30, "n4 dropped from the view")
    wait_for(lambda: rebalanced(cluster), 60, "the placement restored")
    doc = membership(cluster)["rebalance"]
    assert doc["target_members"] == ["n1", "n2", "n3"], doc
    assert masters_of(cluster) == before
    finish(pubs, subs)


def test_a_leave_cut_short_by_a_crash_is_a_failover(hexmq_cluster: Any) -> None:
    """RF 2: node 2 starts to leave and is killed before the view has let it go; the others
    fail its remaining partitions over as after any crash, `hexmq cluster leave` reports that
    it could not finish, and nothing acknowledged is lost."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2"])
    tag = uid()
    pubs, subs = start_workload(cluster, [1, 3], tag)
    time.sleep(2)
    leaving = _background(cluster, "leave", "2")
    try:
        _wait_log(cluster.dir / "node2" / "membership.log", "leaving the cluster", 60)
        _kill_node_processes(cluster.dir, 2)
        _, err = leaving.communicate(timeout=120)
    finally:
        if leaving.poll() is None:
            leaving.kill()
            leaving.wait()
    assert leaving.returncode != 0, err
    wait_for(lambda: "n2" not in members(cluster), 30, "n2 dropped from the view")
    wait_for(lambda: rebalanced(cluster), 60, "RF restored on nodes 1 and 3")
    assert_balanced(cluster, 2, PARTITIONS)
    finish(pubs, subs)
    for p in pubs:
        assert not p.refused, (p.client_id, p.refused)
        assert not p.unanswered, (p.client_id, p.unanswered)
