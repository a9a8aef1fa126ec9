"""deploy/compose/compose.yaml run as local processes (issue 13): the file's own commands,
environment, healthchecks, depends_on conditions and HAProxy config, with service names mapped
to loopback ports (tests/support/compose_local.py) and `hexmq consul-dev` in place of the
consul service (tests/support/compose_run.py). If an option, a variable, an address or a
readiness the file relies on stops matching the services, this test fails.

A real OTLP receiver listens where the file sends traces (the otel-collector service's port),
so the services' exporters, configured by the file's OTEL_* variables, have a Collector.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.support.compose_local import load_local_topology
from tests.support.compose_run import LocalCompose
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.workload import Publisher, Subscriber, check

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
NODE_ROLES = ("edge", "partition", "membership", "redis")
MQTT_BACKEND = "edges-mqtt"


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.1)


def connect_through(compose: LocalCompose, sub: Subscriber) -> str:
    """Connect the subscriber through HAProxy; the edge service HAProxy gave it to."""
    before = compose.haproxy_servers(MQTT_BACKEND)
    sub.connect(timeout=10)
    after = compose.haproxy_servers(MQTT_BACKEND)
    (edge,) = [e for e in after if after[e].connections == before[e].connections + 1]
    return edge


def local_port(sub: Subscriber) -> int:
    client = sub._client
    assert client is not None
    sock = client.socket()
    assert sock is not None
    port: int = sock.getsockname()[1]
    return port


def connect_spans(spans: list[ReceivedSpan]) -> dict[int, str]:
    """Client port -> the node whose edge traced its CONNECT (from the PROXY header)."""
    return {
        int(s.attributes["client.port"]): str(s.resource["hexmq.node"])
        for s in spans
        if s.name == "mqtt.connect" and "client.port" in s.attributes
    }


def test_compose_topology_round_trip_through_haproxy_and_clients_resume_after_a_node_is_killed(
    tmp_path: Path, cluster_prerequisites: None
) -> None:
    """The file's defaults (256 partitions, RF 2), every span sampled (HEXMQ_TRACE_SAMPLE,
    the file's own knob). Three persistent QoS 1 subscribers, one per edge by HAProxy's
    leastconn, and a QoS 1 publisher, all through HAProxy. The node (edge, partition,
    membership, Redis) of a subscriber not sharing the publisher's edge is killed: that
    subscriber reconnects through HAProxy at once and resumes its session on another edge
    (session present, nothing acknowledged lost, order kept), the others stay connected, the
    publisher sees no error, and HAProxy takes the dead edge out."""
    topo = load_local_topology(COMPOSE, {"HEXMQ_TRACE_SAMPLE": "1.0"})
    edges = [s.name for s in topo.with_alias("edges")]
    collector = OtlpReceiver(port=topo.port("otel-collector", 4317)).start()
    subs: list[Subscriber] = []
    publisher: Publisher | None = None
    began = time.monotonic()
    try:
        with LocalCompose(topo, COMPOSE, tmp_path / "compose") as compose:
            compose.up(["haproxy"], timeout=40)
            compose.wait_healthy(edges, timeout=20)  # the file's healthcheck: /readyz
            wait_for(
                lambda: all(
                    s.status == "UP" for s in compose.haproxy_servers(MQTT_BACKEND).values()
                ),
                10,
                "HAProxy's checks of every edge's /readyz pass",
            )
            serving_after = time.monotonic() - began
            assert sorted(compose.haproxy_servers(MQTT_BACKEND)) == edges

            mqtt = topo.port("haproxy", 1883)
            tag = uuid.uuid4().hex[:8]
            placed: dict[str, str] = {}
            for i in range(len(edges)):
                sub = Subscriber(f"s{i}-{tag}", mqtt, f"compose/{tag}/#", qos=1)
                subs.append(sub)
                placed[sub.client_id] = connect_through(compose, sub)
            assert sorted(placed.values()) == edges, f"leastconn spread them: {placed}"

            publisher = Publisher(f"p-{tag}", mqtt, f"compose/{tag}/t", qos=1)
            publisher.start(interval=0.05)
            wait_for(lambda: len(publisher.acked) >= 5, 10, "the publisher's first acks")
            by_edge = compose.haproxy_servers(MQTT_BACKEND)
            (publisher_edge,) = [e for e in edges if by_edge[e].connections == 2]
            wait_for(
                lambda: all(len(s.payloads()) >= 5 for s in subs),
                10,
                "every subscriber gets the publisher's messages through HAProxy",
            )

            # The file's OTEL_* variables reach the Collector's address, and HAProxy's PROXY
            # v2 header gives each edge the client's own address (its port is the client's
            # socket, not HAProxy's).
            ports = {local_port(s): placed[s.client_id].replace("edge-", "n") for s in subs}
            collector.wait_for(lambda spans: ports.items() <= connect_spans(spans).items(), 10)
            collector.wait_for(
                lambda spans: (
                    {"hexmq-edge", "hexmq-partition", "hexmq-membership"}
                    <= {str(s.resource["service.name"]) for s in spans}
                ),
                10,
            )

            victim = next(s for s in subs if placed[s.client_id] != publisher_edge)
            node = placed[victim.client_id].removeprefix("edge-")
            compose.kill([f"{role}-{node}" for role in NODE_ROLES])
            wait_for(lambda: not victim.connected(), 5, f"{victim.client_id} sees its edge die")
            # At once, before HAProxy's checks can have marked the dead edge down.
            started = time.monotonic()
            assert victim.move(mqtt, timeout=10), "session present after the reconnect"
            resumed_in = time.monotonic() - started
            by_edge = compose.haproxy_servers(MQTT_BACKEND)
            assert by_edge[f"edge-{node}"].connections == 0

            sent_after = publisher.sent
            wait_for(lambda: len(publisher.acked) >= sent_after + 10, 15, "acks after the kill")
            publisher.stop()
            wanted = {publisher.payload(n) for n in publisher.acked}
            wait_for(
                lambda: all(wanted <= set(s.payloads()) for s in subs),
                15,
                "every acknowledged message at every subscriber",
            )
            check([publisher], subs).assert_clean()
            assert not publisher.refused
            assert not publisher.unanswered
            assert victim.resumed == [True]
            assert all(s.connected() for s in subs if s is not victim)
            wait_for(
                lambda: compose.haproxy_servers(MQTT_BACKEND)[f"edge-{node}"].status == "DOWN",
                10,
                f"HAProxy marks edge-{node} down",
            )
            print(
                f"up and every edge UP in HAProxy after {serving_after:.1f} s; resumed through "
                f"HAProxy in {resumed_in:.2f} s; the publisher's longest gap between acks "
                f"{publisher.longest_gap():.2f} s"
            )
            for sub in subs:
                sub.close()
    finally:
        if publisher is not None:
            publisher.stop()
        for sub in subs:
            sub.close()
        collector.stop()
