"""A running cluster as the integration tests watch it (`hexmq cluster status --json`), and
the workload they run on it: who is in the view, who masters what, whether a rebalance is done,
which failovers the logs show; publishers and subscribers on every node, drained at the end."""

from __future__ import annotations

import time
from typing import Any

from tests.support.eventually import eventually_sync as wait_for
from tests.support.workload import ConnectionLog, Publisher, Subscriber


def membership(cluster: Any) -> dict[str, Any]:
    """What a live node's membership agent reports (`hexmq cluster status --json`)."""
    doc: dict[str, Any] = cluster.status()["membership"] or {}
    return doc


def members(cluster: Any) -> set[str]:
    return {m["node_id"] for m in membership(cluster).get("members", []) if m["in_view"]}


def masters_of(cluster: Any) -> dict[str, int]:
    """Partitions each node masters in the agreed view."""
    roles = membership(cluster).get("partitions", {})
    return {node: row["masters"] for node, row in roles.items() if row["masters"]}


def start_workload(
    cluster: Any, nodes: list[int], tag: str, log: ConnectionLog | None = None
) -> tuple[list[Publisher], list[Subscriber]]:
    """On each node: a QoS 1 (5.0) and a QoS 2 (3.1.1) publisher, and a QoS 1 (3.1.1) and a
    QoS 2 (5.0) persistent subscriber to every publisher's topic (their connections in `log`)."""
    subs: list[Subscriber] = []
    for node in nodes:
        port = cluster.mqtt_port(node)
        subs.append(Subscriber(f"s1-{tag}-n{node}", port, f"f/{tag}/#", qos=1, version=4, log=log))
        subs.append(Subscriber(f"s2-{tag}-n{node}", port, f"f/{tag}/#", qos=2, version=5, log=log))
    for s in subs:
        s.connect()
    pubs: list[Publisher] = []
    for node in nodes:
        port = cluster.mqtt_port(node)
        pubs.append(
            Publisher(f"p1-{tag}-n{node}", port, f"f/{tag}/q1n{node}", qos=1, version=5, log=log)
        )
        pubs.append(
            Publisher(f"p2-{tag}-n{node}", port, f"f/{tag}/q2n{node}", qos=2, version=4, log=log)
        )
    for p in pubs:
        p.start(interval=0.01)
    return pubs, subs


def acknowledged_since(pubs: list[Publisher], since: float, what: str, timeout: float = 60) -> None:
    """Until every publisher of `pubs` has an acknowledgement later than `since` (monotonic):
    publishing goes on. Not a count, which is the machine's speed, not the cluster's."""
    wait_for(
        lambda: all(max(list(p.acked.values()), default=0) > since for p in pubs), timeout, what
    )


def drain(subs: list[Subscriber], pubs: list[Publisher], timeout: float = 30.0) -> None:
    """Until every subscriber has every acknowledged message (or the timeout)."""

    def complete() -> bool:
        wanted = {p.payload(n) for p in pubs for n in p.acked}
        return all(wanted <= set(s.payloads()) for s in subs)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not complete():
        time.sleep(0.3)


def rebalanced(cluster: Any) -> bool:
    """The agreed view has nothing moving: every partition in sync at its goal placement."""
    doc = membership(cluster).get("rebalance") or {}
    return doc.get("moving") == 0 and not doc.get("joining") and not doc.get("leaving")


def replicas_of(cluster: Any) -> dict[str, int]:
    """Replicas (master or follower) each node holds in the agreed view."""
    roles = membership(cluster).get("partitions", {})
    return {node: row["masters"] + row["follows"] for node, row in roles.items()}


def assert_balanced(cluster: Any, nodes: int, partitions: int) -> None:
    """No node masters more than 1.25x its fair share (issue 12, "Balance")."""
    masters = masters_of(cluster)
    assert sum(masters.values()) == partitions, masters
    assert len(masters) == nodes, masters
    assert max(masters.values()) <= 1.25 * partitions / nodes, masters


def failovers_from(
    cluster: Any, node_id: str, log_node: int = 1, log: str = "membership.log"
) -> list[str]:
    """View changes (node `log_node`'s membership log; `log`: node.log for a co-located node)
    that failed a partition over from `node_id` once its leave had started: a leave moves
    master roles by handover only. (A failover before, of a node that a loaded machine stalled
    past the failure timeout, is failure detection doing its job, not the leave.)"""
    lines = (cluster.dir / f"node{log_node}" / log).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if f"leaving {node_id}" in line), 0)
    return [line for line in lines[start:] if "failover p" in line and f" {node_id}->" in line]
