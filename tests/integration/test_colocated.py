"""Co-located nodes (`hexmq cluster up --colocated`, `hexmq node`; issue 28): each node's
membership agent, partition service and edge in one process, calling each other in process
(hexmq/inproc.py), their gRPC servers still serving the other nodes over mutual TLS.

A killed node's process takes all three services with it: the survivors fail over as with
separate processes, and nothing acknowledged is lost; what the node's own services may do in
process, a remote caller with another certificate still may not."""

from __future__ import annotations

import itertools
import os
import signal
import time
from typing import Any

import grpc
import pytest

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.membership.v1 import membership_pb2_grpc as mpb_grpc
from hexmq.trust.identity import EDGE, PARTITION
from hexmq_cli import clusterstate, procs
from tests.support.cluster_watch import (
    acknowledged_since,
    drain,
    failovers_from,
    members,
    rebalanced,
    start_workload,
)
from tests.support.eventually import eventually_sync as wait_for
from tests.support.trust import cluster_ca, tls_for
from tests.support.unique import uid
from tests.support.workload import DEEP_QUEUES, ConnectionLog, Publisher, Subscriber, check

PARTITIONS = 32


def test_a_killed_colocated_node_fails_over_and_loses_nothing(hexmq_cluster: Any) -> None:
    """RF 3, three co-located nodes: QoS 1 and QoS 2 publishers and persistent subscribers on
    every node; node 1's process (and its Redis) is killed. The survivors remove it and take
    over its partitions; their publishers see no error, their subscribers keep receiving, and
    every acknowledged message reaches every subscriber. Node 1 starts again as one process
    and rejoins the view."""
    cluster = hexmq_cluster(
        nodes=3, partitions=PARTITIONS, extra=["--rf", "3", "--colocated", DEEP_QUEUES]
    )
    for i in (1, 2, 3):
        assert set(cluster.pids(i)) == {"redis", "node"}
    status = cluster.status()
    assert all(n["colocated"] for n in status["nodes"])
    assert all(n["partitions"] and "error" not in n["partitions"] for n in status["nodes"])
    tag = uid()
    pubs, subs = start_workload(cluster, [1, 2, 3], tag)
    time.sleep(2)
    cluster.kill(1)
    wait_for(lambda: "n1" not in members(cluster), 15, "n1 removed from the view")
    killed = time.monotonic()
    survivors = [p for p in pubs if p.port != cluster.mqtt_port(1)]
    acknowledged_since(survivors, killed, "acknowledgements through the survivors after the kill")
    time.sleep(2)
    for p in pubs:
        p.stop()
    for s in subs:
        if s.port == cluster.mqtt_port(1):
            assert s.move(cluster.mqtt_port(2)), f"{s.client_id}: session present 0"
    drain(subs, pubs)
    report = check(pubs, subs)
    report.assert_clean()
    report.assert_once_while_connected(subs)
    for p in survivors:
        assert not p.refused, (p.client_id, p.refused)
        assert not p.unanswered, (p.client_id, p.unanswered)
    for s in subs:
        s.close()
    cluster.start(1)
    wait_for(lambda: "n1" in members(cluster), 30, "n1 back in the view")
    assert set(cluster.pids(1)) == {"redis", "node"}


