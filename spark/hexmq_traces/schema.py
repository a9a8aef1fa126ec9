"""Schemas and names the trace job relies on: the OTLP JSON input, the flat spans table, and the
span/attribute names of the contract in docs/traces.md.

The input schema is explicit because Spark's JSON inference only creates the fields that happen
to occur in the files read: a sample without `parentSpanId` or without any `doubleValue` would
otherwise yield a different schema, and every later column reference would break.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)


def _struct(*fields: tuple[str, DataType]) -> StructType:
    return StructType([StructField(name, dtype, nullable=True) for name, dtype in fields])


# Every scalar is read as a string: OTLP JSON writes 64-bit integers as strings ("intValue": "3"),
# but other writers emit numbers, and Spark's string reader accepts both (a number is kept as
# its text). Typed casts happen in flatten_spans with try_cast, so a bad value is a null, not a
# failed job. arrayValue/kvlistValue/bytesValue are left out on purpose: the job uses scalars
# only, and fields absent from the schema are skipped by the reader.
ANY_VALUE: Final = _struct(
    ("stringValue", StringType()),
    ("intValue", StringType()),
    ("boolValue", StringType()),
    ("doubleValue", StringType()),
)
KEY_VALUES: Final = ArrayType(_struct(("key", StringType()), ("value", ANY_VALUE)))

OTLP_SPAN: Final = _struct(
    ("traceId", StringType()),
    ("spanId", StringType()),
    ("parentSpanId", StringType()),
    ("name", StringType()),
    ("kind", StringType()),
    ("startTimeUnixNano", StringType()),
    ("endTimeUnixNano", StringType()),
    ("attributes", KEY_VALUES),
    ("status", _struct(("code", StringType()), ("message", StringType()))),
)

# One ExportTraceServiceRequest per line (the Collector's file exporter, hexmq's own
# RotatingOtlpJsonFileExporter).
OTLP_SCHEMA: Final = _struct(
    (
        "resourceSpans",
        ArrayType(
            _struct(
                ("resource", _struct(("attributes", KEY_VALUES))),
                (
                    "scopeSpans",
                    ArrayType(
                        _struct(
                            ("scope", _struct(("name", StringType()), ("version", StringType()))),
                            ("spans", ArrayType(OTLP_SPAN)),
                        )
                    ),
                ),
            )
        ),
    ),
)


class SpanName:
    """Span names of the contract (docs/traces.md); the same strings as hexmq.telemetry.names.

    Repeated here rather than imported so that the job runs on a Spark cluster with nothing but
    pyspark installed.
    """

    PUBLISH: Final = "mqtt.publish"
    ROUTE: Final = "edge.route"
    APPEND: Final = "partition.append"
    REPLICATE: Final = "partition.replicate"
    ACK: Final = "partition.ack"
    DELIVER: Final = "mqtt.deliver"
    CLIENT_ACK: Final = "mqtt.client_ack"
    CONNECT: Final = "mqtt.connect"
    SUBSCRIBE: Final = "mqtt.subscribe"
    TAKEOVER: Final = "session.takeover"
    FAILOVER: Final = "partition.failover"
    CATCHUP: Final = "partition.catchup"
    MEMBERSHIP_VIEW: Final = "membership.view"


# The status message of an mqtt.deliver span written to a connection that closed before the
# client acknowledged it (hexmq.telemetry.names.DELIVER_UNACKNOWLEDGED).
DELIVER_UNACKNOWLEDGED: Final = "connection closed before PUBACK"


# Spans of the publish path, in path order, and the stage each is reported under.
STAGES: Final[dict[str, str]] = {
    SpanName.PUBLISH: "edge",
    SpanName.ROUTE: "route",
    SpanName.APPEND: "append",
    SpanName.REPLICATE: "replicate",
    SpanName.ACK: "ack",
    SpanName.DELIVER: "deliver",
    SpanName.CLIENT_ACK: "client_ack",
}

# Resource attributes read into columns.
RESOURCE_SERVICE: Final = "service.name"
NODE_ATTRIBUTE: Final = "hexmq.node"

# Span attributes given a typed column of their own in the spans table: (key, column, type).
# Every other attribute, known or not, stays in the `attributes` map column.
ATTRIBUTE_COLUMNS: Final[tuple[tuple[str, str, DataType], ...]] = (
    ("messaging.system", "messaging_system", StringType()),
    ("messaging.destination.name", "messaging_destination_name", StringType()),
    ("messaging.message.id", "messaging_message_id", StringType()),
    ("messaging.operation", "messaging_operation", StringType()),
    ("messaging.operation.name", "messaging_operation_name", StringType()),
    ("messaging.operation.type", "messaging_operation_type", StringType()),
    ("hexmq.partition", "hexmq_partition", IntegerType()),
    ("hexmq.partition.epoch", "hexmq_partition_epoch", LongType()),
    ("hexmq.partition.seq", "hexmq_partition_seq", LongType()),
    ("hexmq.qos", "hexmq_qos", IntegerType()),
    ("hexmq.dup", "hexmq_dup", BooleanType()),
    ("hexmq.client_id_hash", "hexmq_client_id_hash", StringType()),
    ("hexmq.subscriber_hash", "hexmq_subscriber_hash", StringType()),
    ("hexmq.subscribers", "hexmq_subscribers", IntegerType()),
    ("hexmq.route.partitions", "hexmq_route_partitions", IntegerType()),
    ("hexmq.follower", "hexmq_follower", StringType()),
    ("hexmq.replication.lag", "hexmq_replication_lag", LongType()),
    ("hexmq.view.epoch", "hexmq_view_epoch", LongType()),
    ("hexmq.node.lost", "hexmq_node_lost", StringType()),
    ("hexmq.reason_code", "hexmq_reason_code", IntegerType()),
)

# The flat spans table (one row per span), as flatten_spans produces it and Parquet stores it.
SPANS_SCHEMA: Final = StructType(
    [
        StructField("trace_id", StringType()),
        StructField("span_id", StringType()),
        StructField("parent_span_id", StringType()),
        StructField("service", StringType()),
        StructField("node", StringType()),
        StructField("name", StringType()),
        StructField("kind", StringType()),
        StructField("start_ns", LongType()),
        StructField("end_ns", LongType()),
        StructField("duration_ms", DoubleType()),
        StructField("status", StringType()),
        StructField("status_message", StringType()),
        *(StructField(column, dtype) for _, column, dtype in ATTRIBUTE_COLUMNS),
        StructField("attributes", MapType(StringType(), StringType())),
    ]
)

# OTLP enum values, accepted both as the integers of OTLP JSON and as ProtoJSON names.
SPAN_KINDS: Final[dict[int, str]] = {
    0: "UNSPECIFIED",
    1: "INTERNAL",
    2: "SERVER",
    3: "CLIENT",
    4: "PRODUCER",
    5: "CONSUMER",
}
STATUS_CODES: Final[dict[int, str]] = {0: "UNSET", 1: "OK", 2: "ERROR"}

# Output tables, in the order the job writes them (each is a Parquet directory under --out).
TABLES: Final = (
    "spans",
    "deliveries",
    "messages",
    "orphan_traces",
    "stage_latency",
    "stage_latency_overall",
    "replication_lag",
    "hot_partitions",
    "hot_topics",
    "partition_failovers",
    "failover_timeline",
)
