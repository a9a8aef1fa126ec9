"""Every service serves Prometheus metrics on its node's metrics port; the edge's counters
follow the traffic (copied once a second from its plain counters)."""

from __future__ import annotations

import asyncio

from hexmq.mqtt import Publish
from tests.support.metrics import scrape
from tests.support.rawclient import RawClient
from tests.support.unique import uid


async def test_services_serve_metrics(hexmq_cluster) -> None:
    cluster = hexmq_cluster(nodes=1)
    ports = cluster.node(1)["metrics_ports"]
    topic = f"m/{uid(8)}"
    sub, _ = await RawClient.connect(cluster.mqtt_port(1), f"sub-{uid(8)}")
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(cluster.mqtt_port(1), f"pub-{uid(8)}")
    for _ in range(5):
        await pub.publish(topic, b"x", qos=1)
    for _ in range(5):
        await sub.expect(Publish)

    edge: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    async with asyncio.timeout(10):
        while edge.get(("hexmq_messages_in_total", (("qos", "1"),)), 0) < 5:
            await asyncio.sleep(0.2)
            edge = await asyncio.to_thread(scrape, ports["edge"])
    assert edge[("hexmq_connections", ())] == 2
    assert edge[("hexmq_messages_out_total", (("qos", "1"),))] >= 5
    assert edge[("hexmq_view_epoch", ())] == 1
    link = (
        ("method", "hexmq.api.partition.v1.PartitionService/Link"),
        ("side", "client"),
    )
    assert edge[("hexmq_grpc_latency_seconds_count", link)] >= 1
    partition = await asyncio.to_thread(scrape, ports["partition"])
    assert partition[("hexmq_partition_roles", (("role", "master"),))] == 256
    # The batching interval in use, between --batch-interval-us and --batch-interval-max-us
    # (where in between depends on how busy this machine's cores are).
    for figures in (edge, partition):
        assert 0.004 <= figures[("hexmq_batch_interval_seconds", ())] <= 0.016
    membership = await asyncio.to_thread(scrape, ports["membership"])
    assert membership[("hexmq_view_epoch", ())] == 1
    for client in (pub, sub):
        await client.close()
