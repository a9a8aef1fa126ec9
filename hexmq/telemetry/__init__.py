"""Telemetry for every hexmq service: traces, trace context propagation, metrics, JSON logs.

Setup, once per process (edge, partition, membership)::

    from hexmq import telemetry as tm

    if tm.json_logs_requested():                      # HEXMQ_LOG_FORMAT=json
        tm.setup_json_logging("edge", node_id, level)
    tracing = tm.setup_tracing("edge", node_id, trace_dir=trace_dir)   # trace_dir may be None
    tm.METRICS.bind_tracing(tracing)                  # hexmq_spans_dropped_total
    server = tm.start_metrics_server(host, port)      # GET http://host:port/metrics
    ...
    server.close()
    await asyncio.to_thread(tracing.shutdown)         # flushes; blocks, so not on the loop

API (all importable from here):

    setup_tracing(service: str, node_id: str, *, trace_dir: Path | None = None,
                  trace_file_max_bytes: int = 64 MiB, trace_file_backups: int = 8) -> Tracing
    Tracing.tracer: opentelemetry.trace.Tracer       Tracing.enabled: bool
    Tracing.span(name, *, context=None, kind=None, attributes=None)
        -> ContextManager[Span]                       the per-message entry point (see below)
    Tracing.dropped_spans: int, Tracing.failed_spans: int
    Tracing.force_flush(timeout_s: float = 10.0) -> bool; Tracing.shutdown(timeout_s=10.0)
    inject(carrier: MutableMapping[str, str], context: Context | None = None) -> None
    extract(carrier: Mapping[str, str]) -> Context
    outgoing_metadata(metadata=()) -> tuple[tuple[str, str | bytes], ...]
    context_from_metadata(metadata) -> Context;  TraceContextClientInterceptor()
    SpanName.*, SPAN_KIND[name], Attr.*, client_id_hash(cid: str | bytes) -> str
    messaging_attributes(*, operation, topic, message_id, body_size, qos, client_id,
                         subscriber_id, node, partition, epoch, seq) -> dict;
    partition_attributes(*, node, partition, epoch, seq, follower) -> dict
    METRICS: Metrics;  start_metrics_server(host: str, port: int, *, registry=None)
        -> MetricsServer (.port, .close())
    setup_json_logging(service: str, node_id: str, level: str = "INFO", *, stream=None) -> None
    json_logs_requested(env=os.environ) -> bool

Traces: resource service.name="hexmq-<service>", service.namespace="hexmq", service.version,
service.instance.id="<service>-<node_id>-<pid>", hexmq.node. Sampler from OTEL_TRACES_SAMPLER /
OTEL_TRACES_SAMPLER_ARG (default parentbased_traceidratio, ratio 1.0: the edge decides, later
hops follow the sampled flag). Exporters: OTLP/gRPC when OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is
set (OTEL_TRACES_EXPORTER=none turns it off; the exporter's other standard variables apply);
OTLP JSON lines (the Collector file exporter's format, ids in hex, see otlpjson) to
trace_dir/"<service>-<node_id>.jsonl", rotated by size into "<service>-<node_id>.jsonl.NNNNNN".
Each exporter has its own batch queue, sized by OTEL_BSP_MAX_QUEUE_SIZE (default 65536;
OTEL_BSP_MAX_EXPORT_BATCH_SIZE and OTEL_BSP_SCHEDULE_DELAY are honoured too). A full queue drops
the span and counts it (`tracing.dropped_spans`, exact; a warning on the first drop and every
1000th); spans in failed exports count in `tracing.failed_spans`. No exporter (or
OTEL_SDK_DISABLED=true): OpenTelemetry's no-op tracer. The provider is not made global.

Spans::

    with tracing.span(SpanName.PUBLISH) as span:     # kind from SPAN_KIND
        if span.is_recording():                      # False when unsampled or tracing is off
            span.set_attributes(messaging_attributes(
                operation="publish", topic=topic, qos=qos, client_id=cid, node=node_id))
        for msg in frame:
            inject(msg.trace.carrier)                 # per stream message, not per stream

    # the receiving side of a stream message continues its trace
    with tracing.span(SpanName.APPEND, context=extract(msg.trace.carrier)) as span: ...

    # a span that outlives the block (partition.replicate until the follower acks):
    span = tracing.tracer.start_span(SpanName.REPLICATE, kind=SPAN_KIND[SpanName.REPLICATE])
    ...; span.end()                                   # parent: the span current at start

Cost (measured on the dev machine, one core): tracing off, `tracing.span()` 0.24 us and
`tracer.start_as_current_span()` 3.3 us (it still sets the current context); unsampled (ratio 0)
about 7 us; sampled about 30 us on the calling thread plus about 35 us (OTLP encoding) or 80 us
(OTLP JSON file) on the export thread, which shares the GIL. So: use `tracing.span()` on
per-message paths, build attributes only under `span.is_recording()`, and sample at a low ratio
(e.g. OTEL_TRACES_SAMPLER_ARG=0.01) under load. `inject` writes nothing when there is no valid
span, so stream messages stay small when tracing is off.

Unary gRPC calls: `metadata=outgoing_metadata()` or a `TraceContextClientInterceptor` on the
grpc.aio channel; the server starts its span with
`context=context_from_metadata(context.invocation_metadata())`.
`client_id_hash(cid)` is the only form a client id may take in telemetry.

Metrics: `METRICS` holds every hexmq_ metric, so services only `.inc()`/`.set()`/`.observe()`:
connections, messages_in/messages_out{qos} (and `messages_in_by_qos[q]` children for the hot
path), queue_depth{queue}, replication_lag{follower}, partition_roles{role}, view_epoch,
failovers{kind}, view_changes, partitions_offline, partitions_under_replicated (the
membership agent's account of agreed views), rejected_packets{packet,reason_code} (via
`METRICS.reject(packet, code)`),
grpc_latency{method,side} (histogram, seconds), and hexmq_spans_dropped_total{reason} once
`bind_tracing` is called; plus process_* and python_* metrics. Labels never hold client ids
or topics.

Logs: `setup_json_logging` writes one JSON object per line to stderr (ts, level, service, node,
logger, msg, trace_id/span_id inside a span, exc, extra fields).
"""

