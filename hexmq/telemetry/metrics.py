"""Prometheus metrics: defined once here, served over HTTP by each service process.

The same HTTP port answers /healthz (the process is up: 200) and /readyz (200 when the
service's readiness says so, else 503, with the reason as text): orchestrators and load
balancers probe a service where Prometheus already scrapes it (hexmq.readiness).

Every name starts with hexmq_ and every label has a small fixed set of values (QoS, role, queue
name, follower node id, reason code, gRPC method): never a client id or a topic, whose
cardinality is unbounded. A metric a service does not use stays at zero or absent.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from hexmq.node_protocol import FEATURES, ClusterProtocol
from hexmq.pacing import Linger
from hexmq.readiness import STARTING, Readiness

# gRPC calls inside a cluster take ~0.1-1 ms when well (STACK.md), seconds when a peer is gone:
# buckets from 50 us to 10 s.
GRPC_LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

PARTITION_ROLES = ("master", "follower", "catching_up")
# hexmq_limit_refusals_total's limits: the edge's, then the partition service's.
EDGE_LIMITS = (
    "topic_levels",
    "topic_length",
    "will_acl",
    "client_id",
    "session_expiry",
    "inflight",
)
PARTITION_LIMITS = (
    "queued_messages",
    "queued_bytes",
    "subscriptions",
    "retained_messages",
    "retained_bytes",
)
LIMITS = EDGE_LIMITS + PARTITION_LIMITS
QOS_LEVELS = (0, 1, 2)


class DropCounts(Protocol):
    """What the spans-dropped metric reads (hexmq.telemetry.Tracing provides it)."""

    @property
    def dropped_spans(self) -> int: ...

    @property
    def failed_spans(self) -> int: ...


class _SpansDroppedCollector:
    """Reads the tracing counters at scrape time, so span ends pay nothing for the metric."""

    def __init__(self, tracing: DropCounts) -> None:
        self.tracing = tracing

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "hexmq_spans_dropped",
            "Spans lost before export: queue_full (export queue full or closed), "
            "export_failed (the exporter failed, e.g. collector unreachable)",
            labels=["reason"],
        )
        family.add_metric(["queue_full"], self.tracing.dropped_spans)
        family.add_metric(["export_failed"], self.tracing.failed_spans)
        yield family


class Metrics:
    """The hexmq metrics in one registry. Services use the module's `METRICS`; tests may make
    their own (a fresh registry each)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            # The process metrics (CPU, memory, fds, GC) that prometheus_client's default
            # registry carries; ours is separate so that tests can make as many as they like.
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
        self.registry = registry
        r = registry
        self.connections = Gauge(
            "hexmq_connections", "MQTT client connections open on this edge", registry=r
        )
        self.messages_in = Counter(
            "hexmq_messages_in",
            "PUBLISH packets received from clients, by QoS",
            ["qos"],
            registry=r,
        )
        self.messages_out = Counter(
            "hexmq_messages_out",
            "PUBLISH packets sent to clients, by QoS",
            ["qos"],
            registry=r,
        )
        # Children resolved once: `.labels()` takes a lock and a dict lookup on every call,
        # indexing a tuple does not. Also makes every QoS series exist (at 0) from the start.
        self.messages_in_by_qos = tuple(self.messages_in.labels(str(q)) for q in QOS_LEVELS)
        self.messages_out_by_qos = tuple(self.messages_out.labels(str(q)) for q in QOS_LEVELS)
        self.queue_depth = Gauge(
            "hexmq_queue_depth",
            "Items waiting in a named internal queue (a fixed set per service, e.g. "
            "partition_link, delivery, replication, storage)",
            ["queue"],
            registry=r,
        )
        self.batch_interval = Gauge(
            "hexmq_batch_interval_seconds",
            "The batching stages' interval now: --batch-interval-us, raised towards "
            "--batch-interval-max-us while the machine's cores are short (hexmq/pacing.py)",
            registry=r,
        )
        self.replication_lag = Gauge(
            "hexmq_replication_lag",
            "Writes a follower has not acknowledged yet, over the partitions this node masters",
            ["follower"],
            registry=r,
        )
        self.partition_roles = Gauge(
            "hexmq_partition_roles",
            "Partition replicas on this node by role",
            ["role"],
            registry=r,
        )
        for role in PARTITION_ROLES:
            self.partition_roles.labels(role).set(0)
        self.view_epoch = Gauge(
            "hexmq_view_epoch", "Epoch of the cluster view this process acts on", registry=r
        )
        self.dropped_messages = Counter(
            "hexmq_dropped_messages",
            "Messages not delivered to a session by the broker's choice, by reason "
            "(queue_full: a session's queue was at --max-queued-messages)",
            ["reason"],
            registry=r,
        )
        self.resent_publishes = Counter(
            "hexmq_resent_publishes",
            "QoS 1 publishes an edge sent again (after a failover or a link outage) that the "
            "master had written already: answered without writing them twice",
            registry=r,
        )
        # The membership agent's account of agreed view changes (every agent counts every
        # change it sees, so sum one node's series, not the cluster's).
        self.failovers = Counter(
            "hexmq_failovers",
            "Partitions that changed hands in agreed views, by kind (failover: the master was "
            "lost; handover: moved while alive; offline: no in-sync replica left; restored: an "
            "offline partition got a master again)",
            ["kind"],
            registry=r,
        )
        self.view_changes = Counter(
            "hexmq_view_changes", "Agreed cluster views this agent has seen change", registry=r
        )
        self.partitions_offline = Gauge(
            "hexmq_partitions_offline",
            "Partitions of the agreed view whose master is not a member (no in-sync replica alive)",
            registry=r,
        )
        self.partitions_under_replicated = Gauge(
            "hexmq_partitions_under_replicated",
            "Partitions of the agreed view with fewer in-sync replicas than the replication factor",
            registry=r,
        )
        self.partitions_moving = Gauge(
            "hexmq_partitions_moving",
            "Partitions of the agreed view being rebalanced (a replica catching up, a handover "
            "asked for, or a replica on a leaving node)",
            registry=r,
        )
        self.rejected_packets = Counter(
            "hexmq_rejected_packets",
            "MQTT packets refused, by packet type and reason code (hex, e.g. 0x87)",
            ["packet", "reason_code"],
            registry=r,
        )
        self.limit_refusals = Counter(
            "hexmq_limit_refusals",
            "What a resource limit turned away or lowered, by limit (issue 25; "
            "docs/operations.md, 'Bounded by default'): edge: topic_levels, topic_length, "
            "will_acl, client_id, session_expiry (a longer expiry lowered), inflight (a "
            "larger Receive Maximum lowered); partition: queued_messages, queued_bytes, "
            "subscriptions, retained_messages, retained_bytes",
            ["limit"],
            registry=r,
        )
        for limit in LIMITS:
            self.limit_refusals.labels(limit)
        self.protocol_version = Gauge(
            "hexmq_protocol_version",
            "The inter-node protocol version the cluster speaks, by the view this process acts "
            "on (the highest version every member supports)",
            registry=r,
        )
        self.protocol_features = Gauge(
            "hexmq_protocol_feature",
            "1 while the view this process acts on has this inter-node feature on (every "
            "member supports it), else 0",
            ["feature"],
            registry=r,
        )
        self.snapshot_bytes = Counter(
            "hexmq_replication_snapshot_bytes",
            "Bytes of snapshot writes (the bulk transfer of a partition) sent to followers, as "
            "sent, by encoding: plain, or zlib (the zlib-snapshots feature)",
            ["encoding"],
            registry=r,
        )
        # Issue 30 (G9, nothing silent): links that are down, and what waits on them.
        self.links_down = Gauge(
            "hexmq_links_down",
            "1 while this process's link to a peer is down, else 0, by link (edge: an edge's "
            "link to a partition service, down until it is open and its subscription index "
            "arrived; replication: a follower's stream from a master; membership: the view "
            "watch to the node's own agent) and peer node",
            ["link", "peer"],
            registry=r,
        )
        self.sessions_waiting_for_master = Gauge(
            "hexmq_sessions_waiting_for_master",
            "Live connections on this edge whose session is not attached at a master it can "
            "reach (the master is not in the view, its link is down, or the re-attach is not "
            "answered yet); past --unreachable-disconnect they are disconnected",
            registry=r,
        )
        self.unreachable_disconnects = Counter(
            "hexmq_unreachable_disconnects",
            "Connections this edge ended (5.0: DISCONNECT 0x89) because their session's master "
            "stayed unreachable for --unreachable-disconnect seconds, so that the client "
            "reconnects, possibly through another node",
            registry=r,
        )
        self.grpc_latency = Histogram(
            "hexmq_grpc_latency_seconds",
            "gRPC call latency by full method name and side (client or server)",
            ["method", "side"],
            buckets=GRPC_LATENCY_BUCKETS,
            registry=r,
        )
        # Batching stages (hexmq/pacing.py): batches sent, items in them, and the seconds they
        # waited for more to join (the linger), per stage.
        self.batches = Counter(
            "hexmq_batches", "Batches sent by a batching stage", ["stage"], registry=r
        )
        self.batched_items = Counter(
            "hexmq_batched_items",
            "Items (commands, events, entries, writes) in them",
            ["stage"],
            registry=r,
        )
        self.batch_linger = Counter(
            "hexmq_batch_linger_seconds",
            "Time batches waited for more items to join (at most the stage's interval each)",
            ["stage"],
            registry=r,
        )
        self._spans_collector: _SpansDroppedCollector | None = None
        self._lock = threading.Lock()

    def show_protocol(self, protocol: ClusterProtocol) -> None:
        """What the view this process acts on says the cluster speaks."""
        self.protocol_version.set(protocol.version)
        for feature in FEATURES:
            self.protocol_features.labels(feature).set(int(protocol.uses(feature)))

    def linger(self, stage: str) -> Linger:
        """A stage's batching counters, exported under `stage`."""
        return Linger(
            exported=(
                self.batches.labels(stage),
                self.batched_items.labels(stage),
                self.batch_linger.labels(stage),
            )
        )

    def reject(self, packet: str, reason_code: int) -> None:
        """Count a refused packet: `reject("CONNECT", 0x87)`."""
        self.rejected_packets.labels(packet, f"0x{reason_code:02x}").inc()

    def bind_tracing(self, tracing: DropCounts) -> None:
        """Export `tracing`'s span loss counters as hexmq_spans_dropped_total (once per
        process; a second call replaces the first)."""
        with self._lock:
            if self._spans_collector is not None:
                self.registry.unregister(self._spans_collector)
            self._spans_collector = _SpansDroppedCollector(tracing)
            self.registry.register(self._spans_collector)