def test_a_colocated_node_that_loses_its_redis_keeps_its_clients(hexmq_cluster: Any) -> None:
    """Node 1's Redis is killed under QoS 1 and QoS 2 traffic. Its partition service stops so
    that its state reloads from Redis, as in a process of its own; the node's process stays, its
    edge keeps every MQTT connection (as a separate edge process does), and the partition
    service starts again in the process once Redis is back: node 1 is in the view again, its
    publishers are answered, and every acknowledged message reaches every subscriber, those on
    node 1 included, without a reconnect."""
    cluster = hexmq_cluster(
        nodes=3, partitions=PARTITIONS, extra=["--rf", "3", "--colocated", DEEP_QUEUES]
    )
    node_pid = cluster.pids(1)["node"]
    log = ConnectionLog()
    tag = uid()
    pubs, subs = start_workload(cluster, [1, 2, 3], tag, log=log)
    time.sleep(2)
    redis = procs.identity_of(cluster.pids(1)["redis"])
    assert redis is not None
    procs.kill([redis])
    wait_for(
        lambda: (
            "partition service ended by itself"
            in cluster.service_log(1, "partition").read_text(errors="replace")
        ),
        30,
        "node 1's partition service stopping for its lost Redis",
    )
    cluster.start(1)  # starts what is not running: Redis
    assert cluster.pids(1)["node"] == node_pid, "node 1's process was started again"
    wait_for(lambda: "n1" in members(cluster), 60, "n1 in the view with its new incarnation")
    back = time.monotonic()
    mine = [p for p in pubs if p.port == cluster.mqtt_port(1)]
    acknowledged_since(
        mine, back, "node 1's publishers answered after its partition service is back"
    )
    time.sleep(1)
    for p in pubs:
        p.stop()
    drain(subs, pubs)
    check(pubs, subs).assert_clean()
    on_node_1 = {c.client_id for c in log.snapshot() if c.port == cluster.mqtt_port(1)}
    assert on_node_1, "no client of node 1 logged"
    dropped = [c for c in log.snapshot() if c.ended is not None and c.cause == "server"]
    assert not dropped, [(c.client_id, c.reason) for c in dropped]
    os.kill(node_pid, 0)  # still running: no ProcessLookupError
    for s in subs:
        s.close()


def test_a_colocated_nodes_servers_still_check_remote_callers(hexmq_cluster: Any) -> None:
    """What node 1's own partition service does in process (Propose to its agent), a remote
    caller with another node's partition certificate, or node 1's edge certificate, may not
    do over gRPC; one without a client certificate does not get in at all."""
    cluster = hexmq_cluster(nodes=2, partitions=PARTITIONS, extra=["--colocated"])
    node1 = cluster.node(1)
    target = f"{node1['host']}:{node1['membership_port']}"
    ca = cluster_ca(cluster.dir)
    request = mpb.ProposeRequest(incarnation=1)
    for role, node in ((PARTITION, "n2"), (EDGE, "n1")):
        tls = tls_for(ca, role, node)
        with tls.sync_channel(target, peer="membership") as channel:
            stub = mpb_grpc.MembershipServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Propose(request, timeout=10)
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, (role, node)
            # Reading the view is every member's right, in process or not.
            assert stub.GetView(mpb.GetViewRequest(), timeout=10).epoch >= 1
    with grpc.insecure_channel(target) as plain:
        with pytest.raises(grpc.RpcError) as no_tls:
            mpb_grpc.MembershipServiceStub(plain).GetView(mpb.GetViewRequest(), timeout=5)
        assert no_tls.value.code() == grpc.StatusCode.UNAVAILABLE


def test_sigterm_to_a_colocated_node_is_a_leave_and_its_plain_stop_needs_no_kill(
    hexmq_cluster: Any,
) -> None:
    """SIGTERM to node 3's one process (an orchestrator stopping the node): its three services
    leave together, so the view drops it by handover, without a failover, and the QoS 1
    publishers on the other nodes are never refused. `hexmq cluster stop 1` (SIGINT) then
    stops node 1's edge, partition service and agent in turn within the grace."""
    cluster = hexmq_cluster(
        nodes=3, partitions=PARTITIONS, extra=["--rf", "2", "--colocated", DEEP_QUEUES]
    )
    tag = uid()
    pubs = [
        Publisher(f"p-{tag}-n{i}", cluster.mqtt_port(i), f"t/{tag}/n{i}", qos=1) for i in (1, 2)
    ]
    subs = [Subscriber(f"s-{tag}-n{i}", cluster.mqtt_port(i), f"t/{tag}/#") for i in (1, 2)]
    for s in subs:
        s.connect()
    for p in pubs:
        p.start(interval=0.01)
    time.sleep(1)
    node3 = procs.identity_of(cluster.pids(3)["node"])
    assert node3 is not None
    os.kill(node3.pid, signal.SIGTERM)
    wait_for(lambda: not procs.is_running(node3), 60, "node 3's process exited")
    assert "n3" not in members(cluster)
    assert not failovers_from(cluster, "n3", log="node.log")
    log = (cluster.dir / "node3" / "node.log").read_text()
    assert "left the cluster" in log, log[-2000:]
    wait_for(lambda: rebalanced(cluster), 30, "RF restored on nodes 1 and 2")
    left = time.monotonic()
    acknowledged_since(pubs, left, "acknowledgements after node 3 left")
    for p in pubs:
        p.stop()
    drain(subs, pubs)
    check(pubs, subs).assert_clean()
    for p in pubs:
        assert not p.refused, (p.client_id, p.refused)
        assert not p.unanswered, (p.client_id, p.unanswered)
    for s in subs:
        s.close()
    stopped = cluster.cli("stop", "1")
    assert "killed" not in stopped.stderr, stopped.stderr
    assert "stopped 2 process(es)" in stopped.stderr, stopped.stderr


