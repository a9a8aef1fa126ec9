"""Health, readiness and the PROXY protocol on real processes: a local cluster's /readyz and
gRPC health answers, an edge that stops being ready when it cannot route, and an edge behind a
real HAProxy (send-proxy-v2) that sees, logs and traces the client's own address."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hexmq.mqtt import ConnAck, Connect, PingReq, PingResp
from hexmq.trust.identity import MEMBERSHIP, PARTITION, Identity
from tests.support.edgeproc import edge_process
from tests.support.eventually import eventually_sync
from tests.support.ports import free_ports
from tests.support.processes import end
from tests.support.rawclient import RawClient
from tests.support.trust import cluster_channel

# A loopback address of the client's own, so the edge can tell it from HAProxy's 127.0.0.1.
CLIENT_ADDR = "127.0.0.77"


def readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def grpc_health(port: int, cluster: Any = None, peer: Identity | None = None) -> int:
    """gRPC health at port: the edge's --health-listen in plain text; with `cluster` and
    `peer`, a service's own port, which takes mutual TLS only (as an operator of its CA)."""
    target = f"127.0.0.1:{port}"
    if cluster is None or peer is None:
        channel = grpc.insecure_channel(target)
    else:
        channel = cluster_channel(cluster.dir, target, peer)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return int(stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status)


def test_every_service_answers_readyz_and_grpc_health_and_an_edge_that_cannot_route_is_not_ready(
    hexmq_cluster: Callable[..., Any], cluster_prerequisites: None
) -> None:
    (health_port,) = free_ports(1)
    cluster = hexmq_cluster(nodes=1, extra=[f"--edge-arg=--health-listen=127.0.0.1:{health_port}"])
    node = cluster.node(1)
    metrics = node["metrics_ports"]
    for service in ("edge", "partition", "membership"):
        status, text = readyz(metrics[service])
        assert status == 200, f"{service}: {text}"
    assert readyz(metrics["edge"])[1].startswith("ready: view 1: routes all")
    assert readyz(metrics["membership"])[1] == "ready: view 1: 1 members\n"
    serving = health_pb2.HealthCheckResponse.SERVING
    for port, role in ((node["partition_port"], PARTITION), (node["membership_port"], MEMBERSHIP)):
        assert grpc_health(port, cluster, Identity(role, "n1")) == serving
        # Their ports take no plain text: a plain health check fails (the edge's
        # --health-listen is the one for probes that cannot present a certificate).
        with pytest.raises(grpc.RpcError):
            grpc_health(port)
    # The edge's gRPC health follows its readiness within its 0.5 s check interval.
    eventually_sync(lambda: grpc_health(health_port) == serving, 5, "edge gRPC health SERVING")

    # The partition service goes away: its agent takes the node out of the view at once (no
    # partition service serves it), so the edge can no longer route, and says so; the
    # membership service still serves its view, but is not ready: its node is not in it.
    os.kill(cluster.pids(1)["partition"], signal.SIGKILL)
    eventually_sync(lambda: readyz(metrics["edge"])[0] == 503, 20, "edge /readyz turned 503")
    # (First, often, for its broken link: "256 of 256 partitions have no master this edge can
    # reach"; then for the view without n1.)
    eventually_sync(
        lambda: "not ready: node n1 is not in view" in readyz(metrics["edge"])[1],
        20,
        "edge /readyz says n1 left the view",
    )
    eventually_sync(
        lambda: grpc_health(health_port) == health_pb2.HealthCheckResponse.NOT_SERVING,
        20,
        "edge gRPC health turned NOT_SERVING",
    )
    status, text = readyz(metrics["membership"])
    assert status == 503
    assert "does not list node n1" in text


def test_a_standalone_edge_is_ready_without_a_node_of_its_own_and_stops_at_once_on_sigterm(
    hexmq_cluster: Callable[..., Any], cluster_prerequisites: None, tmp_path: Path
) -> None:
    """An edge of a pool deployed on its own (a Kubernetes StatefulSet of edges,
    docs/kubernetes.md): its id and certificate are its own, no member's. With --standalone it
    is ready once it routes every partition; without, the same edge waits for a node of its
    name in the view, which never comes."""
    cluster = hexmq_cluster(nodes=1)
    alone, pooled = free_ports(2)
    with (
        edge_process(cluster, tmp_path, [f"--metrics-listen=127.0.0.1:{alone}"], name="e0"),
        edge_process(
            cluster,
            tmp_path,
            [f"--metrics-listen=127.0.0.1:{pooled}", "--standalone"],
            name="edge-0",
        ) as edge,
    ):
        assert readyz(alone) == (503, "not ready: node e0 is not in view 1\n")
        eventually_sync(lambda: readyz(pooled)[0] == 200, 20, "the standalone edge is ready")
        assert readyz(pooled)[1].startswith("ready: view 1: routes all")
        # SIGTERM: no node leave to follow (a node's edge waits up to 5 s for one to show).
        started = time.monotonic()
        edge.proc.send_signal(signal.SIGTERM)
        assert edge.proc.wait(20) == 0
        assert time.monotonic() - started < 4
        assert "standalone edge: edge-0 belongs to no node" in edge.log_text()
        assert "the node is not leaving" not in edge.log_text()


