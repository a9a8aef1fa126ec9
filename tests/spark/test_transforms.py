"""The job's transformations on small hand-built frames, compared with hand-written results."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.hexmq_traces import transforms as T
from spark.hexmq_traces.schema import OTLP_SCHEMA, SPANS_SCHEMA
from tests.spark.frames import MS, T0, S, span_row, spans_frame

MINUTE0 = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
MINUTE1 = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)

TA = "a" * 32  # trace ids
TB = "b" * 32
TC = "c" * 32
TD = "d" * 32
TE = "e" * 32
TF = "f" * 32


def _kv(key: str, **value: object) -> dict[str, object]:
    return {"key": key, "value": value}


def test_flatten_spans_reads_otlp_json_into_typed_columns(
    spark: SparkSession, tmp_path: Path
) -> None:
    edge_spans = [
        {
            "traceId": "0AF7651916CD43DD8448EB211C80319C",  # uppercase hex: lowered
            "spanId": "b7ad6b7169203331",  # a root: no parentSpanId at all
            "name": "mqtt.publish",
            "kind": 2,
            "startTimeUnixNano": "1767225600000000000",
            "endTimeUnixNano": "1767225600002500000",
            "attributes": [
                _kv("messaging.destination.name", stringValue="t/1"),
                _kv("hexmq.qos", intValue="1"),
                _kv("messaging.message.id", intValue=42),  # a number, not OTLP's string
                _kv("x.custom", boolValue=True),
                _kv("x.ratio", doubleValue=0.5),
                _kv("hexmq.qos", intValue="2"),  # repeated key: the first one wins
            ],
            "status": {},
        },
        {
            # base64 ids, as protobuf's plain JSON printer writes them
            "traceId": "AAECAwQFBgcICQoLDA0ODw==",
            "spanId": "AAECAwQFBgc=",
            "parentSpanId": "",
            "name": "mqtt.deliver",
            "kind": "SPAN_KIND_PRODUCER",
            "startTimeUnixNano": 1767225600001000000,
            "endTimeUnixNano": "1767225600001200000",
            "attributes": [
                _kv("hexmq.node", stringValue="n3"),  # the span's node beats the resource's
                _kv("hexmq.subscriber_hash", stringValue="5ub"),
            ],
            "status": {"code": 2, "message": "write failed"},
        },
    ]
    partition_spans = [
        {
            "traceId": "0af7651916cd43dd8448eb211c80319c",
            "spanId": "00f067aa0ba902b7",
            "parentSpanId": "0000000000000000",  # the all-zero id means none
            "name": "partition.append",
            "kind": 2,
            "startTimeUnixNano": "bogus",
            "endTimeUnixNano": "1767225600001000000",
            "attributes": [
                _kv("hexmq.partition", intValue="7"),
                _kv("hexmq.partition.epoch", intValue="3"),
                _kv("hexmq.subscribers", intValue="2"),
                _kv("x.list", arrayValue={"values": [{"intValue": "1"}]}),
            ],
            "status": {"code": "STATUS_CODE_OK"},
        },
        {"traceId": "0af7651916cd43dd8448eb211c80319c", "name": "no span id: dropped"},
    ]
    request = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        _kv("service.name", stringValue="hexmq-edge"),
                        _kv("hexmq.node", stringValue="n1"),
                    ]
                },
                "scopeSpans": [{"scope": {"name": "hexmq.edge"}, "spans": edge_spans}],
            },
            {
                "resource": {"attributes": [_kv("service.name", stringValue="hexmq-partition")]},
                "scopeSpans": [{"spans": partition_spans}],
            },
        ]
    }
    path = tmp_path / "spans.jsonl"
    path.write_text(json.dumps(request) + '\n{"resourceSpans": [{"resou\n{}\n')

    actual = T.flatten_spans(spark.read.schema(OTLP_SCHEMA).json(str(path)))

    expected = spans_frame(
        spark,
        span_row(
            trace_id="0af7651916cd43dd8448eb211c80319c",
            span_id="b7ad6b7169203331",
            service="hexmq-edge",
            node="n1",
            name="mqtt.publish",
            kind="SERVER",
            start_ns=1767225600000000000,
            end_ns=1767225600002500000,
            duration_ms=2.5,
            messaging_destination_name="t/1",
            messaging_message_id="42",
            hexmq_qos=1,
            attributes={"x.custom": "true", "x.ratio": "0.5"},
        ),
        span_row(
            trace_id="000102030405060708090a0b0c0d0e0f",
            span_id="0001020304050607",
            service="hexmq-edge",
            node="n3",
            name="mqtt.deliver",
            kind="PRODUCER",
            start_ns=1767225600001000000,
            end_ns=1767225600001200000,
            duration_ms=0.2,
            status="ERROR",
            status_message="write failed",
            hexmq_subscriber_hash="5ub",
        ),
        span_row(
            trace_id="0af7651916cd43dd8448eb211c80319c",
            span_id="00f067aa0ba902b7",
            service="hexmq-partition",
            name="partition.append",
            kind="SERVER",
            end_ns=1767225600001000000,
            status="OK",
            hexmq_partition=7,
            hexmq_partition_epoch=3,
            hexmq_subscribers=2,
            attributes={"x.list": None},
        ),
    )
    assert actual.schema.simpleString() == SPANS_SCHEMA.simpleString()
    assertDataFrameEqual(actual, expected)


# --- the delivery audit -----------------------------------------------------------------------

# Trace A, QoS 1: s1 delivered and acked; s2 delivered, never acked (lost); s3 delivered twice
# (duplicated); the append expects a 4th subscriber that has no deliver span at all.
# Trace B, QoS 0, no route span: s1 delivered after 1.5 s (late); s2's only attempt failed.
# Trace C: a deliver span whose publish span is missing.
# Trace D, QoS 1: routed to one partition whose append span is missing.
# Trace E, QoS 1: everything there.
AUDIT_SPANS = (
    span_row(trace_id=TA, span_id="a0", name="mqtt.publish", node="n1", start_ns=T0,
             end_ns=T0 + 6 * MS, hexmq_qos=1, messaging_destination_name="t/a",
             messaging_message_id="7", hexmq_client_id_hash="ca"),
    span_row(trace_id=TA, span_id="a1", parent_span_id="a0", name="edge.route", node="n1",
             start_ns=T0, end_ns=T0 + MS // 10, hexmq_route_partitions=1),
    span_row(trace_id=TA, span_id="a2", parent_span_id="a0", name="partition.append", node="n2",
             start_ns=T0 + MS // 10, end_ns=T0 + MS, hexmq_partition=3, hexmq_subscribers=4),
    span_row(trace_id=TA, span_id="a3", parent_span_id="a2", name="partition.replicate",
             node="n2", start_ns=T0 + MS // 5, end_ns=T0 + MS // 2, hexmq_follower="n3"),
    span_row(trace_id=TA, span_id="a4", parent_span_id="a2", name="partition.ack", node="n2",
             start_ns=T0 + MS // 2, end_ns=T0 + MS),
    span_row(trace_id=TA, span_id="d1", parent_span_id="a2", name="mqtt.deliver", node="n1",
             start_ns=T0 + MS, end_ns=T0 + 2 * MS, hexmq_subscriber_hash="s1", hexmq_qos=1),
    span_row(trace_id=TA, span_id="k1", parent_span_id="d1", name="mqtt.client_ack", node="n1",
             start_ns=T0 + 2 * MS, end_ns=T0 + 5 * MS // 2),
    span_row(trace_id=TA, span_id="d2", parent_span_id="a2", name="mqtt.deliver", node="n2",
             start_ns=T0 + MS, end_ns=T0 + 3 * MS, hexmq_subscriber_hash="s2", hexmq_qos=1),
    span_row(trace_id=TA, span_id="d3", parent_span_id="a2", name="mqtt.deliver", node="n1",
             start_ns=T0 + MS, end_ns=T0 + 4 * MS, hexmq_subscriber_hash="s3", hexmq_qos=1),
    span_row(trace_id=TA, span_id="k3", parent_span_id="d3", name="mqtt.client_ack", node="n1",
             start_ns=T0 + 4 * MS, end_ns=T0 + 9 * MS // 2),
    span_row(trace_id=TA, span_id="d4", parent_span_id="a2", name="mqtt.deliver", node="n1",
             start_ns=T0 + 4 * MS, end_ns=T0 + 5 * MS, hexmq_subscriber_hash="s3", hexmq_qos=1),
    span_row(trace_id=TA, span_id="k4", parent_span_id="d4", name="mqtt.client_ack", node="n1",
             start_ns=T0 + 5 * MS, end_ns=T0 + 6 * MS),
    span_row(trace_id=TB, span_id="b0", name="mqtt.publish", node="n2", start_ns=T0 + S,
             end_ns=T0 + S + MS, hexmq_qos=0, messaging_destination_name="t/b"),
    span_row(trace_id=TB, span_id="b2", parent_span_id="b0", name="partition.append", node="n3",
             start_ns=T0 + S, end_ns=T0 + S + MS, hexmq_partition=5, hexmq_subscribers=2),
    span_row(trace_id=TB, span_id="b3", parent_span_id="b2", name="mqtt.deliver", node="n1",
             start_ns=T0 + S + MS, end_ns=T0 + S + 1500 * MS, hexmq_subscriber_hash="s1"),
    span_row(trace_id=TB, span_id="b4", parent_span_id="b2", name="mqtt.deliver", node="n2",
             start_ns=T0 + S + MS, end_ns=T0 + S + 2 * MS, hexmq_subscriber_hash="s2",
             status="ERROR"),
    span_row(trace_id=TC, span_id="c3", parent_span_id="c2", name="mqtt.deliver", node="n1",
             start_ns=T0, end_ns=T0 + MS, hexmq_subscriber_hash="s1", hexmq_qos=1),
    span_row(trace_id=TD, span_id="e0", name="mqtt.publish", node="n3", start_ns=T0 + 2 * S,
             end_ns=T0 + 2 * S + MS, hexmq_qos=1, messaging_destination_name="t/d"),
    span_row(trace_id=TD, span_id="e1", parent_span_id="e0", name="edge.route", node="n3",
             start_ns=T0 + 2 * S, end_ns=T0 + 2 * S + MS, hexmq_route_partitions=1),
    span_row(trace_id=TE, span_id="f0", name="mqtt.publish", node="n1", start_ns=T0 + 3 * S,
             end_ns=T0 + 3 * S + 2 * MS, hexmq_qos=1, messaging_destination_name="t/e"),
    span_row(trace_id=TE, span_id="f1", parent_span_id="f0", name="edge.route", node="n1",
             start_ns=T0 + 3 * S, end_ns=T0 + 3 * S + MS, hexmq_route_partitions=1),
    span_row(trace_id=TE, span_id="f2", parent_span_id="f0", name="partition.append", node="n1",
             start_ns=T0 + 3 * S, end_ns=T0 + 3 * S + MS, hexmq_partition=3, hexmq_subscribers=1),
    span_row(trace_id=TE, span_id="f3", parent_span_id="f2", name="partition.ack", node="n1",
             start_ns=T0 + 3 * S, end_ns=T0 + 3 * S + MS),
    span_row(trace_id=TE, span_id="f4", parent_span_id="f2", name="mqtt.deliver", node="n1",
             start_ns=T0 + 3 * S, end_ns=T0 + 3 * S + MS, hexmq_subscriber_hash="s9"),
    span_row(trace_id=TE, span_id="f5", parent_span_id="f4", name="mqtt.client_ack", node="n1",
             start_ns=T0 + 3 * S + MS, end_ns=T0 + 3 * S + 2 * MS),
)  # fmt: skip

DELIVERIES_DDL = (
    "trace_id string, subscriber_hash string, node string, qos int, deliver_spans bigint, "
    "delivered_ns bigint, ack_ns bigint, latency_ms double, ack_latency_ms double, "
    "lost boolean, duplicated boolean, late boolean, status string"
)


# deliveries() of AUDIT_SPANS, worked out by hand.
AUDIT_DELIVERIES = [
    (TA, "s1", "n1", 1, 1, T0 + 2 * MS, T0 + 5 * MS // 2, 2.0, 2.5, False, False, False,
     "ok"),
    (TA, "s2", "n2", 1, 1, T0 + 3 * MS, None, 3.0, None, True, False, False, "lost"),
    (TA, "s3", "n1", 1, 2, T0 + 4 * MS, T0 + 9 * MS // 2, 4.0, 4.5, False, True, False,
     "duplicated"),
    # QoS from the publish span when the deliver span has none
    (TB, "s1", "n1", 0, 1, T0 + S + 1500 * MS, None, 1500.0, None, False, False, True, "late"),
    (TB, "s2", "n2", 0, 1, None, None, None, None, True, False, False, "lost"),
    (TE, "s9", "n1", 1, 1, T0 + 3 * S + MS, T0 + 3 * S + 2 * MS, 1.0, 2.0, False, False,
     False, "ok"),
]  # fmt: skip


def test_deliveries_audits_each_subscriber(spark: SparkSession) -> None:
    actual = T.deliveries(spans_frame(spark, *AUDIT_SPANS), late_ms=1000.0)

    assertDataFrameEqual(actual, spark.createDataFrame(AUDIT_DELIVERIES, DELIVERIES_DDL))


def test_a_qos2_publish_sent_again_with_dup_is_one_delivery_and_at_qos1_two(
    spark: SparkSession,
) -> None:
    """A PUBLISH sent again after a reconnect carries DUP (hexmq.dup): at QoS 2 the client
    keeps it once by its packet id (fault run splits-3-nodes at 4d79d9f: a subscriber moved
    between its PUBREC and the partition's record of it); at QoS 1 it is a second delivery."""

    def deliver(span_id: str, sub: str, qos: int, at: int, **more: Any) -> dict[str, Any]:
        return span_row(trace_id=TF, span_id=span_id, parent_span_id="g2", name="mqtt.deliver",
                        node="n1", start_ns=at, end_ns=at + MS, hexmq_subscriber_hash=sub,
                        hexmq_qos=qos, **more)  # fmt: skip

    rows = (
        span_row(trace_id=TF, span_id="g0", name="mqtt.publish", node="n1", start_ns=T0,
                 end_ns=T0 + MS, hexmq_qos=2, messaging_destination_name="t/f"),
        span_row(trace_id=TF, span_id="g2", parent_span_id="g0", name="partition.append",
                 node="n1", start_ns=T0, end_ns=T0 + MS, hexmq_partition=1, hexmq_subscribers=3),
        deliver("q1", "sa", 2, T0 + MS),
        deliver("q2", "sa", 2, T0 + 9 * MS, hexmq_dup=True),
        deliver("q3", "sb", 2, T0 + MS),
        deliver("q4", "sb", 2, T0 + 9 * MS),
        deliver("q5", "sc", 1, T0 + MS),
        deliver("q6", "sc", 1, T0 + 9 * MS, hexmq_dup=True),
    )  # fmt: skip
    audit = T.deliveries(spans_frame(spark, *rows), late_ms=1000.0)
    got = {r["subscriber_hash"]: (r["deliver_spans"], r["duplicated"]) for r in audit.collect()}
    assert got == {"sa": (2, False), "sb": (2, True), "sc": (2, True)}


def test_a_send_cut_off_before_its_puback_counts_towards_a_duplicate(
    spark: SparkSession,
) -> None:
    """A QoS 1 PUBLISH written to a connection that closed before the client's PUBACK may have
    reached the client: its redelivery on the next connection is then a second copy (fault run
    splits-3-nodes at 51e559f, where the client held both and the audit showed one). An
    attempt that failed otherwise (a write error) is not a send."""

    def deliver(span_id: str, sub: str, at: int, **more: Any) -> dict[str, Any]:
        return span_row(trace_id=TF, span_id=span_id, parent_span_id="g2", name="mqtt.deliver",
                        node="n1", start_ns=at, end_ns=at + MS, hexmq_subscriber_hash=sub,
                        hexmq_qos=1, **more)  # fmt: skip

    cut = {"status": "ERROR", "status_message": "connection closed before PUBACK"}
    rows = (
        span_row(trace_id=TF, span_id="g0", name="mqtt.publish", node="n1", start_ns=T0,
                 end_ns=T0 + MS, hexmq_qos=1, messaging_destination_name="t/f"),
        span_row(trace_id=TF, span_id="g2", parent_span_id="g0", name="partition.append",
                 node="n1", start_ns=T0, end_ns=T0 + MS, hexmq_partition=1, hexmq_subscribers=3),
        deliver("u1", "sa", T0 + MS, **cut),
        deliver("u2", "sa", T0 + 9 * MS, hexmq_dup=True),
        deliver("u3", "sb", T0 + MS, status="ERROR", status_message="write failed"),
        deliver("u4", "sb", T0 + 9 * MS),
        deliver("u5", "sc", T0 + MS, **cut),
        *(
            span_row(trace_id=TF, span_id=f"k{d}", parent_span_id=d, name="mqtt.client_ack",
                     node="n1", start_ns=T0 + 10 * MS, end_ns=T0 + 11 * MS)
            for d in ("u2", "u4")
        ),
    )  # fmt: skip
    audit = T.deliveries(spans_frame(spark, *rows), late_ms=1000.0)
    got = {r["subscriber_hash"]: (r["duplicated"], r["status"]) for r in audit.collect()}
    assert got == {
        "sa": (True, "duplicated"),
        "sb": (False, "ok"),
        "sc": (False, "lost"),  # (written once, never acknowledged)
    }


def test_messages_counts_expected_lost_duplicated_and_missing_spans(spark: SparkSession) -> None:
    # The deliveries input is the hand-written table, so this test does not depend on
    # deliveries() being right.
    deliveries = spark.createDataFrame(AUDIT_DELIVERIES, DELIVERIES_DDL)

    actual = T.messages(spans_frame(spark, *AUDIT_SPANS), deliveries)

    def at(offset_ns: int) -> datetime:
        return datetime.fromtimestamp((T0 + offset_ns) / 1e9, tz=UTC)

    expected = spark.createDataFrame(
        [
            (TA, "7", "t/a", 1, "ca", "n1", T0, at(0), [3], ["n1", "n2", "n3"], 3, 4, 3, 4, 2, 1,
             0, 4.0, {"s1": 2.0, "s2": 3.0, "s3": 4.0}, ["deliver"], 1, "lost"),
            (TB, None, "t/b", 0, None, "n2", T0 + S, at(S), [5], ["n1", "n2", "n3"], 3, 2, 1, 2,
             1, 0, 1, 1500.0, {"s1": 1500.0, "s2": None}, ["route"], 1, "lost"),
            (TD, None, "t/d", 1, None, "n3", T0 + 2 * S, at(2 * S), [], ["n3"], 1, None, 0, 0, 0,
             0, 0, None, {}, ["append"], 1, "incomplete"),
            (TE, None, "t/e", 1, None, "n1", T0 + 3 * S, at(3 * S), [3], ["n1"], 1, 1, 1, 1, 0, 0,
             0, 1.0, {"s9": 1.0}, [], 1, "ok"),
        ],
        "trace_id string, message_id string, topic string, qos int, client_id_hash string, "
        "edge_node string, publish_ns bigint, publish_time timestamp, partitions array<int>, "
        "nodes array<string>, nodes_crossed int, expected_deliveries bigint, delivered bigint, "
        "deliver_spans bigint, lost bigint, duplicated bigint, late bigint, "
        "latency_ms_max double, subscriber_latency_ms map<string,double>, "
        "missing_stages array<string>, publish_spans bigint, status string",
    )  # fmt: skip
    assertDataFrameEqual(actual, expected)


def test_orphan_traces_are_publish_paths_without_publish_span(spark: SparkSession) -> None:
    spans = spans_frame(
        spark,
        *AUDIT_SPANS,
        span_row(trace_id="f" * 32, span_id="m1", name="membership.view", start_ns=T0),
    )

    actual = T.orphan_traces(spans)

    expected = spark.createDataFrame(
        [(TC, 1, ["mqtt.deliver"], T0)],
        "trace_id string, spans bigint, names array<string>, first_start_ns bigint",
    )
    assertDataFrameEqual(actual, expected)


# --- latency, replication, skew ---------------------------------------------------------------


def test_stage_latency_percentiles_per_stage_node_and_minute(spark: SparkSession) -> None:
    spans = spans_frame(
        spark,
        *(
            span_row(trace_id=TA, span_id=f"p{ms}", name="mqtt.publish", node="n1",
                     start_ns=T0 + ms * S, end_ns=T0 + ms * S + ms * MS)
            for ms in (1, 2, 3, 4)
        ),
        span_row(trace_id=TA, span_id="p9", name="mqtt.publish", node="n1", start_ns=T0 + 61 * S,
                 end_ns=T0 + 61 * S + 9 * MS),
        span_row(trace_id=TA, span_id="r1", name="partition.replicate", node="n2",
                 start_ns=T0, end_ns=T0 + 7 * MS),
        span_row(trace_id=TA, span_id="x1", name="mqtt.connect", node="n1", start_ns=T0,
                 end_ns=T0 + MS),
    )  # fmt: skip

    by_minute = T.stage_latency(spans)
    overall = T.stage_latency(spans, by=())

    assertDataFrameEqual(
        by_minute,
        spark.createDataFrame(
            [
                ("edge", "n1", MINUTE0, 4, 2.0, 4.0, 4.0, 4.0),
                ("edge", "n1", MINUTE1, 1, 9.0, 9.0, 9.0, 9.0),
                ("replicate", "n2", MINUTE0, 1, 7.0, 7.0, 7.0, 7.0),
            ],
            "stage string, node string, minute timestamp, spans bigint, p50_ms double, "
            "p95_ms double, p99_ms double, max_ms double",
        ),
    )
    assertDataFrameEqual(
        overall,
        spark.createDataFrame(
            [("edge", 5, 3.0, 9.0, 9.0, 9.0), ("replicate", 1, 7.0, 7.0, 7.0, 7.0)],
            "stage string, spans bigint, p50_ms double, p95_ms double, p99_ms double, "
            "max_ms double",
        ),
    )


def test_replication_lag_per_partition_follower_and_minute(spark: SparkSession) -> None:
    def rep(span_id: str, start_ns: int, ms: int, **extra: object) -> dict[str, object]:
        return span_row(trace_id=TA, span_id=span_id, name="partition.replicate", node="n1",
                        start_ns=start_ns, end_ns=start_ns + ms * MS, hexmq_partition=1,
                        hexmq_follower="n2", **extra)  # fmt: skip

    spans = spans_frame(
        spark,
        rep("r1", T0, 2, hexmq_replication_lag=3),
        rep("r2", T0 + S, 4),
        rep("r3", T0 + 60 * S, 30, status="ERROR", hexmq_replication_lag=40),
        span_row(trace_id=TA, span_id="a1", name="partition.append", start_ns=T0, end_ns=T0 + MS),
    )

    actual = T.replication_lag(spans)

    expected = spark.createDataFrame(
        [
            (1, "n2", MINUTE0, 2, 2.0, 4.0, 4.0, 4.0, 3, 3.0, 0),
            (1, "n2", MINUTE1, 1, 30.0, 30.0, 30.0, 30.0, 40, 40.0, 1),
        ],
        "partition int, follower string, minute timestamp, spans bigint, p50_ms double, "
        "p95_ms double, p99_ms double, max_ms double, max_lag_entries bigint, "
        "mean_lag_entries double, errors bigint",
    )
    assertDataFrameEqual(actual, expected)


def test_hot_partitions_and_topics_share_and_skew(spark: SparkSession) -> None:
    def append(span_id: str, partition: int, ms: int) -> dict[str, object]:
        return span_row(trace_id=TA, span_id=span_id, name="partition.append", start_ns=T0,
                        end_ns=T0 + ms * MS, hexmq_partition=partition)  # fmt: skip

    def publish(span_id: str, topic: str) -> dict[str, object]:
        return span_row(trace_id=TA, span_id=span_id, name="mqtt.publish", start_ns=T0,
                        end_ns=T0 + MS, messaging_destination_name=topic)  # fmt: skip

    spans = spans_frame(
        spark,
        append("a1", 1, 1),
        append("a2", 1, 2),
        append("a3", 1, 8),
        append("a4", 2, 5),
        *(publish(f"p{i}", "hot/topic") for i in range(4)),
        publish("p9", "cold/topic"),
    )

    assertDataFrameEqual(
        T.hot_partitions(spans),
        spark.createDataFrame(
            [(1, 3, 0.75, 1.5, 8.0, 8.0), (2, 1, 0.25, 0.5, 5.0, 5.0)],
            "partition int, appends bigint, share double, load_vs_mean double, p99_ms double, "
            "max_ms double",
        ),
    )
    assertDataFrameEqual(
        T.hot_topics(spans),
        spark.createDataFrame(
            [("hot/topic", 4, 0.8, 1.6), ("cold/topic", 1, 0.2, 0.4)],
            "topic string, messages bigint, share double, load_vs_mean double",
        ),
    )


# --- failover ---------------------------------------------------------------------------------

FAILOVER_SPANS = (
    # View 1: a node joined (nothing lost). View 2: n2 lost, reported by two membership nodes.
    span_row(trace_id=TA, span_id="v1", name="membership.view", node="n1", start_ns=T0,
             end_ns=T0 + 100 * MS, hexmq_view_epoch=1),
    span_row(trace_id=TB, span_id="v2", name="membership.view", node="n1", start_ns=T0 + 10 * S,
             end_ns=T0 + 11_500 * MS, hexmq_view_epoch=2, hexmq_node_lost="n2"),
    span_row(trace_id=TC, span_id="v3", name="membership.view", node="n3",
             start_ns=T0 + 10_200 * MS, end_ns=T0 + 11_600 * MS, hexmq_view_epoch=2,
             hexmq_node_lost="n2"),
    span_row(trace_id=TD, span_id="f5", name="partition.failover", node="n3",
             start_ns=T0 + 11_600 * MS, end_ns=T0 + 11_800 * MS, hexmq_partition=5,
             hexmq_partition_epoch=4, hexmq_view_epoch=2, hexmq_node_lost="n2"),
    # No view epoch on the span: put under the latest view begun before it (2).
    span_row(trace_id=TD, span_id="f9", name="partition.failover", node="n1",
             start_ns=T0 + 11_700 * MS, end_ns=T0 + 12 * S, hexmq_partition=9,
             hexmq_partition_epoch=2, hexmq_node_lost="n2"),
    # A view that is not in the traces: no-master time is the failover's own duration.
    span_row(trace_id=TE, span_id="f7", name="partition.failover", node="n1",
             start_ns=T0 + 50 * S, end_ns=T0 + 50 * S + 300 * MS, hexmq_partition=7,
             hexmq_view_epoch=7),
)  # fmt: skip


def test_partition_failovers_measure_time_without_master(spark: SparkSession) -> None:
    actual = T.partition_failovers(spans_frame(spark, *FAILOVER_SPANS))

    expected = spark.createDataFrame(
        [
            (2, 5, "n2", "n3", 4, T0 + 11_600 * MS, T0 + 11_800 * MS, 200.0, 1800.0),
            (2, 9, "n2", "n1", 2, T0 + 11_700 * MS, T0 + 12 * S, 300.0, 2000.0),
            (7, 7, None, "n1", None, T0 + 50 * S, T0 + 50 * S + 300 * MS, 300.0, 300.0),
        ],
        "view_epoch bigint, partition int, old_master string, new_master string, "
        "new_epoch bigint, failover_start_ns bigint, failover_end_ns bigint, "
        "failover_ms double, no_master_ms double",
    )
    assertDataFrameEqual(actual, expected)


def test_failover_timeline_counts_publishes_in_flight(spark: SparkSession) -> None:
    messages = spark.createDataFrame(
        [
            (T0 + 5 * S, 1.0, 0),  # long before
            (T0 + 9 * S, 1500.0, 0),  # published before detection, delivered during
            (T0 + 11 * S, 1000.0, 0),
            (T0 + 11_900 * MS, None, 1),  # lost
            (T0 + 12_500 * MS, 2.0, 0),  # after the last failover ended
        ],
        "publish_ns bigint, latency_ms_max double, lost bigint",
    )

    actual = T.failover_timeline(spans_frame(spark, *FAILOVER_SPANS), messages)

    expected = spark.createDataFrame(
        [
            (1, None, datetime(2026, 1, 1, tzinfo=UTC), T0, T0 + 100 * MS, 100.0, 0, [], None,
             100.0, 0, None, None, 0),
            (2, "n2", datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC), T0 + 10 * S, T0 + 11_600 * MS,
             1600.0, 2, [5, 9], 2000.0, 2000.0, 3, 1000.0, 1500.0, 1),
        ],
        "view_epoch bigint, node_lost string, detected_time timestamp, detected_ns bigint, "
        "installed_ns bigint, detection_ms double, partitions_failed_over bigint, "
        "partitions array<int>, max_no_master_ms double, window_ms double, "
        "affected_publishes bigint, affected_latency_p50_ms double, "
        "affected_latency_max_ms double, affected_lost bigint",
    )  # fmt: skip
    assertDataFrameEqual(actual, expected)
