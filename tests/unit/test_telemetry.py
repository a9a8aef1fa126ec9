"""hexmq.telemetry: OTLP export to a real receiver, propagation across services and gRPC, the
OTLP JSON file exporter and its rotation, exact drop counting, metrics over HTTP, JSON logs."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, get_current_span

from hexmq import telemetry as tm
from hexmq.api.common.v1 import common_pb2
from hexmq.telemetry import Attr, SpanName
from hexmq.telemetry.logs import _JsonHandler
from hexmq.telemetry.tracing import OTLP_EXPORTER_LOGGER, OTLP_LOG_GATE
from tests.support.otlp_receiver import OtlpReceiver

HEX32 = set("0123456789abcdef")
TIMEOUT = 10.0


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set exactly the variables they mean: none of the developer's OTEL_* leak in."""
    for name in list(os.environ):
        if name.startswith("OTEL_") or name == "HEXMQ_LOG_FORMAT":
            monkeypatch.delenv(name)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.endpoint)
        yield r


def is_hex(value: str, length: int) -> bool:
    return len(value) == length and set(value) <= HEX32


def recording_tracer() -> Any:
    """A tracer whose spans record and have ids, exporting nowhere."""
    return TracerProvider(shutdown_on_exit=False).get_tracer("test")


# --- OTLP/gRPC export ------------------------------------------------------------------------


def test_otlp_export_carries_resource_attributes_and_parentage(receiver: OtlpReceiver) -> None:
    tracing = tm.setup_tracing("edge", "n1")
    try:
        assert tracing.enabled
        tracer = tracing.tracer
        with tracing.span(SpanName.PUBLISH) as root:  # kind from SPAN_KIND: SERVER
            assert root.is_recording()
            root.set_attributes(
                tm.messaging_attributes(
                    operation="publish", topic="a/b", qos=1, client_id="client-1", node="n1"
                )
            )
            with tracer.start_as_current_span(SpanName.ROUTE):
                for partition in (3, 7):
                    with tracer.start_as_current_span(
                        SpanName.APPEND,
                        attributes=tm.partition_attributes(partition=partition, epoch=2),
                    ):
                        pass
        assert tracing.force_flush(TIMEOUT)
        spans = receiver.wait_for_spans(4, TIMEOUT)
    finally:
        tracing.shutdown()

    assert len(spans) == 4
    (span,) = [s for s in spans if s.name == SpanName.PUBLISH]
    assert span.resource["service.name"] == "hexmq-edge"
    assert span.resource["hexmq.node"] == "n1"
    assert span.resource["service.instance.id"].startswith("edge-n1-")
    assert span.scope == "hexmq.edge"
    assert span.kind == 2  # SPAN_KIND_SERVER
    assert span.attributes == {
        "messaging.system": "mqtt",
        "messaging.operation.name": "publish",
        "messaging.operation.type": "send",
        "messaging.destination.name": "a/b",
        "hexmq.qos": 1,
        "hexmq.client_id_hash": tm.client_id_hash("client-1"),
        "hexmq.node": "n1",
    }
    assert "client-1" not in json.dumps([s.attributes for s in spans])

    (tree,) = receiver.trace_tree(span.trace_id)
    assert tree.span.parent_span_id is None
    assert [c.span.name for c in tree.children] == [SpanName.ROUTE], tree.render()
    appends = tree.children[0].children
    assert [a.span.name for a in appends] == [SpanName.APPEND] * 2, tree.render()
    assert sorted(a.span.attributes[Attr.PARTITION] for a in appends) == [3, 7]
    assert all(a.span.attributes[Attr.EPOCH] == 2 for a in appends)