from __future__ import annotations

from hexmq.telemetry.batch import CountingBatchSpanProcessor
from hexmq.telemetry.logs import JsonFormatter, json_logs_requested, setup_json_logging
from hexmq.telemetry.metrics import METRICS, Metrics, MetricsServer, start_metrics_server
from hexmq.telemetry.names import (
    SPAN_KIND,
    Attr,
    SpanName,
    client_id_hash,
    messaging_attributes,
    partition_attributes,
)
from hexmq.telemetry.otlpjson import (
    RotatingOtlpJsonFileExporter,
    spans_to_otlp_json,
    spans_to_otlp_json_line,
)
from hexmq.telemetry.propagation import (
    TraceContextClientInterceptor,
    context_from_metadata,
    extract,
    inject,
    outgoing_metadata,
)
from hexmq.telemetry.tracing import Tracing, sampler_from_env, setup_tracing

__all__ = [
    "METRICS",
    "SPAN_KIND",
    "Attr",
    "CountingBatchSpanProcessor",
    "JsonFormatter",
    "Metrics",
    "MetricsServer",
    "RotatingOtlpJsonFileExporter",
    "SpanName",
    "TraceContextClientInterceptor",
    "Tracing",
    "client_id_hash",
    "context_from_metadata",
    "extract",
    "inject",
    "json_logs_requested",
    "messaging_attributes",
    "outgoing_metadata",
    "partition_attributes",
    "sampler_from_env",
    "setup_json_logging",
    "setup_tracing",
    "spans_to_otlp_json",
    "spans_to_otlp_json_line",
    "start_metrics_server",
]
