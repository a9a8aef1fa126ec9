"""Tracer setup for one service process: resource, sampler, exporters, counted batching."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace import sampling as sdk_sampling
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.util.types import AttributeValue

from hexmq import __version__
from hexmq.telemetry.batch import CountingBatchSpanProcessor, ExportLogGate
from hexmq.telemetry.names import SPAN_KIND
from hexmq.telemetry.otlpjson import DEFAULT_BACKUPS, DEFAULT_MAX_BYTES

logger = logging.getLogger(__name__)

# The SDK's 2048 drops spans in any burst: one QoS 1 publish to a few subscribers is ~10 spans,
# so 2048 is ~200 publishes. 65536 spans of ~1-2 KiB each bound the queue at ~100 MiB.
DEFAULT_MAX_QUEUE_SIZE = 65536
DEFAULT_MAX_EXPORT_BATCH_SIZE = 512
# Shorter than the spec's 5 s: spans reach Jaeger and files while one still looks at them, and
# under load batches fill (and are sent) long before the timer anyway.
DEFAULT_SCHEDULE_DELAY_MS = 1000
DROP_WARN_EVERY = 1000
# The OTLP/gRPC exporter's own logger: a retry warning and an error for every failed batch.
OTLP_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"
OTLP_LOG_GATE = ExportLogGate()

# Reusable: nullcontext's enter/exit keep no state. INVALID_SPAN is non-recording and makes
# inject() write nothing.
_NO_SPAN: AbstractContextManager[trace.Span] = contextlib.nullcontext(trace.INVALID_SPAN)


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        logger.warning("%s=%r is not a positive integer; using %d", name, raw, default)
        return default
    return value


def _ratio(env: Mapping[str, str]) -> float:
    raw = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if not raw:
        return 1.0
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        logger.warning("OTEL_TRACES_SAMPLER_ARG=%r is not a ratio in [0, 1]; using 1.0", raw)
        return 1.0
    return ratio


def sampler_from_env(env: Mapping[str, str] = os.environ) -> sdk_sampling.Sampler:
    """The sampler OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG name (the spec's built-ins).

    Unset means parentbased_traceidratio, whose ratio (OTEL_TRACES_SAMPLER_ARG) defaults to 1.0:
    an edge decides for the whole trace and every later hop follows the sampled flag that
    travels in the context, so a trace is never cut in the middle.
    """
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_traceidratio"
    if name == "always_on":
        return sdk_sampling.ALWAYS_ON
    if name == "always_off":
        return sdk_sampling.ALWAYS_OFF
    if name == "traceidratio":
        return sdk_sampling.TraceIdRatioBased(_ratio(env))
    if name == "parentbased_always_on":
        return sdk_sampling.ParentBased(sdk_sampling.ALWAYS_ON)
    if name == "parentbased_always_off":
        return sdk_sampling.ParentBased(sdk_sampling.ALWAYS_OFF)
    if name != "parentbased_traceidratio":
        logger.warning(
            "OTEL_TRACES_SAMPLER=%r is not supported; using parentbased_traceidratio", name
        )
    return sdk_sampling.ParentBased(sdk_sampling.TraceIdRatioBased(_ratio(env)))


def otlp_endpoint_from_env(env: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP/gRPC endpoint to export to, or None when none is configured or traces are off."""
    exporters = env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporters == "none":
        return None
    if exporters not in ("", "otlp"):
        logger.warning(
            "OTEL_TRACES_EXPORTER=%r: only otlp (gRPC) and none are supported", exporters
        )
    endpoint = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )
    if not endpoint:
        return None
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or "grpc"
    )
    if protocol != "grpc":
        logger.warning("OTLP protocol %r is not supported; exporting over grpc", protocol)
    return endpoint


class Tracing:
    """A service's tracing: `tracer` to start spans with, counters, flush and shutdown.

    With no exporter configured, `tracer` is OpenTelemetry's no-op tracer and `enabled` is
    False; spans started from it are non-recording and only carry an incoming parent's context
    through (so a hop without tracing does not break a trace)."""

    def __init__(
        self,
        *,
        service: str,
        node_id: str,
        provider: TracerProvider | None,
        processors: list[CountingBatchSpanProcessor],
    ) -> None:
        self.service = service
        self.node_id = node_id
        self.provider = provider
        self.processors = processors
        self.tracer: trace.Tracer = (
            provider.get_tracer(f"hexmq.{service}", __version__)
            if provider is not None
            else trace.NoOpTracer()
        )

    @classmethod
    def disabled(cls, service: str = "", node_id: str = "") -> Tracing:
        """Tracing that records nothing (for code built without a configured Tracing)."""
        return cls(service=service, node_id=node_id, provider=None, processors=[])

    @property
    def enabled(self) -> bool:
        """True when spans are recorded and exported somewhere."""
        return self.provider is not None

    def span(
        self,
        name: str,
        *,
        context: Context | None = None,
        kind: trace.SpanKind | None = None,
        attributes: dict[str, AttributeValue] | None = None,
    ) -> AbstractContextManager[trace.Span]:
        """`tracer.start_as_current_span(name, ...)` with the kind from SPAN_KIND by default,
        for per-message code: when tracing is off it returns a shared no-op context manager
        (~0.2 us instead of ~3 us for the no-op tracer, which still sets the current context).
        The cost of that shortcut: a process with tracing off does not pass an incoming trace
        context on. Turn tracing on or off for the whole cluster, not per service."""
        if self.provider is None:
            return _NO_SPAN
        return self.tracer.start_as_current_span(
            name,
            context=context,
            kind=kind if kind is not None else SPAN_KIND.get(name, trace.SpanKind.INTERNAL),
            attributes=attributes,
        )

    def record(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, AttributeValue],
    ) -> None:
        """A span that already happened, with its own start and end (unix ns): for events
        whose start is known only once they end (a failover, a view change)."""
        if self.provider is None:
            return
        span = self.tracer.start_span(
            name,
            kind=SPAN_KIND.get(name, trace.SpanKind.INTERNAL),
            attributes=attributes,
            start_time=start_ns,
        )
        span.end(end_time=max(end_ns, start_ns))

    @property
    def dropped_spans(self) -> int:
        """Spans lost because an export queue was full (or closed), over all exporters."""
        return sum(p.dropped_spans for p in self.processors)

    @property
    def failed_spans(self) -> int:
        """Spans lost because their export failed (collector down, disk full), over all
        exporters."""
        return sum(p.failed_spans for p in self.processors)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Export every span ended so far (failures count in failed_spans); False if
        `timeout_s` ran out first. Blocks: from asyncio code call it via `asyncio.to_thread`."""
        # Every processor flushes even when an earlier one timed out (all() would stop early).
        results = [p.force_flush(int(timeout_s * 1000)) for p in self.processors]
        return all(results)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Flush and stop every exporter, allowing each `timeout_s` (blocking, like
        force_flush); spans still queued then count as dropped. Idempotent."""
        for p in self.processors:
            p.shutdown(int(timeout_s * 1000))
        if self.provider is not None:
            self.provider.shutdown()


