"""Failover against real processes (issue 10, DESIGN.md G1-G6; docs/failover.md): nodes are
killed with SIGKILL (every process, Redis included) or paused with SIGSTOP while QoS 1 and
QoS 2 publishers and persistent subscribers on every node run; the cluster replaces the lost
masters and nothing acknowledged is lost, duplicated (QoS 2) or reordered.

Each test runs its own cluster on 32 partitions (loads are per partition: fewer make the tests
faster, the mechanism is the same) with a workload from tests/support/workload.py.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from tests.support.cluster_watch import (
    acknowledged_since,
    drain,
    masters_of,
    members,
    start_workload,
)
from tests.support.eventually import eventually_sync as wait_for
from tests.support.unique import uid
from tests.support.workload import (
    DEEP_QUEUES,
    Subscriber,
    check,
    close_client,
    open_client,
    still_connected,
)

PARTITIONS = 32


def test_two_of_three_nodes_killed_lose_nothing_acknowledged(hexmq_cluster: Any) -> None:
    """RF 3: node 1 is killed, then node 2, for good, under QoS 1 and QoS 2 traffic on every
    node. The survivor serves everything alone: publishers connected to it never see an
    error; every acknowledged message reaches every subscriber (G1), QoS 2 ones once (G3), in
    order per publisher (G2); the subscribers of the dead nodes resume their sessions on the
    survivor with session present (G4); the retained message set before is still there (G6);
    a will of a client of a dead node is published, one of a client of the survivor is not."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "3", DEEP_QUEUES])
    tag = uid()
    survivor = cluster.mqtt_port(3)
    retained = open_client(f"r-{tag}", cluster.mqtt_port(1))
    retained.publish(f"keep/{tag}", b"kept", qos=1, retain=True).wait_for_publish(10)
    close_client(retained)
    wills = {
        node: open_client(
            f"w{node}-{tag}", cluster.mqtt_port(node), will=(f"will/{tag}/n{node}", b"gone")
        )
        for node in (1, 3)
    }
    will_watcher = Subscriber(f"ww-{tag}", survivor, f"will/{tag}/#", qos=1)
    will_watcher.connect()
    pubs, subs = start_workload(cluster, [1, 2, 3], tag)
    time.sleep(2)
    cluster.kill(1)
    wait_for(lambda: "n1" not in members(cluster), 10, "n1 removed from the view")
    time.sleep(2)
    cluster.kill(2)
    wait_for(lambda: "n2" not in members(cluster), 10, "n2 removed from the view")
    both_gone = time.monotonic()
    on_survivor = [p for p in pubs if p.port == survivor]
    # Publishing through the survivor goes on after both kills. (How many acknowledgements
    # a few seconds hold is the machine's speed: make test here once saw 98 where 100 were
    # asked for.)
    acknowledged_since(
        on_survivor, both_gone, "acknowledgements through the survivor after both kills"
    )
    time.sleep(3)
    for p in pubs:
        p.stop()
    for s in subs:
        if s.port != survivor:
            assert s.move(survivor), f"{s.client_id}: session present 0 after its node died"
    drain(subs, pubs)
    report = check(pubs, subs)
    report.assert_clean()
    report.assert_once_while_connected(subs)
    for p in on_survivor:
        assert not p.refused, (p.client_id, p.refused)
        assert not p.unanswered, (p.client_id, p.unanswered)
    # G6: the retained message is kept; only the dead node's client's will went out.
    late = Subscriber(f"late-{tag}", survivor, f"keep/{tag}", qos=1)
    late.connect()
    wait_for(lambda: late.payloads() == ["kept"], 10, "the retained message")
    wait_for(lambda: f"will/{tag}/n1" in _topics(will_watcher), 20, "node 1 client's will")
    assert f"will/{tag}/n3" not in _topics(will_watcher)
    assert still_connected(wills[3])
    for client in wills.values():
        close_client(client)
    for s in [*subs, late, will_watcher]:
        s.close()


def _topics(sub: Subscriber) -> list[str]:
    return sub.topics()


