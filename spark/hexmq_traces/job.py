"""The trace-analysis job: OTLP JSON trace files -> Parquet tables, report.html, console summary.

    python -m spark.hexmq_traces INPUT... --out DIR [--late-ms 1000]
    spark-submit spark/hexmq_traces/job.py INPUT... --out DIR

See docs/traces.md for the tables, the options and the span contract the job relies on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

if __package__ in (None, ""):
    # Run as a file (spark-submit spark/hexmq_traces/job.py): make `spark.hexmq_traces`
    # importable from the repository root two levels up.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyspark import SparkConf, SparkContext
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampType

from spark.hexmq_traces import report
from spark.hexmq_traces import transforms as T
from spark.hexmq_traces.schema import OTLP_SCHEMA, STAGES

APP_NAME = "hexmq-traces"
DEFAULT_SHUFFLE_PARTITIONS = 4  # local mode on a few cores: Spark's 200 is mostly overhead
# Local mode only: the driver is the whole cluster, so it binds to loopback and shows no UI
# (Spark otherwise picks the eth0 address and serves the UI on every interface).
LOCAL_CONF = {
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.ui.enabled": "false",
}
JOB_CONF = {
    "spark.ui.showConsoleProgress": "false",
    # Minutes and times in the tables and the report are UTC whatever the machine's zone.
    "spark.sql.session.timeZone": "UTC",
}


def build_session(
    master: str | None = None,
    shuffle_partitions: int | None = None,
    driver_memory: str | None = None,
) -> SparkSession:
    """A SparkSession for the job: local mode on loopback by default.

    Under spark-submit the JVM already runs with the submitter's settings; those win over the
    job's defaults, so `--master yarn --conf spark.sql.shuffle.partitions=200` is respected.
    """
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # set by spark-submit for its driver
    if submitted:
        # spark-submit's settings (--master, --conf) are system properties of its driver JVM;
        # a SparkConf reads them only through the gateway to it, so connect first. Without
        # this the job saw none, and ran in local mode whatever --master said (found by
        # the standalone cluster test of tests/spark/test_job.py).
        SparkContext._ensure_initialized()
    preset = dict(SparkConf().getAll()) if submitted else {}
    master = master or preset.get("spark.master") or "local[*]"
    defaults = {**JOB_CONF, "spark.app.name": APP_NAME}
    if shuffle_partitions is None:
        defaults["spark.sql.shuffle.partitions"] = str(DEFAULT_SHUFFLE_PARTITIONS)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        defaults.update(LOCAL_CONF)
    conf = {k: v for k, v in defaults.items() if k not in preset}
    if shuffle_partitions is not None:
        conf["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    if driver_memory is not None:
        conf["spark.driver.memory"] = driver_memory  # effective only if the JVM starts here
    builder = SparkSession.builder.master(master)
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def parse_args(argv: Sequence[str] | None, prog: str = "hexmq-traces") -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Analyse hexmq OTLP JSON trace files: Parquet tables, report.html, summary.",
    )
    parser.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="OTLP JSON file, directory or glob (local path or any Hadoop FS URL)",
    )
    parser.add_argument(
        "--out",
        required=True,
        help="output directory for the Parquet tables (local path or Hadoop FS URL); "
        "tables already there are replaced",
    )
    parser.add_argument(
        "--report-dir",
        help="local directory for report.html, charts/ and summary.json (default: --out, "
        "which must then be a local path)",
    )
    parser.add_argument(
        "--late-ms",
        type=float,
        default=T.DEFAULT_LATE_MS,
        help="a delivery slower than this (publish received -> delivered) is late "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--top", type=int, default=25, help="rows per table in the report (default: 25)"
    )
    parser.add_argument(
        "--master", help="Spark master (default: spark-submit's --master, else local[*])"
    )
    parser.add_argument(
        "--shuffle-partitions",
        type=int,
        help=f"spark.sql.shuffle.partitions (default: {DEFAULT_SHUFFLE_PARTITIONS}, "
        "or spark-submit's)",
    )
    parser.add_argument(
        "--driver-memory",
        help="spark.driver.memory when the job starts its own JVM (python -m), e.g. 4g",
    )
    args = parser.parse_args(argv)
    if args.late_ms < 0 or args.top < 1:
        parser.error("--late-ms must be >= 0 and --top >= 1")
    if args.report_dir is None:
        local = _local_path(args.out)
        if local is None:
            parser.error("--out is not a local path: give --report-dir for report.html")
        args.report_dir = str(local)
    return args


def _local_path(location: str) -> Path | None:
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    return None


def write_tables(
    spark: SparkSession, inputs: Sequence[str], out: str, late_ms: float
) -> dict[str, DataFrame]:
    """Reads the input, writes every table under `out` and returns each re-read from Parquet.

    The spans are parsed from JSON once and every other table is computed from the spans'
    Parquet copy: columnar reads of a few columns instead of re-parsing the JSON per table.
    """
    out = out.rstrip("/")

    def save(df: DataFrame, table: str, files: int | None = None) -> DataFrame:
        if files is not None:  # small aggregates: one file rather than one per shuffle partition
            df = df.coalesce(files)
        df.write.mode("overwrite").parquet(f"{out}/{table}")
        return spark.read.parquet(f"{out}/{table}")

    # PERMISSIVE (the default) turns a torn last line of a crashed writer into a null row,
    # which flatten_spans drops.
    raw = spark.read.schema(OTLP_SCHEMA).option("mode", "PERMISSIVE").json(list(inputs))
    tables = {"spans": save(T.flatten_spans(raw), "spans")}
    spans = tables["spans"]
    tables["deliveries"] = save(T.deliveries(spans, late_ms), "deliveries")
    tables["messages"] = save(T.messages(spans, tables["deliveries"]), "messages")
    small = {
        "orphan_traces": T.orphan_traces(spans),
        "stage_latency": T.stage_latency(spans).orderBy("stage", "node", "minute"),
        "stage_latency_by_node": T.stage_latency(spans, by=("node",)).orderBy("stage", "node"),
        "stage_latency_overall": T.stage_latency(spans, by=()),
        "replication_lag": T.replication_lag(spans).orderBy("partition", "follower", "minute"),
        "hot_partitions": T.hot_partitions(spans).orderBy(F.desc("appends"), "partition"),
        "hot_topics": T.hot_topics(spans).orderBy(F.desc("messages"), "topic"),
        "partition_failovers": T.partition_failovers(spans).orderBy(
            "failover_start_ns", "partition"
        ),
        "failover_timeline": T.failover_timeline(spans, tables["messages"]).orderBy("view_epoch"),
    }
    for table, df in small.items():
        tables[table] = save(df, table, files=1)
    return tables


def _rows(df: DataFrame, limit: int | None = None) -> list[dict[str, Any]]:
    """Collected rows for the report; timestamps as UTC text (the session's zone), since
    collect() would turn them into naive datetimes in the machine's zone."""
    columns = [
        F.date_format(f.name, "yyyy-MM-dd HH:mm:ss").alias(f.name)
        if isinstance(f.dataType, TimestampType)
        else F.col(f.name)
        for f in df.schema.fields
    ]
    selected = df.select(*columns)
    if limit is not None:
        selected = selected.limit(limit)
    return [row.asDict(recursive=True) for row in selected.collect()]


def collect_report(tables: dict[str, DataFrame], top: int) -> dict[str, list[dict[str, Any]]]:
    """The small result sets the report shows: aggregates and the worst rows of big tables."""
    msgs, dels = tables["messages"], tables["deliveries"]
    problem = F.col("status") != "ok"
    status_order = F.array_position(
        F.array(*(F.lit(s) for s in ("lost", "duplicated", "late", "incomplete"))), F.col("status")
    )
    stage_order = F.array_position(F.array(*(F.lit(s) for s in STAGES.values())), F.col("stage"))
    return {
        "message_status": _rows(msgs.groupBy("status").count()),
        "delivery_stats": _rows(
            dels.agg(
                F.count("*").alias("deliveries"),
                F.count_if("lost").alias("lost"),
                F.count_if("duplicated").alias("duplicated"),
                F.count_if("late").alias("late"),
                F.percentile_approx("latency_ms", [0.5, 0.99], T.PERCENTILE_ACCURACY).alias("pct"),
                F.max("latency_ms").alias("max_ms"),
            )
        ),
        "problem_messages": _rows(
            msgs.filter(problem)
            .orderBy(status_order, "publish_ns")
            .select(
                "trace_id",
                "message_id",
                "topic",
                "qos",
                "edge_node",
                "publish_ns",
                "status",
                "expected_deliveries",
                "delivered",
                "lost",
                "duplicated",
                "late",
                "latency_ms_max",
                "missing_stages",
            ),
            top,
        ),
        "problem_deliveries": _rows(
            dels.filter(problem)
            .orderBy(status_order, "trace_id")
            .select(
                "trace_id",
                "subscriber_hash",
                "node",
                "qos",
                "deliver_spans",
                "latency_ms",
                "ack_latency_ms",
                "status",
            ),
            top,
        ),
        "latency_timeline": _rows(T.latency_timeline(msgs).orderBy("second")),
        "orphan_traces": _rows(tables["orphan_traces"].orderBy("first_start_ns"), top),
        "orphan_count": _rows(tables["orphan_traces"].agg(F.count("*").alias("n"))),
        "stage_latency_overall": _rows(tables["stage_latency_overall"].orderBy(stage_order)),
        "stage_latency_by_node": _rows(
            tables["stage_latency_by_node"].orderBy(stage_order, "node")
        ),
        "replication_by_follower": _rows(
            tables["replication_lag"]
            .groupBy("follower", "minute")
            .agg(
                F.max("p99_ms").alias("p99_ms"),
                F.max("max_lag_entries").alias("max_lag_entries"),
            )
            .orderBy("follower", "minute")
        ),
        "replication_worst": _rows(
            tables["replication_lag"]
            .groupBy("partition", "follower")
            .agg(
                F.sum("spans").alias("spans"),
                F.max("p99_ms").alias("p99_ms"),
                F.max("max_ms").alias("max_ms"),
                F.max("max_lag_entries").alias("max_lag_entries"),
                F.sum("errors").alias("errors"),
            )
            .orderBy(F.desc("max_ms")),
            top,
        ),
        "hot_partitions": _rows(tables["hot_partitions"], top),
        "hot_topics": _rows(tables["hot_topics"], top),
        "partition_count": _rows(tables["hot_partitions"].agg(F.count("*").alias("n"))),
        "failover_timeline": _rows(tables["failover_timeline"]),
        "partition_failovers": _rows(
            tables["partition_failovers"].orderBy(F.desc("no_master_ms")), top
        ),
        "span_count": [{"n": tables["spans"].count()}],
    }


def main(argv: Sequence[str] | None = None, prog: str = "hexmq-traces") -> int:
    """Run the job; 0 on success, 2 on bad arguments or missing input. `prog` names the command
    in usage and error lines (`hexmq traces analyze` passes its own)."""
    args = parse_args(argv, prog)
    started = time.monotonic()
    # A caller that already has a session (tests, a notebook, `hexmq traces analyze` run from
    # Python) keeps it: the job neither reconfigures nor stops a session it did not make.
    spark = SparkSession.getActiveSession()
    owned = spark is None
    if spark is None:
        spark = build_session(args.master, args.shuffle_partitions, args.driver_memory)
        # Spark's WARN lines (native libraries, plan sizes) mean nothing to an operator.
        spark.sparkContext.setLogLevel("ERROR")
    try:
        try:
            tables = write_tables(spark, args.inputs, args.out, args.late_ms)
        except AnalysisException as exc:
            if "PATH_NOT_FOUND" in str(exc):
                print(f"{prog}: no such input: {exc}", file=sys.stderr)
                return 2
            raise
        collected = collect_report(tables, args.top)
    finally:
        if owned:
            spark.stop()
    data = report.ReportData(
        inputs=list(args.inputs),
        out=args.out,
        late_ms=args.late_ms,
        elapsed_s=time.monotonic() - started,
        rows=collected,
    )
    report_dir = Path(args.report_dir)
    html = report.write_report(data, report_dir)
    summary = report.summary(data)
    (report_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    print(report.console_summary(summary, html))
    return 0


if __name__ == "__main__":
    sys.exit(main())
