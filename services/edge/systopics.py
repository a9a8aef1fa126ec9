"""$SYS topics: every edge publishes its node's figures, and one edge the cluster's totals.

Every --sys-interval seconds each edge

1. sends its counters to its own node's partition service (NodeStatsQuery with `report`),
   which keeps them while the edge's link is open and answers with them plus its own
   (queue-full drops, sessions, queued messages); the edge publishes them together under
   $SYS/broker/nodes/<node>/;
2. if its node has the lowest id (string order) among the live nodes in its view (live: its
   link to that node's partition service is up), asks every live node the same question and
   publishes the totals under $SYS/broker/cluster/, counting each node that answered with a
   current report of its edge.

A node with several edges (--edge-id, docs/operations.md "Several edges per node"): every one of
them reports its counters in step 1, and the partition service adds up the reports of every
edge linked to it, but only the node's first edge (edge id = node id) publishes, so each
figure comes once; while the first edge is down the node's topics lapse, as they do today
when a node's only edge is gone.

Why ask the nodes rather than read their retained $SYS topics: a node's figures then come in
one answer from one process, all taken at one moment, while its retained topics are spread over
partitions by topic hash, so with any partition node down some of every node's topics would be
missing and the totals silently short. A node whose edge or partition service is gone drops out
at the next interval, with no timeout to tune. It costs one small request per node and
interval, and no read of the retained store.

Both trees are retained, as mosquitto's $SYS is, so a new subscriber gets them at once. They
carry a Message Expiry of three intervals (at least MIN_EXPIRY_S): the figures of a node that
stopped publishing vanish instead of lingering. $SYS messages are QoS 0.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from hexmq import __version__
from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import NO_PROPERTIES
from services.edge.tickets import when_all_answered
from services.edge.translate import fill_message, message_commands

if TYPE_CHECKING:
    from services.edge.config import EdgeConfig
    from services.edge.dispatch import Dispatcher
    from services.edge.router import Router
    from services.edge.stats import EdgeStats

SYS_NODES = "$SYS/broker/nodes"
SYS_CLUSTER = "$SYS/broker/cluster"
EXPIRY_INTERVALS = 3
MIN_EXPIRY_S = 5.0
DROPS = ("publish/dropped_qos0", "publish/dropped_too_large", "publish/dropped_queue_full")
OK = pb.StatusCode.STATUS_CODE_OK


def node_values(counters: Mapping[str, int]) -> dict[str, int]:
    """A node's figures with `publish/dropped`, the sum of every kind of dropped delivery."""
    values = dict(counters)
    values["publish/dropped"] = sum(values.get(key, 0) for key in DROPS)
    return values


def cluster_values(nodes: Sequence[Mapping[str, int]], members: int) -> dict[str, int]:
    """The totals of the nodes counted: every figure summed, except uptime (the oldest node's);
    with how many nodes were counted (nodes/alive) and how many the view has (nodes/total)."""
    totals: dict[str, int] = {}
    for values in nodes:
        for key, value in values.items():
            if key == "uptime":
                totals[key] = max(totals.get(key, 0), value)
            else:
                totals[key] = totals.get(key, 0) + value
    totals["nodes/alive"] = len(nodes)
    totals["nodes/total"] = members
    return totals


def render(prefix: str, values: Mapping[str, int]) -> list[tuple[str, bytes]]:
    """(topic, payload) pairs; uptime reads "N seconds", as in mosquitto."""
    return [
        (f"{prefix}/{key}", (f"{value} seconds" if key == "uptime" else str(value)).encode())
        for key, value in sorted(values.items())
    ]


class SysEdge(Protocol):
    """What the $SYS publisher reads of its edge (services/edge/server.py, Edge)."""

    config: EdgeConfig
    router: Router
    dispatcher: Dispatcher
    stats: EdgeStats

    def connected_clients(self) -> int: ...


