"""Join and leave against real processes (issue 12; docs/failover.md, "Join" and "Leave";
docs/operations.md, "Adding a node" and "Leaving"): a node is added with `hexmq cluster add`
and one leaves with `hexmq cluster leave` or with SIGTERM to its services (an orchestrator's
stop), under QoS 1 and QoS 2 traffic; partitions move by handover and bulk transfer, a leaving
node's 5.0 clients get DISCONNECT 0x9C Use another server naming another node, and nothing
acknowledged is lost.

32 partitions like tests/integration/test_failover.py; the long runs (3 -> 4 -> 5 -> 3, rolling
restarts, a joiner killed mid-transfer) are in test_elastic_faults.py under the fault mark.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from hexmq_cli import procs
from tests.support.cluster_watch import (
    acknowledged_since,
    assert_balanced,
    drain,
    failovers_from,
    members,
    rebalanced,
    replicas_of,
    start_workload,
)
from tests.support.eventually import eventually_sync as wait_for
from tests.support.unique import uid
from tests.support.workload import (
    DEEP_QUEUES,
    Publisher,
    Subscriber,
    check,
    close_client,
    open_client,
)

PARTITIONS = 32
USE_ANOTHER_SERVER = 0x9C


class DisconnectWatch:
    """A connected MQTT 5.0 client that records the server's DISCONNECT (reason code and
    Server Reference), as a client of a leaving node sees it."""

    def __init__(self, client_id: str, port: int) -> None:
        self.client = open_client(client_id, port)
        self.reason: int | None = None
        self.reference: str | None = None
        self.closed = threading.Event()

        def on_disconnect(c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
            self.reason = rc.value if rc is not None else None
            self.reference = getattr(props, "ServerReference", None) if props else None
            self.closed.set()

        self.client.on_disconnect = on_disconnect

    def close(self) -> None:
        close_client(self.client)


def port_of(reference: str) -> int:
    host, _, port = reference.rpartition(":")
    assert host == procs.LOOPBACK, reference
    return int(port)


def stop_workload(pubs: list[Publisher]) -> None:
    for p in pubs:
        p.stop()


@pytest.mark.timeout(240)
def test_a_node_joins_and_another_leaves_under_traffic_losing_nothing(hexmq_cluster: Any) -> None:
    """RF 2, 3 nodes under QoS 1/2 traffic on every node: `hexmq cluster add` starts node 4,
    which takes over about a quarter of the replicas (by bulk transfer) and masters its share
    (by handover); then `hexmq cluster leave 2` moves node 2's roles away before it stops: its
    MQTT 5.0 clients get DISCONNECT 0x9C naming another node, its partitions are handed over,
    never failed over, and no acknowledged message is lost, duplicated at QoS 2 or
    reordered; mastership stays within 1.25x of the fair share throughout."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2", DEEP_QUEUES])
    tag = uid()
    pubs, subs = start_workload(cluster, [1, 2, 3], tag)
    watch = DisconnectWatch(f"dw-{tag}", cluster.mqtt_port(2))
    time.sleep(1)

    assert cluster.add() == 4
    wait_for(lambda: "n4" in members(cluster), 10, "n4 in the view")
    wait_for(lambda: rebalanced(cluster), 60, "the join's rebalance finished")
    replicas = replicas_of(cluster)
    # About 1/N of the replicas move: the goal gives n4 its share of RF x partitions.
    share = 2 * PARTITIONS / 4
    assert 0.5 * share <= replicas["n4"] <= 1.25 * share, replicas
    assert_balanced(cluster, 4, PARTITIONS)

    others = {cluster.mqtt_port(i) for i in (1, 3, 4)}
    said = cluster.leave(2)
    assert "left the cluster" in said, said
    assert "n2" not in members(cluster)
    assert watch.closed.wait(10), "the leaving node's 5.0 client was not disconnected"
    assert watch.reason == USE_ANOTHER_SERVER, watch.reason
    assert watch.reference is not None
    assert port_of(watch.reference) in others, watch.reference
    wait_for(lambda: rebalanced(cluster), 30, "the leave's rebalance finished")
    moved = time.monotonic()
    assert_balanced(cluster, 3, PARTITIONS)
    # n2's partitions moved by handover only: no failover names it.
    assert not failovers_from(cluster, "n2")
    # Publishing on the other nodes goes on after the join and the leave (how many
    # acknowledgements it made meanwhile is the machine's speed, not the cluster's).
    staying = [p for p in pubs if p.port != cluster.mqtt_port(2)]
    acknowledged_since(staying, moved, "acknowledgements on the other nodes after the leave")
    time.sleep(1)
    stop_workload(pubs)
    for s in subs:
        if s.port == cluster.mqtt_port(2):
            assert not s.connected(), f"{s.client_id} still connected to the node that left"
            assert s.move(port_of(watch.reference)), f"{s.client_id}: session not present"
    drain(subs, pubs)
    check(pubs, subs).assert_clean()
    for p in pubs:
        if p.port != cluster.mqtt_port(2):
            assert not p.refused, (p.client_id, p.refused)
            assert not p.unanswered, (p.client_id, p.unanswered)
    watch.close()
    for s in subs:
        s.close()


@pytest.mark.timeout(240)
def test_sigterm_to_every_service_of_a_node_is_a_leave_not_a_failover(
    hexmq_cluster: Any,
) -> None:
    """An orchestrator stops a node by SIGTERM to all its services at once: the node leaves
    (its master roles handed over, RF restored on the others) before they exit, so the view
    drops it without a failover, and QoS 1 publishers on the other nodes are never refused."""
    cluster = hexmq_cluster(nodes=3, partitions=PARTITIONS, extra=["--rf", "2", DEEP_QUEUES])
    tag = uid()
    pubs = [
        Publisher(f"p-{tag}-n{i}", cluster.mqtt_port(i), f"t/{tag}/n{i}", qos=1) for i in (1, 2)
    ]
    subs = [Subscriber(f"s-{tag}-n{i}", cluster.mqtt_port(i), f"t/{tag}/#") for i in (1, 3)]
    for s in subs:
        s.connect()
    for p in pubs:
        p.start(interval=0.01)
    time.sleep(1)
    pids = cluster.pids(3)
    services = [procs.identity_of(pids[s]) for s in ("edge", "partition", "membership")]
    for ident in services:
        assert ident is not None
        os.kill(ident.pid, signal.SIGTERM)
    wait_for(
        lambda: not any(procs.is_running(i) for i in services if i is not None),
        60,
        "node 3's services exited",
    )
    assert "n3" not in members(cluster)
    assert not failovers_from(cluster, "n3")
    wait_for(lambda: rebalanced(cluster), 30, "RF restored on nodes 1 and 2")
    restored = time.monotonic()
    log = (cluster.dir / "node3" / "membership.log").read_text()
    assert "left the cluster" in log, log[-2000:]
    # Publishing goes on after node 3 left (not a count: that is the machine's speed).
    acknowledged_since(pubs, restored, "acknowledgements after node 3 left")
    time.sleep(0.5)
    stop_workload(pubs)
    assert subs[1].move(cluster.mqtt_port(1)), "the session of node 3's subscriber was lost"
    drain(subs, pubs)
    check(pubs, subs).assert_clean()
    for p in pubs:
        assert not p.refused, (p.client_id, p.refused)
        assert not p.unanswered, (p.client_id, p.unanswered)
    for s in subs:
        s.close()
