"""One trace per publish across the real services: a cross-node QoS 1 publish (RF 3) reaches a
real OTLP/gRPC receiver as one trace with the parent/child structure of docs/traces.md, and
`hexmq cluster up --trace-dir` writes OTLP JSON files."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from hexmq.hashring import assign, partition_of
from hexmq.mqtt import PubAck, Publish
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan, SpanNode
from tests.support.rawclient import RawClient
from tests.support.unique import uid

DESTINATION = "messaging.destination.name"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rx:
        # Inherited by `hexmq cluster up` and so by every service it starts.
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        yield rx


def client_on_node(prefix: str, node_id: str, partitions: int = 256, rf: int = 1) -> str:
    """A client id whose session partition is mastered by `node_id` (3 nodes)."""
    table = assign(["n1", "n2", "n3"], partitions, rf)
    while True:
        cid = f"{prefix}-{uid()}"
        if table[partition_of(cid, partitions)][0] == node_id:
            return cid


async def test_cross_node_publish_is_one_trace(hexmq_cluster, receiver: OtlpReceiver) -> None:
    cluster = hexmq_cluster(nodes=3, extra=["--rf", "3"])
    topic = f"traced/{uid()}"
    # Subscriber connected to node 3, its session mastered by node 2 (followed by n1 and n3);
    # publisher on node 1.
    sub, _ = await RawClient.connect(cluster.mqtt_port(3), client_on_node("sub", "n2", rf=3))
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(cluster.mqtt_port(1), f"pub-{uid()}")
    assert (await pub.publish(topic, b"hello", qos=1)) is not None
    delivery = await sub.expect(Publish)
    assert delivery.packet_id is not None
    await sub.send(PubAck(delivery.packet_id))

    # Each process exports on its own schedule: wait for this publish's root, then its trace.
    def root_of_this_publish(spans: list[ReceivedSpan]) -> ReceivedSpan | None:
        for span in spans:
            if span.name == "mqtt.publish" and span.attributes.get(DESTINATION) == topic:
                return span
        return None

    receiver.wait_for(lambda spans: root_of_this_publish(spans) is not None, timeout=15)
    root_span = root_of_this_publish(receiver.spans)
    assert root_span is not None
    expected = {"mqtt.publish", "edge.route", "partition.append", "partition.ack"}
    expected |= {"mqtt.deliver", "mqtt.client_ack", "partition.replicate"}
    receiver.wait_for(
        lambda spans: expected <= {x.name for x in spans if x.trace_id == root_span.trace_id},
        timeout=15,
    )
    (root,) = receiver.trace_tree(root_span.trace_id)

    def only(node: SpanNode, name: str) -> SpanNode:
        found = [c for c in node.children if c.span.name == name]
        assert len(found) == 1, f"expected one {name} under {node.span.name}:\n{root.render()}"
        return found[0]

    assert root.span.name == "mqtt.publish"
    assert root.span.resource["service.name"] == "hexmq-edge"
    assert root.span.attributes["hexmq.node"] == "n1"
    assert root.span.attributes["hexmq.qos"] == 1
    assert "hexmq.client_id_hash" in root.span.attributes
    assert not any("pub-" in str(v) for v in root.span.attributes.values())  # never raw ids
    only(root, "edge.route")
    append = only(root, "partition.append")
    assert append.span.resource["service.name"] == "hexmq-partition"
    assert append.span.attributes["hexmq.node"] == "n2"
    only(append, "partition.ack")
    replicate = [c.span for c in append.children if c.span.name == "partition.replicate"]
    assert sorted(s.attributes["hexmq.follower"] for s in replicate) == ["n1", "n3"]
    for span in replicate:
        assert span.attributes["hexmq.partition"] == append.span.attributes["hexmq.partition"]
        assert span.attributes["hexmq.partition.seq"] >= 1
        assert span.end_ns >= span.start_ns >= append.span.start_ns
    deliver = only(append, "mqtt.deliver")
    assert deliver.span.resource["service.name"] == "hexmq-edge"
    assert deliver.span.attributes["hexmq.node"] == "n3"
    only(deliver, "mqtt.client_ack")
    for client in (pub, sub):
        await client.close()


async def test_trace_dir_gets_otlp_json_files(hexmq_cluster, tmp_path) -> None:
    trace_dir = tmp_path / "traces"
    cluster = hexmq_cluster(nodes=1, extra=["--trace-dir", str(trace_dir)])
    topic = f"files/{uid()}"
    sub, _ = await RawClient.connect(cluster.mqtt_port(1), f"sub-{uid()}")
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(cluster.mqtt_port(1), f"pub-{uid()}")
    await pub.publish(topic, b"x", qos=1)
    got = await sub.expect(Publish)
    assert got.packet_id is not None
    await sub.send(PubAck(got.packet_id))
    for client in (pub, sub):
        await client.close()
    cluster.down()  # flushes every exporter

    names = set()
    for path in trace_dir.glob("*.jsonl*"):
        for line in path.read_text().splitlines():
            request = json.loads(line)
            for rs in request["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        assert len(span["traceId"]) == 32
                        int(span["traceId"], 16)  # lowercase hex, not base64
                        names.add(span["name"])
    assert {"mqtt.publish", "partition.append", "mqtt.deliver", "mqtt.client_ack"} <= names
    assert {p.name.split(".")[0] for p in trace_dir.glob("*.jsonl*")} >= {
        "edge-n1",
        "partition-n1",
        "membership-n1",
    }
