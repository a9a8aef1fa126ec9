"""$SYS topics: each node publishes its counters; `#` does not match them; clients cannot
publish under $SYS."""

from __future__ import annotations

import uuid

from hexmq.mqtt import Publish
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


async def test_s4_7_2_sys_topics_report_node_counters(hexmq_cluster) -> None:  # type: ignore[no-untyped-def]
    """§4.7.2: `$SYS/` topics are the server's: each node publishes its counters there.

    Also MQTT-4.7.2-1 (`#` does not match a topic starting with `$`) and a client's publish
    under `$SYS/` refused (5.0: PUBACK 0x87).
    """
    cluster = hexmq_cluster(nodes=1, extra=["--edge-arg=--sys-interval=0.3"])
    port = cluster.mqtt_port(1)
    watcher, _ = await RawClient.connect(port, f"sys-{uid()}")
    await watcher.subscribe("$SYS/broker/nodes/n1/messages/received/qos1", qos=0)
    everything, _ = await RawClient.connect(port, f"all-{uid()}")
    await everything.subscribe("#", qos=0)

    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    for _ in range(3):
        await pub.publish(f"plain/{uid()}", b"x", qos=1)
    # Only the broker publishes under $SYS: 5.0 is told "not authorized".
    refused = await pub.publish("$SYS/broker/nodes/n1/uptime", b"forged", qos=1)
    assert refused is not None
    assert refused.reason_code == 0x87

    # The counter reaches at least the 4 QoS 1 publishes above (others' too, never fewer).
    while True:
        report = await watcher.expect(Publish, timeout=5)
        assert report.topic == "$SYS/broker/nodes/n1/messages/received/qos1"
        assert report.payload != b"forged"
        if int(report.payload) >= 4:
            break
    # MQTT-4.7.2-1: "#" does not match topics beginning with "$"; it only sees the 3 plain ones.
    seen = [(await everything.expect(Publish)).topic for _ in range(3)]
    assert all(t.startswith("plain/") for t in seen)
    await pub.publish("plain/marker", b"m", qos=1)
    assert (await everything.expect(Publish)).topic == "plain/marker"
    for client in (watcher, everything, pub):
        await client.close()