def test_context_in_a_stream_message_joins_two_services_into_one_trace(
    receiver: OtlpReceiver,
) -> None:
    edge = tm.setup_tracing("edge", "n1")
    partition = tm.setup_tracing("partition", "n2")
    try:
        with edge.tracer.start_as_current_span(SpanName.PUBLISH) as publish:
            frame = [common_pb2.Message(topic=f"t/{i}", qos=1) for i in range(3)]
            for msg in frame:
                tm.inject(msg.trace.carrier)  # the proto map field itself
        wire = [m.SerializeToString() for m in frame]

        for raw in wire:  # the partition service, reading a batched stream frame
            msg = common_pb2.Message.FromString(raw)
            ctx = tm.extract(msg.trace.carrier)
            with partition.tracer.start_as_current_span(SpanName.APPEND, context=ctx):
                replicate = partition.tracer.start_span(SpanName.REPLICATE)
                replicate.end()  # ended later than the block in real code: no current span
        assert edge.force_flush(TIMEOUT)
        assert partition.force_flush(TIMEOUT)
        spans = receiver.wait_for_spans(7, TIMEOUT)
    finally:
        edge.shutdown()
        partition.shutdown()

    trace_id = format(publish.get_span_context().trace_id, "032x")
    assert {s.trace_id for s in spans} == {trace_id}
    (tree,) = receiver.trace_tree(trace_id)
    assert tree.span.name == SpanName.PUBLISH
    assert tree.span.resource["service.name"] == "hexmq-edge"
    assert len(tree.children) == 3, tree.render()
    for append in tree.children:
        assert append.span.name == SpanName.APPEND
        assert append.span.resource["service.name"] == "hexmq-partition"
        assert [c.span.name for c in append.children] == [SpanName.REPLICATE], tree.render()