def test_a_node_added_to_a_colocated_cluster_is_one_process_too(hexmq_cluster: Any) -> None:
    """`hexmq cluster add` gives a co-located cluster a co-located node, with node 1's extra
    service arguments in their sections; it joins and takes its share."""
    extra = ["--rf", "2", "--colocated", "--edge-arg=--sys-interval=1"]
    cluster = hexmq_cluster(nodes=2, partitions=PARTITIONS, extra=extra)
    assert cluster.add() == 3
    wait_for(lambda: "n3" in members(cluster), 30, "n3 in the view")
    assert set(cluster.pids(3)) == {"redis", "node"}
    argv = clusterstate.require_state(cluster.dir).node(3).processes["node"].argv
    assert clusterstate.node_sections(argv)["edge"][-1] == "--sys-interval=1"
    wait_for(lambda: rebalanced(cluster), 60, "the join's rebalance finished")


@pytest.mark.fault  # three rolling restarts, as test_upgrade's switch to TLS: make test-fault
def test_a_plain_text_colocated_cluster_is_switched_to_tls_by_secure(hexmq_cluster: Any) -> None:
    """`hexmq cluster secure` on co-located nodes (`up`'s default since issue 28): each node's
    one process is restarted three times (certificates, then mutual TLS and a Redis password,
    then TLS only) while a QoS 1 publisher on node 1 keeps publishing to a persistent subscriber
    on node 2; afterwards every node runs TLS, nothing acknowledged was lost, and a caller
    without a certificate is refused."""
    extra = ["--rf", "2", "--colocated", "--insecure-cluster", DEEP_QUEUES]
    cluster = hexmq_cluster(nodes=2, partitions=PARTITIONS, extra=extra)
    assert [n["security"] for n in cluster.status()["nodes"]] == ["plain", "plain"]
    tag = uid()
    ports = itertools.cycle([cluster.mqtt_port(1), cluster.mqtt_port(2)])
    subs = [Subscriber(f"s-{tag}-n{i}", cluster.mqtt_port(i), f"f/{tag}/#", qos=1) for i in (1, 2)]
    for s in subs:
        s.connect()
        s.drop()  # each node restarts three times: their sessions queue meanwhile
    pubs = [
        Publisher(f"p-{tag}-n{i}", cluster.mqtt_port(i), f"f/{tag}/n{i}", qos=1, version=v)
        for i, v in ((1, 5), (2, 4))
    ]
    for p in pubs:
        p.reconnect = lambda: ("127.0.0.1", next(ports))
        p.start(interval=0.05)
    done = cluster.cli("secure", timeout=900)
    assert "step 3 of 3: node 2 back" in done.stderr, done.stderr
    time.sleep(1)
    for p in pubs:
        p.stop()
    for s in subs:
        assert s.move(s.port), f"{s.client_id}: session present 0"
    drain(subs, pubs)
    report = check(pubs, subs)
    report.assert_clean()
    assert all(len(p.acked) > 20 for p in pubs), [len(p.acked) for p in pubs]
    status = cluster.status()
    assert [(n["security"], n["alive"]) for n in status["nodes"]] == [("tls", True)] * 2
    assert all(set(cluster.pids(i)) == {"redis", "node"} for i in (1, 2))
    node1 = cluster.node(1)
    target = f"{node1['host']}:{node1['membership_port']}"
    with grpc.insecure_channel(target) as plain:
        with pytest.raises(grpc.RpcError) as no_tls:
            mpb_grpc.MembershipServiceStub(plain).GetView(mpb.GetViewRequest(), timeout=5)
        assert no_tls.value.code() == grpc.StatusCode.UNAVAILABLE
    for s in subs:
        s.close()