class SysTopics:
    def __init__(self, edge: SysEdge, interval: float) -> None:
        self.edge = edge
        self.interval = interval
        self.expiry_ms = int(max(EXPIRY_INTERVALS * interval, MIN_EXPIRY_S) * 1000)
        self.node_id = edge.config.node_id
        # A node's further edges only report their counters (the module's docstring).
        self.publishes = edge.config.node_first_edge
        self._publisher = f"$SYS/{self.node_id}"

    async def run(self) -> None:
        while True:
            self.tick()
            await asyncio.sleep(self.interval)

    def tick(self) -> None:
        edge = self.edge
        view = edge.router.view
        if view is None:
            return
        links = edge.router.links
        counters = edge.stats.counters(edge.connected_clients())
        own = links.get(self.node_id)
        if own is None or not own.connected:
            if self.publishes:
                self._publish_node(counters)  # without the partition service's figures
            return
        if not self.publishes:
            report = pb.NodeStatsQuery(edge_counters=counters, report=True)
            own.request(pb.EdgeCommand(node_stats=report), _ignore)
            return
        live = sorted(node for node, link in links.items() if link.connected)
        totals = None
        if live[0] == own.node_id:
            cluster = functools.partial(self._publish_cluster, len(view.members))
            totals = when_all_answered(len(live), cluster)

        def on_own(result: pb.Result) -> None:
            if result.status == OK:
                # The node's figures are the answer's: the reports of all its edges added up,
                # this one's included (an answer without them: this edge's own).
                self._publish_node({**counters, **result.node_stats.counters})
            else:
                self._publish_node(counters)
            if totals is not None:
                totals(result)

        report = pb.NodeStatsQuery(edge_counters=counters, report=True)
        own.request(pb.EdgeCommand(node_stats=report), on_own)
        if totals is not None:
            for node in live:
                if node != self.node_id:
                    links[node].request(pb.EdgeCommand(node_stats=pb.NodeStatsQuery()), totals)

    def _publish_node(self, counters: Mapping[str, int]) -> None:
        messages = render(f"{SYS_NODES}/{self.node_id}", node_values(counters))
        messages.append((f"{SYS_NODES}/{self.node_id}/version", f"hexmq {__version__}".encode()))
        self.publish(messages)

    def _publish_cluster(self, members: int, answers: list[pb.Result]) -> None:
        """One round of the cluster totals: the answers of the live nodes, then one
        publication (of the nodes whose edge reported recently enough)."""
        nodes = [
            node_values(result.node_stats.counters)
            for result in answers
            if result.status == OK
            and result.node_stats.edge_reported
            and result.node_stats.edge_report_age_ms <= self.expiry_ms
        ]
        self.publish(render(SYS_CLUSTER, cluster_values(nodes, members)))

    def publish(self, messages: Sequence[tuple[str, bytes]]) -> None:
        """Broker-originated retained QoS 0 messages, routed like any publish."""
        publish_retained(
            self.edge.router, self.edge.dispatcher, self._publisher, messages, self.expiry_ms
        )


def _ignore(_result: pb.Result) -> None:
    """A further edge's report needs no answer: its node's first edge publishes."""


def publish_retained(
    router: Router,
    dispatcher: Dispatcher,
    publisher: str,
    messages: Sequence[tuple[str, bytes]],
    expiry_ms: int,
) -> None:
    if router.view is None:
        return
    expires_at_ms = int(time.time() * 1000) + expiry_ms
    for topic, payload in messages:
        fill = functools.partial(_fill, publisher, topic, payload, expires_at_ms)
        route = router.route_publish(topic)
        commands = message_commands(fill, route.targets, router.retained_route(topic))
        router.routed_retained(commands[0][1].publish.message)
        for _node, cmd in commands:
            dispatcher.publish_qos0(cmd)


def _fill(publisher: str, topic: str, payload: bytes, expires_at_ms: int, m: cpb.Message) -> None:
    fill_message(m, publisher, topic, payload, 0, True, NO_PROPERTIES, int(time.time() * 1000))
    m.expires_at_ms = expires_at_ms
