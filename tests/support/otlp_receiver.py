"""A real OTLP/gRPC trace receiver for tests: what a Collector would get, decoded for asserts.

    with OtlpReceiver() as receiver:                # 127.0.0.1, ephemeral port
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = receiver.endpoint
        ...
        spans = receiver.wait_for_spans(3, timeout=10)
        (root,) = receiver.trace_tree(spans[0].trace_id)
        assert [c.span.name for c in root.children] == ["edge.route"]

It runs opentelemetry-proto's TraceService on a thread-pool gRPC server, so it answers whether
the test is sync or async and whether the exporter runs in this process or another. Waits are
event-driven (a condition variable), never polling sleeps; `wait_for_spans_async` waits from a
coroutine without blocking its event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


def any_value(value: common_pb2.AnyValue) -> Any:
    """An OTLP AnyValue as a plain Python value."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes(value.kvlist_value.values)
    return getattr(value, kind)


def attributes(kvs: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


@dataclass
class ReceivedSpan:
    trace_id: str  # lowercase hex, as in OTLP JSON
    span_id: str
    parent_span_id: str | None  # None for a root span
    name: str
    kind: int  # trace_pb2.Span.SpanKind value
    attributes: dict[str, Any]
    resource: dict[str, Any]
    scope: str
    status_code: int
    start_ns: int
    end_ns: int
    events: list[str]
    links: list[tuple[str, str]]  # (trace_id, span_id)

    @classmethod
    def from_proto(cls, span: trace_pb2.Span, resource: dict[str, Any], scope: str) -> ReceivedSpan:
        return cls(
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_span_id=span.parent_span_id.hex() or None,
            name=span.name,
            kind=span.kind,
            attributes=attributes(span.attributes),
            resource=resource,
            scope=scope,
            status_code=span.status.code,
            start_ns=span.start_time_unix_nano,
            end_ns=span.end_time_unix_nano,
            events=[e.name for e in span.events],
            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
        )


@dataclass
class SpanNode:
    span: ReceivedSpan
    children: list[SpanNode] = field(default_factory=list)

    def find(self, name: str) -> list[SpanNode]:
        """This node and its descendants named `name`, depth first."""
        found = [self] if self.span.name == name else []
        for child in self.children:
            found += child.find(name)
        return found

    def render(self, indent: int = 0) -> str:
        """The tree as indented names, for assertion messages."""
        lines = ["  " * indent + f"{self.span.name} [{self.span.resource.get('service.name')}]"]
        lines += [child.render(indent + 1) for child in self.children]
        return "\n".join(lines)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.receiver._add(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class OtlpReceiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port  # 0: any free port, known once started
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.spans: list[ReceivedSpan] = []
        self._cond = threading.Condition()
        self._server: Any = None

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT: http:// tells the exporter to use plaintext."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> OtlpReceiver:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), server)
        self.port = server.add_insecure_port(f"{self.host}:{self.port}")
        server.start()
        self._server = server
        return self

    def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait(grace + 5)
            self._server = None

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _add(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                scope = scope_spans.scope.name
                received += [ReceivedSpan.from_proto(s, resource, scope) for s in scope_spans.spans]
        with self._cond:
            self.requests.append(request)
            self.spans += received
            self._cond.notify_all()

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float
    ) -> list[ReceivedSpan]:
        """Block until predicate(spans so far) holds; AssertionError after `timeout` seconds."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.spans), timeout):
                names = [s.name for s in self.spans]
                raise AssertionError(f"timed out after {timeout}s; received {names}")
            return list(self.spans)

    def wait_for_spans(self, n: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        """At least `n` spans (all received so far are returned)."""
        return self.wait_for(lambda spans: len(spans) >= n, timeout)

    async def wait_for_spans_async(self, n: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        return await asyncio.to_thread(self.wait_for_spans, n, timeout)

    def by_name(self, name: str) -> list[ReceivedSpan]:
        with self._cond:
            return [s for s in self.spans if s.name == name]

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._cond:
            return [s for s in self.spans if s.trace_id == trace_id]

    def trace_tree(self, trace_id: str) -> list[SpanNode]:
        """The spans of a trace as trees by parent id; the roots are the spans whose parent was
        not received (normally one: the trace's root)."""
        nodes = {s.span_id: SpanNode(s) for s in self.trace(trace_id)}
        roots = []
        for node in sorted(nodes.values(), key=lambda n: n.span.start_ns):
            parent = nodes.get(node.span.parent_span_id or "")
            if parent is None:
                roots.append(node)
            else:
                parent.children.append(node)
        return roots
