"""Pure DataFrame -> DataFrame transformations of the trace job.

Nothing here reads, writes or collects: the job (job.py) decides what is materialised. Only
built-in Spark SQL functions are used, no Python UDFs, so executors of a cluster need nothing but
Spark, and the whole plan runs in the JVM.

Time columns ending in `_ns` are Unix epoch nanoseconds (long), `_ms` columns are durations in
milliseconds (double), and `minute`/`second`/`*_time` columns are timestamps (UTC in the job's
session).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.hexmq_traces.schema import (
    ATTRIBUTE_COLUMNS,
    DELIVER_UNACKNOWLEDGED,
    NODE_ATTRIBUTE,
    RESOURCE_SERVICE,
    SPAN_KINDS,
    SPANS_SCHEMA,
    STAGES,
    STATUS_CODES,
    SpanName,
)

NS_PER_MS = 1_000_000.0
NS_PER_S = 1_000_000_000
DEFAULT_LATE_MS = 1000.0
# percentile_approx accuracy: exact ranks up to this many values per group, relative error
# 1/accuracy above. Spark's default (10000) is plenty for latency percentiles.
PERCENTILE_ACCURACY = 10_000


# --- flattening -------------------------------------------------------------------------------


def _attribute_map(key_values: Column) -> Column:
    """map<string,string> of an OTLP KeyValue array, the value as text whatever its type.

    OTLP forbids a repeated key but writers still produce one; the first occurrence wins here,
    whatever spark.sql.mapKeyDedupPolicy says, so a bad span never fails the whole job.
    """
    named = F.filter(key_values, lambda kv: kv["key"].isNotNull())
    keys = F.transform(named, lambda kv: kv["key"])
    first = F.filter(named, lambda kv, i: F.array_position(keys, kv["key"]) == i + 1)
    entries = F.transform(
        first,
        lambda kv: F.struct(
            kv["key"].alias("key"),
            F.coalesce(
                kv["value"]["stringValue"],
                kv["value"]["intValue"],
                kv["value"]["boolValue"],
                kv["value"]["doubleValue"],
            ).alias("value"),
        ),
    )
    return F.coalesce(F.map_from_entries(entries), F.create_map().cast("map<string,string>"))


def _hex_id(raw: Column, nbytes: int) -> Column:
    """Lowercase hex id; base64 ids (protobuf's plain JSON mapping) are converted, and the empty
    and all-zero ids (OTLP's "no id", e.g. a root's parent) become null."""
    digits = 2 * nbytes
    hex_id = (
        F.when(raw.rlike(f"^[0-9a-fA-F]{{{digits}}}$"), F.lower(raw))
        .when(raw != "", F.lower(F.hex(F.try_to_binary(raw, F.lit("base64")))))
        .otherwise(F.lit(None))
    )
    return F.when(hex_id != "0" * digits, hex_id)


def _enum_name(raw: Column, names: Mapping[int, str], prefix: str, default: str) -> Column:
    """An OTLP enum given as an integer (OTLP JSON) or as its ProtoJSON name, as a short name
    (SERVER, ERROR); an unknown number is kept as its digits, an absent value is the default."""
    code = raw.try_cast("int")
    by_code = F.try_element_at(
        F.create_map(*(F.lit(x) for item in names.items() for x in item)), code
    )
    by_name = F.regexp_replace(F.upper(F.trim(raw)), f"^{prefix}", "")
    return (
        F.when(raw.isNull() | (F.trim(raw) == ""), F.lit(default))
        .when(code.isNotNull(), F.coalesce(by_code, code.cast("string")))
        .otherwise(by_name)
    )


def flatten_spans(raw: DataFrame) -> DataFrame:
    """OTLP JSON requests (read with schema.OTLP_SCHEMA) -> one row per span (SPANS_SCHEMA).

    Unreadable lines (null resourceSpans) and spans without a trace or span id are dropped: they
    cannot be placed in any trace.
    """
    resources = raw.select(F.explode("resourceSpans").alias("rs")).select(
        _attribute_map(F.col("rs.resource.attributes")).alias("resource"),
        F.explode("rs.scopeSpans").alias("ss"),
    )
    spans = resources.select("resource", F.explode("ss.spans").alias("s")).select(
        "resource", _attribute_map(F.col("s.attributes")).alias("attrs"), "s"
    )
    start_ns = F.col("s.startTimeUnixNano").try_cast("long")
    end_ns = F.col("s.endTimeUnixNano").try_cast("long")

    def attr(key: str) -> Column:
        return F.try_element_at(F.col("attrs"), F.lit(key))

    typed = [attr(key).try_cast(dtype).alias(column) for key, column, dtype in ATTRIBUTE_COLUMNS]
    # Keys with a column of their own are not repeated in the map of other attributes.
    own_keys = F.array(*(F.lit(key) for key, _, _ in ATTRIBUTE_COLUMNS), F.lit(NODE_ATTRIBUTE))
    flat = spans.select(
        _hex_id(F.col("s.traceId"), 16).alias("trace_id"),
        _hex_id(F.col("s.spanId"), 8).alias("span_id"),
        _hex_id(F.col("s.parentSpanId"), 8).alias("parent_span_id"),
        F.try_element_at(F.col("resource"), F.lit(RESOURCE_SERVICE)).alias("service"),
        # The span's own hexmq.node first: a span may speak for another node than its process
        # (hexmq's exporters also put hexmq.node on the resource).
        F.coalesce(
            attr(NODE_ATTRIBUTE), F.try_element_at(F.col("resource"), F.lit(NODE_ATTRIBUTE))
        ).alias("node"),
        F.col("s.name").alias("name"),
        _enum_name(F.col("s.kind"), SPAN_KINDS, "SPAN_KIND_", "UNSPECIFIED").alias("kind"),
        start_ns.alias("start_ns"),
        end_ns.alias("end_ns"),
        ((end_ns - start_ns) / NS_PER_MS).alias("duration_ms"),
        _enum_name(F.col("s.status.code"), STATUS_CODES, "STATUS_CODE_", "UNSET").alias("status"),
        F.col("s.status.message").alias("status_message"),
        *typed,
        F.map_filter(F.col("attrs"), lambda k, _: ~F.array_contains(own_keys, k)).alias(
            "attributes"
        ),
    ).filter(F.col("trace_id").isNotNull() & F.col("span_id").isNotNull())
    return flat.select(*(F.col(f.name).cast(f.dataType) for f in SPANS_SCHEMA.fields))


# --- helpers ----------------------------------------------------------------------------------


def _named(name: str) -> Column:
    return F.col("name") == name


def _bucket(ns: Column, seconds: int) -> Column:
    """The start of the `seconds`-long bucket holding epoch-nanosecond `ns`, as a timestamp.
    Integer division: a double would blur nanosecond epochs (~1.7e18) at bucket edges."""
    return F.timestamp_seconds(F.call_function("div", ns, F.lit(seconds * NS_PER_S)) * seconds)


def _time(ns: Column) -> Column:
    return F.timestamp_micros(F.call_function("div", ns, F.lit(1000)))


def _latency_stats(column: str, prefix: str = "") -> list[Column]:
    """count, p50/p95/p99 (percentile_approx: an observed value, no interpolation) and max."""
    pct = F.percentile_approx(column, [0.5, 0.95, 0.99], PERCENTILE_ACCURACY)
    return [
        F.count(column).alias("spans" if not prefix else f"{prefix}count"),
        pct[0].alias(f"{prefix}p50_ms"),
        pct[1].alias(f"{prefix}p95_ms"),
        pct[2].alias(f"{prefix}p99_ms"),
        F.max(column).alias(f"{prefix}max_ms"),
    ]


def _publish_fields() -> Column:
    # start_ns first: min() of this struct picks the earliest publish span of a trace.
    return F.struct(
        F.col("start_ns").alias("publish_ns"),
        F.col("span_id").alias("publish_span_id"),
        F.col("messaging_message_id").alias("message_id"),
        F.col("messaging_destination_name").alias("topic"),
        F.col("hexmq_qos").alias("qos"),
        F.col("hexmq_client_id_hash").alias("client_id_hash"),
        F.col("node").alias("edge_node"),
    )


def publish_roots(spans: DataFrame) -> DataFrame:
    """One row per trace holding an mqtt.publish span: its earliest publish span's fields.

    A message is found by name, not by a missing parent: the edge continues a context the
    publishing client sent (MQTT 5 user properties), so its span is then not the trace's root.
    """
    return (
        spans.filter(_named(SpanName.PUBLISH))
        .groupBy("trace_id")
        .agg(F.min(_publish_fields()).alias("p"), F.count("*").alias("publish_spans"))
        .select("trace_id", "p.*", "publish_spans")
    )


# --- the delivery audit -----------------------------------------------------------------------


def deliveries(spans: DataFrame, late_ms: float = DEFAULT_LATE_MS) -> DataFrame:
    """One row per (published message, subscriber) with a deliver span: its latency and audit.

    - latency_ms: publish received at the edge (mqtt.publish start) -> PUBLISH written to the
      subscriber (end of its first successful mqtt.deliver); ack_latency_ms: -> client's ack.
    - lost: no successful deliver span (every attempt ended with status ERROR), or QoS >= 1 and
      no mqtt.client_ack under any of its deliver spans. (Subscribers with no deliver span at
      all are counted per message in `messages`, which knows how many were expected.)
    - duplicated: more than one deliver span for the subscriber that sent the PUBLISH: a
      successful one, or one the connection's close ended before the client's acknowledgement
      ("connection closed before PUBACK"): that PUBLISH was written and may have reached the
      client, so its redelivery may be a second copy (fault run splits-3-nodes at 51e559f: a
      subscriber's connection cut 4 ms after the write, the message resent with DUP on its new
      connection, and the client held both). At QoS 2, more than one successful span without
      hexmq.dup (a PUBLISH sent again with DUP after a reconnect carries the packet id the
      client already holds: the same delivery, MQTT 4.3.3).
    - late: latency above `late_ms`.
    QoS is the deliver span's (the granted QoS), else the published one.
    """
    roots = publish_roots(spans).select("trace_id", "publish_ns", F.col("qos").alias("message_qos"))
    delivered_ok = ~F.col("status").eqNullSafe("ERROR")
    # Written, then the connection closed before the client acknowledged it (services/edge:
    # the deliver spans a lost connection ends).
    written_unacknowledged = F.col("status").eqNullSafe("ERROR") & F.coalesce(
        F.col("status_message") == DELIVER_UNACKNOWLEDGED, F.lit(False)
    )
    attempts = spans.filter(_named(SpanName.DELIVER)).select(
        "trace_id",
        "span_id",
        F.nullif(F.col("hexmq_subscriber_hash"), F.lit("")).alias("subscriber_hash"),
        "node",
        "hexmq_qos",
        "end_ns",
        delivered_ok.alias("ok"),
        (delivered_ok | written_unacknowledged).alias("sent"),
        (delivered_ok & ~F.coalesce(F.col("hexmq_dup"), F.lit(False))).alias("first_send"),
    )
    acks = (
        spans.filter(_named(SpanName.CLIENT_ACK))
        .groupBy("trace_id", F.col("parent_span_id").alias("span_id"))
        .agg(F.min("end_ns").alias("ack_ns"))
    )
    per_subscriber = (
        attempts.join(acks, ["trace_id", "span_id"], "left")
        .groupBy("trace_id", "subscriber_hash")
        .agg(
            F.count("*").alias("deliver_spans"),
            F.count_if("ok").alias("ok_spans"),
            F.count_if("sent").alias("sent_spans"),
            F.count_if("first_send").alias("first_sends"),
            # Successful attempts sort first (failed = false), then by time.
            F.min(F.struct((~F.col("ok")).alias("failed"), "end_ns", "node")).alias("first"),
            F.max("hexmq_qos").alias("qos"),
            F.min("ack_ns").alias("ack_ns"),
        )
        .join(roots, "trace_id")
    )
    delivered_ns = F.when(~F.col("first.failed"), F.col("first.end_ns"))
    qos = F.coalesce(F.col("qos"), F.col("message_qos"))
    audited = per_subscriber.select(
        "trace_id",
        "subscriber_hash",
        F.col("first.node").alias("node"),
        qos.alias("qos"),
        "deliver_spans",
        delivered_ns.alias("delivered_ns"),
        "ack_ns",
        ((delivered_ns - F.col("publish_ns")) / NS_PER_MS).alias("latency_ms"),
        ((F.col("ack_ns") - F.col("publish_ns")) / NS_PER_MS).alias("ack_latency_ms"),
        (
            delivered_ns.isNull() | (F.coalesce(qos >= 1, F.lit(False)) & F.col("ack_ns").isNull())
        ).alias("lost"),
        F.when(qos == 2, F.col("first_sends") > 1)
        .otherwise(F.col("sent_spans") > 1)
        .alias("duplicated"),
    ).withColumn("late", F.coalesce(F.col("latency_ms") > F.lit(late_ms), F.lit(False)))
    return audited.withColumn(
        "status",
        F.when(F.col("lost"), "lost")
        .when(F.col("duplicated"), "duplicated")
        .when(F.col("late"), "late")
        .otherwise("ok"),
    )


def messages(spans: DataFrame, deliveries: DataFrame) -> DataFrame:
    """One row per published message (a trace with an mqtt.publish span), with its path through
    the cluster and the delivery audit summed over its subscribers.

    Expected deliveries are the sum of hexmq.subscribers over the message's partition.append
    spans (sessions each partition delivers to); those without any deliver span are lost. The
    count is unknown (null) when no append span carries the attribute, and is a lower bound when
    an append span is missing, which `missing_stages` then shows. `status` is the worst of lost,
    duplicated, late, incomplete (a span of the path is missing), ok.
    """
    traces = (
        spans.filter(F.col("name").isin(list(STAGES)))
        .groupBy("trace_id")
        .agg(
            F.min(F.when(_named(SpanName.PUBLISH), _publish_fields())).alias("p"),
            F.count_if(_named(SpanName.PUBLISH)).alias("publish_spans"),
            F.count_if(_named(SpanName.ROUTE)).alias("route_spans"),
            F.max(F.when(_named(SpanName.ROUTE), F.col("hexmq_route_partitions"))).alias(
                "expected_partitions"
            ),
            F.count_if(_named(SpanName.APPEND)).alias("append_spans"),
            F.sum(F.when(_named(SpanName.APPEND), F.col("hexmq_subscribers"))).alias(
                "expected_deliveries"
            ),
            F.count_if(_named(SpanName.ACK)).alias("ack_spans"),
            F.array_sort(
                F.collect_set(F.when(_named(SpanName.APPEND), F.col("hexmq_partition")))
            ).alias("partitions"),
            # Nodes crossed: every node a span ran on, and the followers replicated to.
            F.array_sort(
                F.array_union(F.collect_set("node"), F.collect_set("hexmq_follower"))
            ).alias("nodes"),
        )
        .filter(F.col("publish_spans") > 0)
    )
    per_message = deliveries.groupBy("trace_id").agg(
        F.count("*").alias("subscribers_seen"),
        F.count_if(F.col("delivered_ns").isNotNull()).alias("delivered"),
        F.sum("deliver_spans").alias("deliver_spans"),
        F.count_if("lost").alias("lost_seen"),
        F.count_if("duplicated").alias("duplicated"),
        F.count_if("late").alias("late"),
        F.max("latency_ms").alias("latency_ms_max"),
        # deliveries() has one row per subscriber, so the keys are unique ("" for unknown).
        F.map_from_entries(
            F.collect_list(F.struct(F.coalesce("subscriber_hash", F.lit("")), "latency_ms"))
        ).alias("subscriber_latency_ms"),
    )
    joined = traces.join(per_message, "trace_id", "left")
    seen = F.coalesce(F.col("subscribers_seen"), F.lit(0))
    missing = F.greatest(F.coalesce(F.col("expected_deliveries"), F.lit(0)) - seen, F.lit(0))
    lost = missing + F.coalesce(F.col("lost_seen"), F.lit(0))
    qos = F.col("p.qos")
    missing_stages = F.array_compact(
        F.array(
            F.when(F.col("route_spans") == 0, F.lit("route")),
            F.when(
                F.col("append_spans") < F.coalesce(F.col("expected_partitions"), F.lit(0)),
                F.lit("append"),
            ),
            # The partition acks an append to the edge only when the publisher wants an ack.
            F.when((qos >= 1) & (F.col("ack_spans") < F.col("append_spans")), F.lit("ack")),
            F.when(missing > 0, F.lit("deliver")),
        )
    )
    out = joined.select(
        "trace_id",
        "p.message_id",
        "p.topic",
        "p.qos",
        "p.client_id_hash",
        "p.edge_node",
        "p.publish_ns",
        _time(F.col("p.publish_ns")).alias("publish_time"),
        "partitions",
        "nodes",
        F.size("nodes").alias("nodes_crossed"),
        "expected_deliveries",
        F.coalesce(F.col("delivered"), F.lit(0)).alias("delivered"),
        F.coalesce(F.col("deliver_spans"), F.lit(0)).alias("deliver_spans"),
        lost.cast("long").alias("lost"),
        F.coalesce(F.col("duplicated"), F.lit(0)).alias("duplicated"),
        F.coalesce(F.col("late"), F.lit(0)).alias("late"),
        "latency_ms_max",
        F.coalesce(F.col("subscriber_latency_ms"), F.create_map().cast("map<string,double>")).alias(
            "subscriber_latency_ms"
        ),
        missing_stages.alias("missing_stages"),
        "publish_spans",
    )
    return out.withColumn(
        "status",
        F.when(F.col("lost") > 0, "lost")
        .when(F.col("duplicated") > 0, "duplicated")
        .when(F.col("late") > 0, "late")
        .when(F.size("missing_stages") > 0, "incomplete")
        .otherwise("ok"),
    )


def orphan_traces(spans: DataFrame) -> DataFrame:
    """Traces with publish-path spans but no mqtt.publish span: messages whose edge span was
    lost (dropped by an exporter queue, or the edge died), so they cannot be audited."""
    return (
        spans.filter(F.col("name").isin(list(STAGES)))
        .groupBy("trace_id")
        .agg(
            F.count_if(_named(SpanName.PUBLISH)).alias("publish_spans"),
            F.count("*").alias("spans"),
            F.array_sort(F.collect_set("name")).alias("names"),
            F.min("start_ns").alias("first_start_ns"),
        )
        .filter(F.col("publish_spans") == 0)
        .drop("publish_spans")
    )


# --- latency per stage, replication, skew -----------------------------------------------------


def stage_latency(spans: DataFrame, by: Sequence[str] = ("node", "minute")) -> DataFrame:
    """Latency percentiles of each publish-path stage (schema.STAGES), grouped by `by` (any of
    node, minute). `by=()` gives one row per stage."""
    stages = F.create_map(*(F.lit(x) for item in STAGES.items() for x in item))
    staged = spans.select(
        F.try_element_at(stages, F.col("name")).alias("stage"),
        "node",
        _bucket(F.col("start_ns"), 60).alias("minute"),
        "duration_ms",
    ).filter(F.col("stage").isNotNull())
    return staged.groupBy("stage", *by).agg(*_latency_stats("duration_ms"))


def replication_lag(spans: DataFrame) -> DataFrame:
    """Per partition, follower and minute: how long replicate calls took (the time a write
    waited on that follower) and the follower's lag in log entries when the span carries
    hexmq.replication.lag."""
    return (
        spans.filter(_named(SpanName.REPLICATE))
        .groupBy(
            F.col("hexmq_partition").alias("partition"),
            F.col("hexmq_follower").alias("follower"),
            _bucket(F.col("start_ns"), 60).alias("minute"),
        )
        .agg(
            *_latency_stats("duration_ms"),
            F.max("hexmq_replication_lag").alias("max_lag_entries"),
            F.avg("hexmq_replication_lag").alias("mean_lag_entries"),
            F.count_if(F.col("status") == "ERROR").alias("errors"),
        )
    )


def _skew(counts: DataFrame, count_column: str) -> DataFrame:
    """Adds share (of the total) and load_vs_mean (1.0 = an even spread) to per-key counts."""
    totals = counts.agg(F.sum(count_column).alias("_total"), F.avg(count_column).alias("_mean"))
    return (
        counts.crossJoin(F.broadcast(totals))
        .withColumn("share", F.col(count_column) / F.col("_total"))
        .withColumn("load_vs_mean", F.col(count_column) / F.col("_mean"))
        .drop("_total", "_mean")
    )


def hot_partitions(spans: DataFrame) -> DataFrame:
    """Appends per partition (each message counted once per target partition), its share of
    all appends and against the mean partition, and the partition's append latency."""
    counts = (
        spans.filter(_named(SpanName.APPEND))
        .groupBy(F.col("hexmq_partition").alias("partition"))
        .agg(
            F.count("*").alias("appends"),
            F.percentile_approx("duration_ms", 0.99, PERCENTILE_ACCURACY).alias("p99_ms"),
            F.max("duration_ms").alias("max_ms"),
        )
    )
    return _skew(counts, "appends").select(
        "partition", "appends", "share", "load_vs_mean", "p99_ms", "max_ms"
    )


def hot_topics(spans: DataFrame) -> DataFrame:
    """Published messages per topic, with share and load against the mean topic."""
    counts = (
        spans.filter(_named(SpanName.PUBLISH))
        .groupBy(F.col("messaging_destination_name").alias("topic"))
        .agg(F.count("*").alias("messages"))
    )
    return _skew(counts, "messages").select("topic", "messages", "share", "load_vs_mean")


# --- failover ---------------------------------------------------------------------------------


def view_changes(spans: DataFrame) -> DataFrame:
    """One row per membership view epoch: when the change began (the earliest membership.view
    span start: failure suspected), when the view was installed (latest end) and the lost node."""
    return (
        spans.filter(_named(SpanName.MEMBERSHIP_VIEW) & F.col("hexmq_view_epoch").isNotNull())
        .groupBy(F.col("hexmq_view_epoch").alias("view_epoch"))
        .agg(
            F.min("start_ns").alias("detected_ns"),
            F.max("end_ns").alias("installed_ns"),
            F.max("hexmq_node_lost").alias("node_lost"),
        )
    )


def partition_failovers(spans: DataFrame) -> DataFrame:
    """One row per partition.failover span: which partition moved from which master to which,
    and how long it had no master: from the start of the view change that caused it (or the
    failover's own start, if earlier or no view is known) to the end of the failover.

    A failover without hexmq.view.epoch is put under the latest view change begun before it.
    """
    views = view_changes(spans).select(
        F.col("view_epoch").alias("v_epoch"), F.col("detected_ns").alias("v_detected_ns")
    )
    failovers = spans.filter(_named(SpanName.FAILOVER)).select(
        "trace_id",
        "span_id",
        F.col("hexmq_view_epoch").alias("f_epoch"),
        F.col("hexmq_partition").alias("partition"),
        F.col("hexmq_node_lost").alias("old_master"),
        F.col("node").alias("new_master"),
        F.col("hexmq_partition_epoch").alias("new_epoch"),
        "start_ns",
        "end_ns",
        "duration_ms",
    )
    matches = (F.col("f_epoch") == F.col("v_epoch")) | (
        F.col("f_epoch").isNull() & (F.col("v_detected_ns") <= F.col("start_ns"))
    )
    latest_first = Window.partitionBy("trace_id", "span_id").orderBy(
        F.col("v_detected_ns").desc_nulls_last()
    )
    began_ns = F.least(F.coalesce(F.col("v_detected_ns"), F.col("start_ns")), F.col("start_ns"))
    return (
        failovers.join(F.broadcast(views), matches, "left")
        .withColumn("_rank", F.row_number().over(latest_first))
        .filter(F.col("_rank") == 1)
        .select(
            F.coalesce(F.col("f_epoch"), F.col("v_epoch")).alias("view_epoch"),
            "partition",
            "old_master",
            "new_master",
            "new_epoch",
            F.col("start_ns").alias("failover_start_ns"),
            F.col("end_ns").alias("failover_end_ns"),
            F.col("duration_ms").alias("failover_ms"),
            ((F.col("end_ns") - began_ns) / NS_PER_MS).alias("no_master_ms"),
        )
    )


def failover_timeline(spans: DataFrame, messages: DataFrame) -> DataFrame:
    """One row per view change: lost node, detection time, partitions failed over and their
    longest time without master, and the publishes in flight during the change.

    The change's window runs from detection to the later of view installation and the last
    failover end; a message is affected if its publish-to-last-delivery interval overlaps it
    (publishes made after the node died but before detection are the slowest ones).
    """
    per_view = (
        partition_failovers(spans)
        .groupBy("view_epoch")
        .agg(
            F.count("*").alias("partitions_failed_over"),
            F.array_sort(F.collect_set("partition")).alias("partitions"),
            F.max("no_master_ms").alias("max_no_master_ms"),
            F.max("failover_end_ns").alias("failovers_end_ns"),
        )
    )
    windows = (
        view_changes(spans)
        .join(per_view, "view_epoch", "left")
        .withColumn(
            "window_end_ns",
            F.greatest(
                F.col("installed_ns"), F.coalesce(F.col("failovers_end_ns"), F.col("installed_ns"))
            ),
        )
    )
    in_flight = messages.select(
        F.col("publish_ns").alias("m_start_ns"),
        (F.col("publish_ns") + (F.coalesce(F.col("latency_ms_max"), F.lit(0.0)) * NS_PER_MS))
        .cast("long")
        .alias("m_end_ns"),
        "latency_ms_max",
        "lost",
    )
    overlaps = (F.col("m_start_ns") <= F.col("window_end_ns")) & (
        F.col("m_end_ns") >= F.col("detected_ns")
    )
    affected = (
        in_flight.join(
            F.broadcast(windows.select("view_epoch", "detected_ns", "window_end_ns")), overlaps
        )
        .groupBy("view_epoch")
        .agg(
            F.count("*").alias("affected_publishes"),
            F.percentile_approx("latency_ms_max", 0.5, PERCENTILE_ACCURACY).alias(
                "affected_latency_p50_ms"
            ),
            F.max("latency_ms_max").alias("affected_latency_max_ms"),
            F.count_if(F.col("lost") > 0).alias("affected_lost"),
        )
    )
    return windows.join(affected, "view_epoch", "left").select(
        "view_epoch",
        "node_lost",
        _time(F.col("detected_ns")).alias("detected_time"),
        "detected_ns",
        "installed_ns",
        ((F.col("installed_ns") - F.col("detected_ns")) / NS_PER_MS).alias("detection_ms"),
        F.coalesce(F.col("partitions_failed_over"), F.lit(0)).alias("partitions_failed_over"),
        F.coalesce(F.col("partitions"), F.array().cast("array<int>")).alias("partitions"),
        "max_no_master_ms",
        ((F.col("window_end_ns") - F.col("detected_ns")) / NS_PER_MS).alias("window_ms"),
        F.coalesce(F.col("affected_publishes"), F.lit(0)).alias("affected_publishes"),
        "affected_latency_p50_ms",
        "affected_latency_max_ms",
        F.coalesce(F.col("affected_lost"), F.lit(0)).alias("affected_lost"),
    )


# --- report series ----------------------------------------------------------------------------


def latency_timeline(messages: DataFrame) -> DataFrame:
    """Per second of publish time: messages, end-to-end latency (slowest subscriber) p50/p99/max
    and messages with a lost delivery. The report's main chart."""
    return (
        messages.groupBy(
            F.call_function("div", F.col("publish_ns"), F.lit(NS_PER_S)).alias("second")
        )
        .agg(
            F.count("*").alias("messages"),
            F.percentile_approx("latency_ms_max", [0.5, 0.99], PERCENTILE_ACCURACY).alias("_pct"),
            F.max("latency_ms_max").alias("max_ms"),
            F.count_if(F.col("lost") > 0).alias("lost"),
        )
        .select(
            "second",
            "messages",
            F.col("_pct")[0].alias("p50_ms"),
            F.col("_pct")[1].alias("p99_ms"),
            "max_ms",
            "lost",
        )
    )