METRICS = Metrics()


@dataclass
class MetricsServer:
    """The HTTP endpoint serving /metrics, /healthz and /readyz; `port` is the bound one
    (useful with port 0)."""

    host: str
    port: int
    _httpd: WSGIServer
    _thread: threading.Thread

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


_WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def probe_app(metrics: _WsgiApp, readiness: Callable[[], Readiness]) -> _WsgiApp:
    """/healthz and /readyz in front of the Prometheus app (which answers every other path)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            return metrics(environ, start_response)
        if path == "/healthz":
            status, body = "200 OK", "ok\n"
        else:
            answer = readiness()
            status = "200 OK" if answer.ready else "503 Service Unavailable"
            body = f"{'ready' if answer.ready else 'not ready'}: {answer.reason}\n"
        data = body.encode()
        headers = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(data))),
            ("Cache-Control", "no-store"),
        ]
        start_response(status, headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else data]

    return app


def start_metrics_server(
    host: str,
    port: int,
    *,
    registry: CollectorRegistry | None = None,
    readiness: Callable[[], Readiness] | None = None,
) -> MetricsServer:
    """Serve `registry` (default: METRICS') in Prometheus text format on http://host:port/,
    and /healthz and /readyz (`readiness` is called on the HTTP thread; default: not ready,
    "starting").

    A daemon thread answers scrapes and probes, so the service's event loop does nothing for
    them (a readiness that runs on the loop, hexmq.readiness.LoopReadiness, waits for it).
    Raises OSError if the port is taken."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    metrics = make_wsgi_app(registry if registry is not None else METRICS.registry)
    app = probe_app(metrics, readiness or (lambda: STARTING))
    httpd = make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return MetricsServer(host=host, port=httpd.server_port, _httpd=httpd, _thread=thread)