def test_unsampled_trace_is_not_exported_but_its_context_still_travels(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    edge = tm.setup_tracing("edge", "n1")
    try:
        with edge.tracer.start_as_current_span(SpanName.PUBLISH) as span:
            assert not span.is_recording()
            carrier: dict[str, str] = {}
            tm.inject(carrier)
        # The flags travel with the sampled bit (0x01) clear, so the next hop does not record.
        assert int(carrier["traceparent"].rsplit("-", 1)[1], 16) & 0x01 == 0
        with edge.tracer.start_as_current_span(
            SpanName.APPEND, context=tm.extract(carrier)
        ) as child:
            assert not child.is_recording()
        # A sampled parent from upstream is followed even at ratio 0 (parent based).
        with recording_tracer().start_as_current_span("upstream"):
            tm.inject(sampled := {})
        with edge.tracer.start_as_current_span(SpanName.APPEND, context=tm.extract(sampled)):
            pass
        assert edge.force_flush(TIMEOUT)
        spans = receiver.wait_for_spans(1, TIMEOUT)
    finally:
        edge.shutdown()
    assert [s.name for s in spans] == [SpanName.APPEND]


def test_sampler_from_env() -> None:
    assert "ParentBased" in tm.sampler_from_env({}).get_description()
    assert "1.0" in tm.sampler_from_env({}).get_description()
    ratio = tm.sampler_from_env({"OTEL_TRACES_SAMPLER_ARG": "0.25"}).get_description()
    assert "ParentBased" in ratio
    assert "0.25" in ratio
    plain = tm.sampler_from_env(
        {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    )
    assert plain.get_description().startswith("TraceIdRatioBased")
    assert tm.sampler_from_env({"OTEL_TRACES_SAMPLER": "always_off"}).get_description() == (
        "AlwaysOffSampler"
    )


def test_without_exporters_tracing_is_a_noop_that_passes_context_through() -> None:
    tracing = tm.setup_tracing("edge", "n1")
    assert not tracing.enabled
    with tracing.tracer.start_as_current_span(SpanName.PUBLISH) as span:
        assert not span.is_recording()
        carrier: dict[str, str] = {}
        tm.inject(carrier)
    assert carrier == {}  # no span, nothing written: stream messages stay small
    with tracing.span(SpanName.PUBLISH) as span:
        assert not span.is_recording()
        tm.inject(carrier)
    assert carrier == {}

    with recording_tracer().start_as_current_span("upstream") as upstream:
        tm.inject(incoming := {})
    with tracing.tracer.start_as_current_span(SpanName.APPEND, context=tm.extract(incoming)):
        tm.inject(outgoing := {})
    assert outgoing == incoming  # a hop without tracing does not cut the trace
    assert upstream.get_span_context().is_valid
    assert tracing.dropped_spans == 0
    tracing.shutdown()


def test_otel_sdk_disabled_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    tracing = tm.setup_tracing("edge", "n1", trace_dir=tmp_path)
    assert not tracing.enabled
    assert list(tmp_path.iterdir()) == []


# --- unary gRPC: context in metadata ---------------------------------------------------------


async def test_unary_grpc_call_carries_context_in_metadata() -> None:
    seen: list[Context] = []

    async def echo(request: bytes, context: Any) -> bytes:
        seen.append(tm.context_from_metadata(context.invocation_metadata()))
        return request

    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tracer = recording_tracer()
    try:
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{port}", interceptors=[tm.TraceContextClientInterceptor()]
        ) as channel:
            call = channel.unary_unary("/test.Echo/Echo")
            with tracer.start_as_current_span("caller") as caller:
                assert await call(b"x", timeout=TIMEOUT) == b"x"
            await call(b"y", timeout=TIMEOUT)  # outside any span: no context sent
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/test.Echo/Echo")
            with tracer.start_as_current_span("caller2") as caller2:
                metadata = tm.outgoing_metadata((("x-other", "1"),))
                assert await call(b"z", timeout=TIMEOUT, metadata=metadata) == b"z"
    finally:
        await server.stop(None)

    assert len(seen) == 3
    for ctx, parent in ((seen[0], caller), (seen[2], caller2)):
        remote = get_current_span(ctx).get_span_context()
        assert remote.is_remote
        assert remote.trace_id == parent.get_span_context().trace_id
        assert remote.span_id == parent.get_span_context().span_id
    assert not get_current_span(seen[1]).get_span_context().is_valid


# --- OTLP JSON files -------------------------------------------------------------------------


def read_lines(paths: Sequence[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in paths for line in p.read_text().splitlines()]


def file_spans(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**span, "_resource": rs["resource"]}
        for doc in docs
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
    ]


def test_file_exporter_writes_collector_style_otlp_json(tmp_path: Path) -> None:
    tracing = tm.setup_tracing("partition", "n2", trace_dir=tmp_path)
    try:
        with tracing.tracer.start_as_current_span(
            SpanName.APPEND, kind=SpanKind.SERVER, attributes={Attr.PARTITION: 5}
        ) as parent:
            child = tracing.tracer.start_span(SpanName.REPLICATE, links=[])
            child.end()
        assert tracing.force_flush(TIMEOUT)
    finally:
        tracing.shutdown()

    (path,) = tmp_path.glob("*.jsonl*")
    assert path.name == "partition-n2.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 1  # one ExportTraceServiceRequest per line
    (doc,) = read_lines([path])
    spans = {s["name"]: s for s in file_spans([doc])}
    append, replicate = spans[SpanName.APPEND], spans[SpanName.REPLICATE]
    ctx = parent.get_span_context()
    assert append["traceId"] == format(ctx.trace_id, "032x")
    assert append["spanId"] == format(ctx.span_id, "016x")
    assert "parentSpanId" not in append  # root: left out, as ProtoJSON leaves defaults out
    assert replicate["parentSpanId"] == append["spanId"]
    assert is_hex(replicate["spanId"], 16)
    assert is_hex(replicate["traceId"], 32)
    assert append["kind"] == 2  # enums as integers
    assert isinstance(append["startTimeUnixNano"], str)  # 64-bit integers as strings
    assert append["attributes"] == [{"key": "hexmq.partition", "value": {"intValue": "5"}}]
    resource = {a["key"]: a["value"] for a in append["_resource"]["attributes"]}
    assert resource["service.name"] == {"stringValue": "hexmq-partition"}
    assert resource["hexmq.node"] == {"stringValue": "n2"}

    # And it is a valid ExportTraceServiceRequest once the ids are base64 again.
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    request = json_format.ParseDict(doc, ExportTraceServiceRequest())
    assert len(request.resource_spans[0].scope_spans[0].spans) == 2


def test_file_exporter_rotates_by_size_and_keeps_n_files(tmp_path: Path) -> None:
    tracing = tm.setup_tracing(
        "edge", "n1", trace_dir=tmp_path, trace_file_max_bytes=3000, trace_file_backups=3
    )
    names = []
    try:
        for i in range(40):
            with tracing.tracer.start_as_current_span(SpanName.PUBLISH) as span:
                span.set_attribute("i", i)
            names.append(i)
            assert tracing.force_flush(TIMEOUT)  # one line per span
    finally:
        tracing.shutdown()

    exporter = tracing.processors[0].exporter
    assert isinstance(exporter, tm.RotatingOtlpJsonFileExporter)
    rotated = exporter.rotated_files()
    assert len(rotated) == 3
    current = tmp_path / "edge-n1.jsonl"
    assert sorted(tmp_path.glob("*.jsonl*")) == sorted([*rotated, current])
    assert [p.name for p in rotated] == sorted(p.name for p in rotated)  # names sort by age
    for p in [*rotated, current]:
        assert p.stat().st_size <= 3000
    # The kept files hold the newest spans, in order, with nothing missing between them.
    kept = [
        s["attributes"][0]["value"]["intValue"] for s in file_spans(read_lines([*rotated, current]))
    ]
    assert [int(i) for i in kept] == list(range(40 - len(kept), 40))
    assert len(kept) >= 4

    # A restarted process continues the numbering instead of reusing a name.
    again = tm.RotatingOtlpJsonFileExporter(current, max_bytes=1, backups=10)
    before = rotated[-1].name
    span = recording_tracer().start_span("x")
    span.end()
    again.export([span])
    again.export([span])
    again.shutdown()
    assert again.rotated_files()[-1].name > before


# --- drops are counted -----------------------------------------------------------------------


class BlockingExporter(SpanExporter):
    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.exported: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        assert self.release.wait(TIMEOUT)
        self.exported += spans
        return SpanExportResult.SUCCESS


def test_full_queue_drops_are_counted_exactly_and_logged_per_n(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = BlockingExporter()
    processor = tm.CountingBatchSpanProcessor(
        exporter,
        name="test",
        max_queue_size=4,
        max_export_batch_size=4,
        schedule_delay_s=60,
        warn_every=2,
    )
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")

    def spans(n: int) -> None:
        for _ in range(n):
            tracer.start_span("s").end()

    with caplog.at_level(logging.WARNING, logger="hexmq.telemetry.batch"):
        spans(4)  # a full batch wakes the worker, which takes all 4 and blocks in export
        assert exporter.entered.wait(TIMEOUT)
        spans(4)  # fills the queue again
        assert processor.dropped_spans == 0
        spans(3)  # no room: dropped
        assert processor.dropped_spans == 3
        drop_lines = [r for r in caplog.records if "dropped so far" in r.getMessage()]
        assert len(drop_lines) == 2  # drops 1 and 3: one line per 2 drops
        exporter.release.set()
        provider.shutdown()
    assert len(exporter.exported) == 8
    assert processor.exported_spans == 8
    assert processor.dropped_spans == 3


def test_tracing_counts_every_span_as_exported_or_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "8")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    tracing = tm.setup_tracing("edge", "n1", trace_dir=tmp_path)
    (processor,) = tracing.processors
    assert processor.max_queue_size == 8
    assert processor.max_export_batch_size == 4
    metrics = tm.Metrics()
    metrics.bind_tracing(tracing)
    n = 3000
    try:
        for _ in range(n):
            tracing.tracer.start_span(SpanName.PUBLISH).end()
    finally:
        tracing.shutdown()
    written = len(file_spans(read_lines([tmp_path / "edge-n1.jsonl"])))
    assert written == processor.exported_spans
    assert written + tracing.dropped_spans == n
    assert tracing.dropped_spans > 0  # 3000 spans through an 8-span queue

    server = tm.start_metrics_server("127.0.0.1", 0, registry=metrics.registry)
    try:
        with urllib.request.urlopen(
            f"http://127.0.0.1:{server.port}/metrics", timeout=TIMEOUT
        ) as r:
            text = r.read().decode()
    finally:
        server.close()
    assert (
        f'hexmq_spans_dropped_total{{reason="queue_full"}} {float(tracing.dropped_spans)}' in text
    )
    assert 'hexmq_spans_dropped_total{reason="export_failed"} 0.0' in text


def test_failed_exports_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    class Failing(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.FAILURE

    processor = tm.CountingBatchSpanProcessor(Failing(), name="failing", schedule_delay_s=60)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    for _ in range(5):
        provider.get_tracer("t").start_span("s").end()
    assert processor.force_flush(int(TIMEOUT * 1000))
    provider.shutdown()
    assert processor.failed_spans == 5
    assert processor.dropped_spans == 0


# --- names, metrics, logs --------------------------------------------------------------------


def test_client_id_hash_is_short_stable_and_not_the_id() -> None:
    h = tm.client_id_hash("sensor-42")
    assert is_hex(h, 16)
    assert h == tm.client_id_hash(b"sensor-42")
    assert h == "ff5f6ba6804e206e"  # pinned: trace readers rely on it never changing
    assert h != tm.client_id_hash("sensor-43")
    attrs = tm.messaging_attributes(client_id="sensor-42", subscriber_id="app", operation="ack")
    assert "sensor-42" not in attrs.values()
    assert "app" not in attrs.values()
    assert attrs[Attr.SUBSCRIBER_HASH] == tm.client_id_hash("app")
    assert attrs[Attr.OPERATION_TYPE] == "settle"


def test_span_name_contract() -> None:
    assert {
        SpanName.PUBLISH,
        SpanName.ROUTE,
        SpanName.APPEND,
        SpanName.REPLICATE,
        SpanName.ACK,
        SpanName.DELIVER,
        SpanName.CLIENT_ACK,
        SpanName.CONNECT,
        SpanName.SUBSCRIBE,
        SpanName.TAKEOVER,
        SpanName.FAILOVER,
        SpanName.CATCHUP,
        SpanName.MEMBERSHIP_VIEW,
    } == {
        "mqtt.publish",
        "edge.route",
        "partition.append",
        "partition.replicate",
        "partition.ack",
        "mqtt.deliver",
        "mqtt.client_ack",
        "mqtt.connect",
        "mqtt.subscribe",
        "session.takeover",
        "partition.failover",
        "partition.catchup",
        "membership.view",
    }
    assert set(tm.SPAN_KIND) == {v for k, v in vars(SpanName).items() if k.isupper()}


def test_metrics_are_served_with_bounded_labels() -> None:
    metrics = tm.Metrics()
    metrics.connections.inc(3)
    metrics.messages_in_by_qos[1].inc()
    metrics.messages_out.labels("0").inc(2)
    metrics.queue_depth.labels("delivery").set(7)
    metrics.replication_lag.labels("n2").set(12)
    metrics.partition_roles.labels("master").set(85)
    metrics.view_epoch.set(4)
    metrics.failovers.labels("failover").inc()
    metrics.view_changes.inc()
    metrics.partitions_offline.set(2)
    metrics.partitions_under_replicated.set(5)
    metrics.reject("CONNECT", 0x87)
    metrics.grpc_latency.labels("/hexmq.api.partition.v1.Partition/Open", "client").observe(0.002)
    server = tm.start_metrics_server("127.0.0.1", 0, registry=metrics.registry)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=TIMEOUT) as r:
            text = r.read().decode()
    finally:
        server.close()
    for line in (
        "hexmq_connections 3.0",
        'hexmq_messages_in_total{qos="1"} 1.0',
        'hexmq_messages_in_total{qos="2"} 0.0',
        'hexmq_messages_out_total{qos="0"} 2.0',
        'hexmq_queue_depth{queue="delivery"} 7.0',
        'hexmq_replication_lag{follower="n2"} 12.0',
        'hexmq_partition_roles{role="master"} 85.0',
        'hexmq_partition_roles{role="follower"} 0.0',
        "hexmq_view_epoch 4.0",
        'hexmq_failovers_total{kind="failover"} 1.0',
        "hexmq_view_changes_total 1.0",
        "hexmq_partitions_offline 2.0",
        "hexmq_partitions_under_replicated 5.0",
        'hexmq_rejected_packets_total{packet="CONNECT",reason_code="0x87"} 1.0',
        'hexmq_grpc_latency_seconds_bucket{le="0.0025",method="/hexmq.api.partition.v1.'
        'Partition/Open",side="client"} 1.0',
        "process_cpu_seconds_total",
    ):
        assert line in text, line
    ours = {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
    assert all(n.startswith(("hexmq_", "process_", "python_")) for n in ours), ours


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    level = root.level
    out = io.StringIO()
    tm.setup_json_logging("edge", "n1", "debug", stream=out)
    try:
        yield out
    finally:
        for handler in list(root.handlers):
            if isinstance(handler, _JsonHandler):
                root.removeHandler(handler)
        root.setLevel(level)


def test_json_logs_carry_trace_ids(json_log: io.StringIO) -> None:
    log = logging.getLogger("hexmq.edge")
    log.info("outside %s", "any span")
    with recording_tracer().start_as_current_span("s") as span:
        log.debug("inside", extra={"partition": 5})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    outside, inside, failed = (json.loads(line) for line in json_log.getvalue().splitlines())

    assert outside["msg"] == "outside any span"
    assert outside["level"] == "INFO"
    assert outside["service"] == "edge"
    assert outside["node"] == "n1"
    assert outside["logger"] == "hexmq.edge"
    assert outside["ts"].endswith("Z")
    assert "trace_id" not in outside
    ctx = span.get_span_context()
    assert inside["trace_id"] == format(ctx.trace_id, "032x")
    assert inside["span_id"] == format(ctx.span_id, "016x")
    assert inside["partition"] == 5
    assert failed["level"] == "ERROR"
    assert "ValueError: boom" in failed["exc"]
    assert failed["trace_id"] == inside["trace_id"]


def test_json_logging_is_chosen_by_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not tm.json_logs_requested()
    monkeypatch.setenv("HEXMQ_LOG_FORMAT", "json")
    assert tm.json_logs_requested()


def test_an_outage_like_the_last_one_is_told_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The exporter library drops a line like its last one within 20 s (its DuplicateFilter):
    with an OTLP exporter set up, the first line of the next outage comes through even when it
    reads like the last outage's."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    tracing = tm.setup_tracing("edge", "n1")
    caplog.set_level(logging.INFO)
    log = logging.getLogger(OTLP_EXPORTER_LOGGER)
    try:
        for _ in range(2):
            OTLP_LOG_GATE.reopen()  # (as an export that succeeds does)
            log.error("Failed to export %s to %s", "traces", "127.0.0.1:9")
            log.error("Failed to export %s to %s", "traces", "127.0.0.1:9")  # the same outage
        lines = [r for r in caplog.records if r.name == OTLP_EXPORTER_LOGGER]
        assert len(lines) == 2, [r.getMessage() for r in lines]
    finally:
        tracing.shutdown()
        OTLP_LOG_GATE.reopen()


def test_without_a_collector_the_exporter_logs_once_until_exports_work_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No Collector at the OTLP address (compose without its traces services): one warning
    from the exporter library for the outage, not one per batch; a line when exports work
    again, and the next outage is told again. The failures are counted all along."""
    with OtlpReceiver() as probe:
        endpoint = probe.endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    tracing = tm.setup_tracing("edge", "n1")
    caplog.set_level(logging.INFO)

    def exporter_lines() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == OTLP_EXPORTER_LOGGER and r.levelno >= logging.WARNING
        ]

    def one_batch() -> None:
        with tracing.span(SpanName.PUBLISH):
            pass
        tracing.force_flush()

    try:
        for _ in range(4):
            one_batch()
        assert tracing.failed_spans == 4
        assert len(exporter_lines()) == 1, exporter_lines()
        assert "further export errors are not logged" in exporter_lines()[0]
        host, _, port = endpoint.removeprefix("http://").rpartition(":")
        with OtlpReceiver(host, int(port)) as receiver:
            # The exporter's channel may still be backing off from the outage, and with a 1 s
            # export timeout it does not always retry: batches go until one arrives. (The
            # receiver's server thread records an export after answering it.)
            deadline = time.monotonic() + 20
            while not receiver.spans and time.monotonic() < deadline:
                one_batch()
                wait = time.monotonic() + 1
                while not receiver.spans and time.monotonic() < wait:
                    time.sleep(0.05)
            assert len(receiver.spans) == 1
        failed = tracing.failed_spans
        assert any(
            f"exports again, after {failed} failed export(s)" in r.getMessage()
            for r in caplog.records
        )
        assert len(exporter_lines()) == 1, exporter_lines()
        # The next outage at once: told again, though its line is like the first one (the
        # exporter library's own filter of repeated lines would have dropped it).
        one_batch()
        one_batch()
        assert tracing.failed_spans == failed + 2
        assert len(exporter_lines()) == 2, exporter_lines()
    finally:
        tracing.shutdown()