def test_rf2_one_node_killed_and_restarted_gets_its_roles_back_once_in_sync(
    hexmq_cluster: Any,
) -> None:
    """RF 2: node 2 is killed under traffic, then started again. Nothing acknowledged is lost;
    the restarted node joins the view, catches up, and masters its partitions again (by
    handover, once in sync); a client id connected through node 3 after the failover can be
    taken over through node 1 (one live connection per client id, G5)."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2", DEEP_QUEUES])
    tag = uid()
    before = masters_of(cluster)
    pubs, subs = start_workload(cluster, [1, 2, 3], tag)
    time.sleep(2)
    cluster.kill(2)
    wait_for(lambda: "n2" not in members(cluster), 10, "n2 removed from the view")
    time.sleep(2)
    cluster.start(2)
    wait_for(lambda: "n2" in members(cluster), 20, "n2 back in the view")
    wait_for(
        lambda: masters_of(cluster) == before,
        60,
        f"n2 masters its partitions again (before {before})",
    )
    time.sleep(1)
    for p in pubs:
        p.stop()
    dead_subs = [s for s in subs if s.port == cluster.mqtt_port(2)]
    for s in dead_subs:
        assert s.move(cluster.mqtt_port(1))
    drain(subs, pubs)
    report = check(pubs, subs)
    report.assert_clean()
    report.assert_once_while_connected(subs)
    for p in pubs:
        if p.port != cluster.mqtt_port(2):
            assert not p.refused, (p.client_id, p.refused)
            assert not p.unanswered, (p.client_id, p.unanswered)
    # G5 after the failover: the same client id through another node closes the first one.
    first = Subscriber(f"g5-{tag}", cluster.mqtt_port(3), f"g5/{tag}", qos=1)
    first.connect()
    second = Subscriber(f"g5-{tag}", cluster.mqtt_port(1), f"g5/{tag}", qos=1)
    second.connect()
    wait_for(lambda: not first.connected(), 10, "the first connection closed")
    for s in [*subs, second]:
        s.close()


def test_a_paused_node_is_removed_fenced_and_rejoins(hexmq_cluster: Any) -> None:
    """RF 3: every process of node 2 is stopped (SIGSTOP) for longer than the failure timeout,
    then continued. The others remove it from the view and fail its partitions over while it
    is paused (traffic through nodes 1 and 3 goes on); when it continues it finds itself out of
    the view (fenced), rejoins as a follower, catches up and masters its partitions again.
    Nothing acknowledged is lost."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "3", DEEP_QUEUES])
    tag = uid()
    before = masters_of(cluster)
    pubs, subs = start_workload(cluster, [1, 3], tag)
    time.sleep(2)
    pids = [pid for service, pid in cluster.pids(2).items() if pid]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: "n2" not in members(cluster), 15, "paused n2 removed from the view")
        time.sleep(2)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    wait_for(lambda: "n2" in members(cluster), 30, "n2 back in the view")
    wait_for(lambda: masters_of(cluster) == before, 60, "n2 masters its partitions again")
    time.sleep(1)
    for p in pubs:
        p.stop()
    drain(subs, pubs)
    report = check(pubs, subs)
    report.assert_clean()
    report.assert_once_while_connected(subs)
    for p in pubs:
        assert not p.refused, (p.client_id, p.refused)
        assert not p.unanswered, (p.client_id, p.unanswered)
    for s in subs:
        s.close()


def test_a_node_whose_redis_hangs_stops_and_its_partitions_fail_over(hexmq_cluster: Any) -> None:
    """RF 2: node 2's Redis stops answering (SIGSTOP) under traffic. Its partition service's
    writes time out after --redis-timeout (0.5 s here; redis-py's own default is 5 s) and it
    stops (fail-stop) instead of hanging with writes it can neither make durable nor refuse;
    node 1 takes over its partitions and the publishers of node 1 see a delay, never an
    error."""
    cluster = hexmq_cluster(
        nodes=2,
        partitions=PARTITIONS,
        extra=["--rf", "2", "--partition-arg=--redis-timeout=0.5", DEEP_QUEUES],
    )
    tag = uid()
    pubs, subs = start_workload(cluster, [1], tag)
    time.sleep(1)
    redis_pid = cluster.pids(2)["redis"]
    partition_pid = cluster.pids(2)["partition"]
    os.kill(redis_pid, signal.SIGSTOP)
    try:
        # Well before redis-py's default timeout would have stopped it.
        wait_for(lambda: not pid_alive(partition_pid), 4.5, "node 2's partition service stopped")
        wait_for(lambda: masters_of(cluster) == {"n1": PARTITIONS}, 15, "n1 masters everything")
        time.sleep(1)
    finally:
        os.kill(redis_pid, signal.SIGCONT)
    for p in pubs:
        p.stop()
    drain(subs, pubs)
    report = check(pubs, subs)
    report.assert_clean()
    report.assert_once_while_connected(subs)
    for p in pubs:
        assert not p.refused, (p.client_id, p.refused)
        assert not p.unanswered, (p.client_id, p.unanswered)
        assert p.acked
    for s in subs:
        s.close()


def pid_alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped by its manager, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