def setup_tracing(
    service: str,
    node_id: str,
    *,
    trace_dir: Path | None = None,
    trace_file_max_bytes: int = DEFAULT_MAX_BYTES,
    trace_file_backups: int = DEFAULT_BACKUPS,
) -> Tracing:
    """Tracing for `service` ("edge", "partition", "membership") on node `node_id`.

    Exports by OTLP/gRPC when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT
    is set (unless OTEL_TRACES_EXPORTER=none), and as OTLP JSON lines to
    trace_dir/"{service}-{node_id}.jsonl" when trace_dir is given. Neither, or
    OTEL_SDK_DISABLED=true: a no-op tracer. The provider is not made the global one: the
    service passes `tracing.tracer` to what it starts, which lets tests run several "services"
    in one process."""
    env = os.environ
    exporters: list[tuple[str, SpanExporter]] = []
    disabled = env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    endpoint = None if disabled else otlp_endpoint_from_env(env)
    if endpoint is not None:
        # Imported here: it pulls in the gRPC exporter stack, which a no-op setup does not need.
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # The exporter reads the rest of its standard variables itself (insecure, headers,
        # certificates, compression, timeout); "http://host:port" means plaintext.
        exporters.append(("otlp", OTLPSpanExporter(endpoint=endpoint)))
        # One line per outage from the exporter library, not one per batch (ExportLogGate).
        # The library's own DuplicateFilter, which runs first, drops a line like the last one
        # within the same 20 s window: the first line of an outage that began soon after the
        # last one ended was lost (test_telemetry saw it). The gate does its job and more.
        exporter_log = logging.getLogger(OTLP_EXPORTER_LOGGER)
        for duplicates in [
            f for f in exporter_log.filters if type(f).__name__ == "DuplicateFilter"
        ]:
            exporter_log.removeFilter(duplicates)
        if OTLP_LOG_GATE not in exporter_log.filters:
            exporter_log.addFilter(OTLP_LOG_GATE)
    if trace_dir is not None and not disabled:
        from hexmq.telemetry.otlpjson import RotatingOtlpJsonFileExporter

        path = Path(trace_dir) / f"{service}-{node_id}.jsonl"
        exporters.append(
            (
                "file",
                RotatingOtlpJsonFileExporter(
                    path, max_bytes=trace_file_max_bytes, backups=trace_file_backups
                ),
            )
        )
    if not exporters:
        return Tracing(service=service, node_id=node_id, provider=None, processors=[])

    resource = Resource.create(
        {
            "service.name": f"hexmq-{service}",
            "service.namespace": "hexmq",
            "service.version": __version__,
            # Unique per process run, so Jaeger tells a restarted service from its predecessor;
            # hexmq.node is the stable per-node key to group by.
            "service.instance.id": f"{service}-{node_id}-{os.getpid()}",
            "hexmq.node": node_id,
        }
    )
    # shutdown_on_exit: a process that exits without calling shutdown() still flushes.
    provider = TracerProvider(sampler=sampler_from_env(env), resource=resource)
    queue_size = _env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", DEFAULT_MAX_QUEUE_SIZE)
    batch_size = _env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", DEFAULT_MAX_EXPORT_BATCH_SIZE)
    delay_ms = _env_int(env, "OTEL_BSP_SCHEDULE_DELAY", DEFAULT_SCHEDULE_DELAY_MS)
    processors = []
    for name, exporter in exporters:
        processor = CountingBatchSpanProcessor(
            exporter,
            name=f"{service}-{name}",
            max_queue_size=queue_size,
            max_export_batch_size=batch_size,
            schedule_delay_s=delay_ms / 1000,
            warn_every=DROP_WARN_EVERY,
            log_gate=OTLP_LOG_GATE if name == "otlp" else None,
        )
        provider.add_span_processor(processor)
        processors.append(processor)
    logger.info(
        "tracing on: %s; sampler %s; span queue %d",
        ", ".join(n for n, _ in exporters),
        provider.sampler.get_description(),
        queue_size,
    )
    return Tracing(service=service, node_id=node_id, provider=provider, processors=processors)
