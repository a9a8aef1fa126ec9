"""The edge's spans: one trace per PUBLISH (mqtt.publish -> edge.route, continued by the
partitions and closed by mqtt.deliver -> mqtt.client_ack at the subscriber's edge), plus
mqtt.connect, mqtt.subscribe and session.takeover.

Callers check `enabled` first, so a node with tracing off pays one attribute read per message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import Publish

if TYPE_CHECKING:
    from services.edge.router import PublishRoute

Name = telemetry.SpanName
Attr = telemetry.Attr
KIND = telemetry.SPAN_KIND


class EdgeTracer:
    def __init__(self, tracing: telemetry.Tracing, node_id: str) -> None:
        self.tracing = tracing
        self.tracer = tracing.tracer
        self.enabled = tracing.enabled
        self.node_id = node_id

    # ----- publish ----------------------------------------------------------------------

    def start_publish(self, client_id: str, packet: Publish) -> tuple[Span, Span] | None:
        """The root span of a PUBLISH and its edge.route child (end it with `routed`), or
        None when the sampler says no: then nothing is carried on, since every later hop would
        follow that decision (parent-based sampling) and only pay for it."""
        span = self.tracer.start_span(Name.PUBLISH, kind=KIND[Name.PUBLISH])
        if not span.is_recording():
            return None
        span.set_attributes(
            telemetry.messaging_attributes(
                operation="publish",
                topic=packet.topic,
                qos=packet.qos,
                body_size=len(packet.payload),
                client_id=client_id,
                node=self.node_id,
            )
        )
        route_span = self.tracer.start_span(
            Name.ROUTE, context=trace.set_span_in_context(span), kind=KIND[Name.ROUTE]
        )
        return span, route_span

    def routed(self, route_span: Span, route: PublishRoute) -> None:
        if route_span.is_recording():
            route_span.set_attribute(Attr.ROUTE_PARTITIONS, sum(len(t) for _, t in route.targets))
        route_span.end()

    def stamp(self, span: Span, commands: Iterable[tuple[object, pb.EdgeCommand]]) -> None:
        """Carry the trace inside each command's message (the stream carries many traces)."""
        context = trace.set_span_in_context(span)
        for _, cmd in commands:
            telemetry.inject(cmd.publish.message.trace.carrier, context)

    def finish(self, span: Span, *, reason_code: int = 0, error: str | None = None) -> None:
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        if reason_code and span.is_recording():
            span.set_attribute(Attr.REASON_CODE, reason_code)
        span.end()

    # ----- delivery ---------------------------------------------------------------------

    def unacknowledged(self, span: Span) -> None:
        """A delivery's PUBLISH was written and its connection closed before the client
        acknowledged it: the client may hold it (the Spark job's audit then counts a
        redelivery as a possible duplicate, by this status message)."""
        self.finish(span, error=telemetry.names.DELIVER_UNACKNOWLEDGED)

    def start_deliver(self, qm: pb.QueuedMessage, subscriber_id: str) -> Span | None:
        carrier: Mapping[str, str] = qm.message.trace.carrier
        if not carrier:
            return None
        span = self.tracer.start_span(
            Name.DELIVER, context=telemetry.extract(carrier), kind=KIND[Name.DELIVER]
        )
        if span.is_recording():
            span.set_attributes(
                telemetry.messaging_attributes(
                    operation="deliver",
                    topic=qm.message.topic,
                    qos=qm.qos,
                    subscriber_id=subscriber_id,
                    node=self.node_id,
                )
            )
            if qm.dup:
                span.set_attribute(Attr.DUP, True)
        return span

    def client_ack(self, deliver_span: Span, subscriber_id: str) -> None:
        ack = self.tracer.start_span(
            Name.CLIENT_ACK,
            context=trace.set_span_in_context(deliver_span),
            kind=KIND[Name.CLIENT_ACK],
        )
        if ack.is_recording():
            ack.set_attributes(
                {
                    Attr.SUBSCRIBER_HASH: telemetry.client_id_hash(subscriber_id),
                    Attr.NODE: self.node_id,
                }
            )
        ack.end()
        deliver_span.end()

    # ----- session events ---------------------------------------------------------------

    def start_connect(self, client_id: str, peer: str) -> Span:
        return self.start_event(Name.CONNECT, client_id, peer)

    def start_subscribe(self, client_id: str) -> Span:
        return self.start_event(Name.SUBSCRIBE, client_id)

    def takeover(self, client_id: str, reason_code: int) -> None:
        self.finish(self.start_event(Name.TAKEOVER, client_id), reason_code=reason_code)

    def start_event(self, name: str, client_id: str, peer: str | None = None) -> Span:
        """A session event's span; `peer` ("host:port", the client's address) on CONNECT."""
        span = self.tracer.start_span(name, kind=KIND[name])
        if span.is_recording():
            span.set_attributes(
                {Attr.NODE: self.node_id, Attr.CLIENT_ID_HASH: telemetry.client_id_hash(client_id)}
            )
            host, sep, port = (peer or "").rpartition(":")
            if sep and host and port.isdigit():
                span.set_attributes({Attr.CLIENT_ADDRESS: host, Attr.CLIENT_PORT: int(port)})
        return span