@contextlib.contextmanager
def haproxy_in_front_of(edge_port: int, workdir: Path) -> Iterator[int]:
    """A real HAProxy (TCP mode) forwarding to the edge with send-proxy-v2; its frontend port."""
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.fail("haproxy is not installed (scripts/system-deps.sh installs it)")
    (front,) = free_ports(1)
    config = workdir / "haproxy.cfg"
    config.write_text(
        "defaults\n  mode tcp\n  timeout connect 2s\n  timeout client 30s\n"
        "  timeout server 30s\n"
        f"frontend mqtt\n  bind 127.0.0.1:{front}\n  default_backend edges\n"
        f"backend edges\n  server edge1 127.0.0.1:{edge_port} send-proxy-v2\n"
    )
    log = workdir / "haproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", front)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"haproxy did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield front
    finally:
        end(proc, grace=5)


async def connect_from(
    port: int, client_id: str, *, local: str, preamble: bytes = b""
) -> RawClient:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    writer.write(preamble)
    client = RawClient(reader, writer, 4)
    await client.send(
        Connect(client_id=client_id, protocol_version=4, clean_start=True, keepalive=60)
    )
    connack = await client.expect(ConnAck, 10)
    assert connack.reason_code == 0, connack
    return client


def spans_named(trace_dir: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for path in trace_dir.glob("*.jsonl*"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line).get("resourceSpans", []):
                for ss in rs.get("scopeSpans", []):
                    found += [s for s in ss.get("spans", []) if s["name"] == name]
    return found


def attributes(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def test_an_edge_behind_haproxy_sees_logs_and_traces_the_clients_address(
    hexmq_cluster: Callable[..., Any], cluster_prerequisites: None, tmp_path: Path
) -> None:
    cluster = hexmq_cluster(nodes=1)
    trace_dir = tmp_path / "traces"
    args = ["--proxy-protocol", "tcp", "--trace-dir", str(trace_dir)]
    with (
        edge_process(cluster, tmp_path, args) as edge,
        haproxy_in_front_of(edge.port, tmp_path) as front,
    ):

        async def scenario() -> None:
            client = await connect_from(front, "behind-haproxy", local=CLIENT_ADDR)
            # A reserved packet type: the edge closes this client and logs its address.
            await client.send_bytes(b"\x00\x00")
            assert await client.wait_closed(10) == []
            await client.close()

        asyncio.run(scenario())
        eventually_sync(
            lambda: f"closing {CLIENT_ADDR}:" in edge.log_text(), 20, "the edge logged the client"
        )
    connects = [attributes(s) for s in spans_named(trace_dir, "mqtt.connect")]
    assert [(a["client.address"], int(a["client.port"]) > 0) for a in connects] == [
        (CLIENT_ADDR, True)
    ]


def test_a_v1_header_is_taken_and_a_connection_without_one_is_closed_alone(
    hexmq_cluster: Callable[..., Any], cluster_prerequisites: None, tmp_path: Path
) -> None:
    cluster = hexmq_cluster(nodes=1)
    with edge_process(cluster, tmp_path, ["--proxy-protocol", "tcp"]) as edge:

        async def scenario() -> None:
            header = b"PROXY TCP4 198.51.100.9 192.0.2.1 40001 1883\r\n"
            proxied = await connect_from(edge.port, "v1-client", local="127.0.0.1", preamble=header)
            # A client that skips the balancer: closed at its first byte, nothing else is.
            reader, writer = await asyncio.open_connection("127.0.0.1", edge.port)
            writer.write(b"\x10\x10\x00\x04MQTT\x04\x02\x00\x3c\x00\x04abcd")
            assert await asyncio.wait_for(reader.read(), 10) == b""
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            await proxied.send(PingReq())
            await proxied.expect(PingResp, 10)
            await proxied.send_bytes(b"\x00\x00")  # malformed: closed, logged with its address
            assert await proxied.wait_closed(10) == []
            await proxied.close()

        asyncio.run(scenario())
        eventually_sync(
            lambda: "closing 198.51.100.9:40001 (v1-client)" in edge.log_text(), 20, "logged"
        )
    lines = [ln for ln in edge.log_text().splitlines() if "PROXY protocol header" in ln]
    assert len(lines) == 1, lines
    assert "closing 127.0.0.1:" in lines[0]
    assert (
        "on --listen: malformed PROXY protocol header: no PROXY protocol header: the " in lines[0]
    )
