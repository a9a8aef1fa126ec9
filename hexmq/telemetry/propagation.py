"""W3C trace context across our gRPC links: per message on batched streams, in metadata on unary
calls.

A stream carries many traces, so a gRPC interceptor (one span per stream) cannot carry them: each
stream message that starts or continues a trace has a `TraceContext trace` field whose
`carrier` map the sender fills with `inject` and the receiver reads with `extract`. Only the W3C
trace context (traceparent, tracestate) is propagated, whatever OTEL_PROPAGATORS says: baggage
would put arbitrary data into every message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_FIELDS = frozenset(_PROPAGATOR.fields)  # {"traceparent", "tracestate"}

Metadata = Sequence[tuple[str, str | bytes]]


def inject(carrier: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write the current span's (or `context`'s) traceparent/tracestate into `carrier`, e.g.
    `inject(msg.trace.carrier)`. Writes nothing when there is no valid span, so with tracing
    off it costs a context lookup and the message stays as small as before."""
    _PROPAGATOR.inject(carrier, context)


def extract(carrier: Mapping[str, str]) -> Context:
    """The context to start a child span in: `tracer.start_as_current_span(name,
    context=extract(msg.trace.carrier))`. An empty carrier gives the current context, so a
    message without trace context starts a new trace (if sampled) instead of failing."""
    if not carrier:
        return otel_context.get_current()
    return _PROPAGATOR.extract(carrier)


def outgoing_metadata(metadata: Metadata = ()) -> tuple[tuple[str, str | bytes], ...]:
    """`metadata` plus the current trace context, for a unary call's `metadata=` argument."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return (*metadata, *carrier.items())


def context_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> Context:
    """Server side of a unary call: `context_from_metadata(context.invocation_metadata())`."""
    carrier = {
        key: value for key, value in (metadata or ()) if key in _FIELDS and isinstance(value, str)
    }
    return extract(carrier)


class TraceContextClientInterceptor(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """grpc.aio client interceptor adding the current trace context to every unary-unary call:
    `grpc.aio.insecure_channel(target, interceptors=[TraceContextClientInterceptor()])`.

    Not the opentelemetry-instrumentation-grpc package: that one also creates a span per RPC
    (named after the method, outside our span-name contract) and, on streams, one span for the
    whole stream; we only want the context to travel.
    """

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        if carrier:
            metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()))
            for key, value in carrier.items():
                metadata[key] = value  # replaces a stale value rather than adding a second one
            client_call_details = client_call_details._replace(metadata=metadata)
        return await continuation(client_call_details, request)
