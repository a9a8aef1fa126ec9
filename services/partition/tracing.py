"""Spans of the partition master: partition.append per target partition of a publish, with
its partition.ack and one partition.replicate per in-sync follower (docs/traces.md)."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import trace
from opentelemetry.trace import Span

from hexmq import telemetry
from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.commit_queue import DurableBatch
from services.partition.effects import EndAppendSpans
from services.partition.replication import Replicator
from services.partition.replication_status import in_sync_followers, lag


class AppendTracer:
    def __init__(
        self,
        node_id: str,
        tracing: telemetry.Tracing,
        replicator: Replicator | None,
    ) -> None:
        self.node_id = node_id
        self.tracing = tracing
        self.replicator = replicator

    def append(
        self,
        msg: common_pb.Message,
        targets: Iterable[pb.PartitionTarget],
        fanout: dict[int, int],
    ) -> tuple[dict[int, dict[str, str]], EndAppendSpans] | None:
        """Start a partition.append span per target partition; the carriers continue the trace
        in deliveries, and the effect ends the spans once the batch is durable and replicated
        (`durable`). `fanout` is filled by the caller before the spans end."""
        tracing = self.tracing
        if not tracing.enabled:
            return None
        parent = telemetry.extract(msg.trace.carrier)
        tracer = tracing.tracer
        kind = telemetry.SPAN_KIND[telemetry.SpanName.APPEND]
        spans: list[tuple[int, int, Span]] = []
        carriers: dict[int, dict[str, str]] = {}
        for target in targets:
            span = tracer.start_span(telemetry.SpanName.APPEND, context=parent, kind=kind)
            if span.is_recording():
                span.set_attributes(
                    telemetry.partition_attributes(
                        node=self.node_id, partition=target.partition, epoch=target.epoch
                    )
                )
                span.set_attribute(telemetry.Attr.DESTINATION, msg.topic)
            carrier: dict[str, str] = {}
            telemetry.inject(carrier, trace.set_span_in_context(span))
            carriers[target.partition] = carrier
            spans.append((target.partition, target.epoch, span))
        return carriers, EndAppendSpans(tuple(spans), msg.qos, fanout)

    def durable(self, e: EndAppendSpans, released: DurableBatch | None) -> None:
        """End a publish's append spans: its batch (`released`, being released) is durable and
        replicated."""
        tracer = self.tracing.tracer
        for p, epoch, span in e.spans:
            span.set_attribute(telemetry.Attr.SUBSCRIBERS, e.fanout.get(p, 0))
            if released is not None and p in released.seqs:
                self._replicate(span, p, epoch, released.seqs[p], released.durable_ns)
            if e.qos:
                tracer.start_span(
                    telemetry.SpanName.ACK, context=trace.set_span_in_context(span)
                ).end()
            span.end()

    def _replicate(self, append: Span, p: int, epoch: int, seq: int, durable_ns: int) -> None:
        """One partition.replicate span per in-sync follower: from the moment the write was
        durable here (and went to the followers) until every in-sync follower had it (the
        slowest one decides when the write is acknowledged)."""
        replicator = self.replicator
        if replicator is None:
            return
        context = trace.set_span_in_context(append)
        kind = telemetry.SPAN_KIND[telemetry.SpanName.REPLICATE]
        for fp in in_sync_followers(replicator, p):
            span = self.tracing.tracer.start_span(
                telemetry.SpanName.REPLICATE, context=context, kind=kind, start_time=durable_ns
            )
            if span.is_recording():
                span.set_attributes(
                    telemetry.partition_attributes(
                        node=self.node_id, partition=p, epoch=epoch, seq=seq, follower=fp.node
                    )
                )
                span.set_attribute(telemetry.Attr.REPLICATION_LAG, lag(replicator, p, fp))
            span.end()


def set_carrier(qm: pb.QueuedMessage, carrier: dict[str, str]) -> None:
    """Deliveries continue the trace from this partition's append span."""
    qm.message.trace.carrier.clear()
    qm.message.trace.carrier.update(carrier)
