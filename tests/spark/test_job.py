"""The job end to end on a few hand-written OTLP JSON lines, in local mode and on a standalone
Spark cluster, and the synthetic trace generator."""

from __future__ import annotations

import contextlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.testing import assertDataFrameEqual

from spark.hexmq_traces import job, synth
from spark.hexmq_traces.schema import STAGES, SpanName
from tests.spark import standalone
from tests.spark.conftest import SharedSession, watched

# The whole job (JVM stages, Parquet writes and reads) on local[2]: near the end of `make test`
# the 2 cores are shared with other workers' clusters, and main() alone took 96 s there (make
# test at 48c3bf5 hit the default 120 s per test). A hang detector, not a speed check.
pytestmark = pytest.mark.timeout(360)

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
MS = 1_000_000

# Trace ids of the hand-written messages.
OK = "4bf92f3577b34da6a3ce929d0e0e4736"
LOST = "0af7651916cd43dd8448eb211c80319c"  # one subscriber never acks its QoS 1 delivery
DUPLICATED = "5b8efff798038103d269b633813fc60c"  # one subscriber gets the message twice
LATE = "1e8a5c4b2d3f40718293a4b5c6d7e8f9"  # published while its partition had no master
ORPHAN = "c0ffee00c0ffee00c0ffee00c0ffee00"  # the edge's publish span never arrived
SUB_A = "5ab1e5ab1e5ab1e5"
SUB_B = "b0b0b0b0b0b0b0b0"


def _span(
    trace: str,
    span: str,
    parent: str | None,
    name: str,
    start_ms: float,
    end_ms: float,
    **attrs: Any,
) -> dict[str, Any]:
    """An OTLP JSON span. Attribute keywords spell a dot as _ and an underscore as __
    (hexmq_subscriber__hash= is hexmq.subscriber_hash)."""
    values = []
    for key, value in attrs.items():
        typed = {"intValue": str(value)} if isinstance(value, int) else {"stringValue": value}
        values.append(
            {"key": key.replace("__", "\0").replace("_", ".").replace("\0", "_"), "value": typed}
        )
    doc: dict[str, Any] = {
        "traceId": trace,
        "spanId": span,
        "name": name,
        "kind": 1,
        "startTimeUnixNano": str(T0 + int(start_ms * MS)),
        "endTimeUnixNano": str(T0 + int(end_ms * MS)),
        "attributes": values,
        "status": {},
    }
    if parent is not None:
        doc["parentSpanId"] = parent
    return doc


def _request(service: str, node: str, *spans: dict[str, Any]) -> str:
    resource = {
        "attributes": [
            {"key": "service.name", "value": {"stringValue": service}},
            {"key": "hexmq.node", "value": {"stringValue": node}},
        ]
    }
    return json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]})


def _trace_lines() -> list[str]:
    edge_n1 = _request(
        "hexmq-edge", "n1",
        _span(OK, "a000000000000001", None, "mqtt.publish", 0, 3, hexmq_qos=1,
              messaging_destination_name="plant/1/temp", messaging_message_id="101"),
        _span(OK, "a000000000000002", "a000000000000001", "edge.route", 0.1, 0.2,
              hexmq_route_partitions=1),
        _span(LOST, "b000000000000001", None, "mqtt.publish", 1000, 1004, hexmq_qos=1,
              messaging_destination_name="plant/2/temp", messaging_message_id="102"),
        _span(LOST, "b000000000000002", "b000000000000001", "edge.route", 1000.1, 1000.2,
              hexmq_route_partitions=1),
        _span(DUPLICATED, "c000000000000001", None, "mqtt.publish", 2000, 2005, hexmq_qos=1,
              messaging_destination_name="plant/1/temp", messaging_message_id="103"),
        _span(DUPLICATED, "c000000000000002", "c000000000000001", "edge.route", 2000.1,
              2000.2, hexmq_route_partitions=1),
        _span(LATE, "d000000000000001", None, "mqtt.publish", 10500, 11801, hexmq_qos=0,
              messaging_destination_name="plant/3/temp", messaging_message_id="104",
              x_vendor_extra="ignored"),
        _span(LATE, "d000000000000002", "d000000000000001", "edge.route", 10500.1, 10500.2,
              hexmq_route_partitions=1),
    )  # fmt: skip
    partition_n2 = _request(
        "hexmq-partition", "n2",
        _span(OK, "a000000000000003", "a000000000000001", "partition.append", 0.3, 1,
              hexmq_partition=7, hexmq_partition_epoch=1, hexmq_subscribers=1),
        _span(OK, "a000000000000004", "a000000000000003", "partition.replicate", 0.4, 0.8,
              hexmq_partition=7, hexmq_follower="n3", hexmq_replication_lag=2),
        _span(OK, "a000000000000005", "a000000000000003", "partition.ack", 0.8, 1),
        _span(LOST, "b000000000000003", "b000000000000001", "partition.append", 1000.3, 1001,
              hexmq_partition=7, hexmq_partition_epoch=1, hexmq_subscribers=2),
        _span(LOST, "b000000000000004", "b000000000000003", "partition.replicate", 1000.4,
              1000.9, hexmq_partition=7, hexmq_follower="n3"),
        _span(LOST, "b000000000000005", "b000000000000003", "partition.ack", 1000.9, 1001),
        _span(DUPLICATED, "c000000000000003", "c000000000000001", "partition.append", 2000.3,
              2001, hexmq_partition=7, hexmq_partition_epoch=1, hexmq_subscribers=1),
        _span(DUPLICATED, "c000000000000004", "c000000000000003", "partition.replicate",
              2000.4, 2000.7, hexmq_partition=7, hexmq_follower="n3"),
        _span(DUPLICATED, "c000000000000005", "c000000000000003", "partition.ack", 2000.7,
              2001),
    )  # fmt: skip
    edge_n3 = _request(
        "hexmq-edge", "n3",
        _span(OK, "a000000000000006", "a000000000000003", "mqtt.deliver", 1.5, 2,
              hexmq_subscriber__hash=SUB_A, hexmq_qos=1),
        _span(OK, "a000000000000007", "a000000000000006", "mqtt.client_ack", 2, 3),
        _span(LOST, "b000000000000006", "b000000000000003", "mqtt.deliver", 1001.5, 1002,
              hexmq_subscriber__hash=SUB_A, hexmq_qos=1),
        _span(LOST, "b000000000000007", "b000000000000006", "mqtt.client_ack", 1002, 1003),
        _span(LOST, "b000000000000008", "b000000000000003", "mqtt.deliver", 1001.5, 1002.5,
              hexmq_subscriber__hash=SUB_B, hexmq_qos=1),
        _span(DUPLICATED, "c000000000000006", "c000000000000003", "mqtt.deliver", 2001.5, 2002,
              hexmq_subscriber__hash=SUB_A, hexmq_qos=1),
        _span(DUPLICATED, "c000000000000007", "c000000000000006", "mqtt.client_ack", 2002,
              2003),
        _span(DUPLICATED, "c000000000000008", "c000000000000003", "mqtt.deliver", 2003, 2004,
              hexmq_subscriber__hash=SUB_A, hexmq_qos=1),
        _span(DUPLICATED, "c000000000000009", "c000000000000008", "mqtt.client_ack", 2004,
              2005),
        _span(LATE, "d000000000000004", "d000000000000003", "mqtt.deliver", 11800, 11801,
              hexmq_subscriber__hash=SUB_B, hexmq_qos=0),
        _span(ORPHAN, "e000000000000004", "e000000000000003", "mqtt.deliver", 3000, 3001,
              hexmq_subscriber__hash=SUB_B, hexmq_qos=0),
    )  # fmt: skip
    # n2 dies; n1's membership notices at 10 s and installs view 2 at 11.5 s; n3 takes over
    # partition 7 until 11.7 s. The LATE publish waits for it.
    failover = _request(
        "hexmq-membership", "n1",
        _span("f" * 32, "f000000000000001", None, "membership.view", 10000, 11500,
              hexmq_view_epoch=2, hexmq_node_lost="n2"),
    )  # fmt: skip
    partition_n3 = _request(
        "hexmq-partition", "n3",
        _span("9" * 32, "9000000000000001", None, "partition.failover", 11500, 11700,
              hexmq_partition=7, hexmq_partition_epoch=2, hexmq_view_epoch=2,
              hexmq_node_lost="n2"),
        _span(LATE, "d000000000000003", "d000000000000001", "partition.append", 11700, 11750,
              hexmq_partition=7, hexmq_partition_epoch=2, hexmq_subscribers=1),
    )  # fmt: skip
    # A crashed writer's torn last line: skipped, not fatal.
    return [edge_n1, partition_n2, edge_n3, failover, partition_n3, '{"resourceSpans": [{"re']


SPANS_WRITTEN = 8 + 9 + 11 + 1 + 2


@dataclass(frozen=True)
class LocalRun:
    """The job run once in local mode on the hand-written traces: what it wrote and printed."""

    traces: Path
    out: Path
    code: int
    printed: str


@pytest.fixture(scope="module")
def local_run(
    spark_shared: SharedSession,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> LocalRun:
    """Once for this file's tests of the whole job: its first run in a fresh JVM takes minutes
    on a loaded machine (JIT and planning about 25 small Spark jobs, not data), and both the
    local-mode test and the cluster test's comparison need exactly this run."""
    spark_shared.usable()
    base = tmp_path_factory.mktemp("local-run")
    traces = base / "traces"
    traces.mkdir()
    lines = _trace_lines()
    (traces / "edge-n1.jsonl").write_text("\n".join(lines[:3]) + "\n")
    (traces / "edge-n1.jsonl.000001").write_text("\n".join(lines[3:]) + "\n")
    out = base / "out"
    printed = io.StringIO()
    with watched(spark_shared, request), contextlib.redirect_stdout(printed):
        code = job.main([str(traces), "--out", str(out), "--late-ms", "500"])
    return LocalRun(traces, out, code, printed.getvalue())


def test_main_writes_tables_and_a_report_naming_bad_messages(
    spark: SparkSession, local_run: LocalRun
) -> None:
    out = local_run.out
    assert local_run.code == 0, local_run.printed

    assert spark.read.parquet(str(out / "spans")).count() == SPANS_WRITTEN
    assertDataFrameEqual(
        spark.read.parquet(str(out / "messages")).select(
            "trace_id", "message_id", "status", "lost", "duplicated", "late", "nodes"
        ),
        spark.createDataFrame(
            [
                (OK, "101", "ok", 0, 0, 0, ["n1", "n2", "n3"]),
                (LOST, "102", "lost", 1, 0, 0, ["n1", "n2", "n3"]),
                (DUPLICATED, "103", "duplicated", 0, 1, 0, ["n1", "n2", "n3"]),
                (LATE, "104", "late", 0, 0, 1, ["n1", "n3"]),
            ],
            "trace_id string, message_id string, status string, lost bigint, "
            "duplicated bigint, late bigint, nodes array<string>",
        ),
    )
    assertDataFrameEqual(
        spark.read.parquet(str(out / "failover_timeline")).select(
            "view_epoch", "node_lost", "partitions_failed_over", "max_no_master_ms",
            "affected_publishes", "affected_latency_max_ms",
        ),
        spark.createDataFrame(
            [(2, "n2", 1, 1700.0, 1, 1301.0)],
            "view_epoch bigint, node_lost string, partitions_failed_over bigint, "
            "max_no_master_ms double, affected_publishes bigint, affected_latency_max_ms double",
        ),
    )  # fmt: skip
    orphans = spark.read.parquet(str(out / "orphan_traces")).select("trace_id").collect()
    assert [r.trace_id for r in orphans] == [ORPHAN]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["message_status"] == {
        "ok": 1, "lost": 1, "duplicated": 1, "late": 1, "incomplete": 0
    }  # fmt: skip
    assert summary["nodes_lost"] == ["n2"]
    html = (out / "report.html").read_text()
    for bad in (LOST, DUPLICATED, LATE, "102", "103"):
        assert bad in html
    assert OK not in html  # only problems are listed
    assert sorted(p.name for p in (out / "charts").iterdir()) == [
        "latency.png", "partitions.png", "replication.png", "stages.png"
    ]  # fmt: skip
    assert "lost 1, duplicated 1, late 1" in local_run.printed


# Two JVM daemons, spark-submit's driver and the worker's executor: minutes on a loaded machine.
# A hang detector, not a speed check.
@pytest.mark.timeout(1200)
def test_the_job_on_a_standalone_cluster_writes_the_tables_of_local_mode(
    spark: SparkSession, local_run: LocalRun, tmp_path: Path
) -> None:
    assert local_run.code == 0, local_run.printed
    on_cluster, local = tmp_path / "cluster", local_run.out

    with standalone.standalone_cluster(tmp_path) as (url, master_log):
        done = standalone.submit(url, local_run.traces, on_cluster, tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        # It ran on the cluster: the master registered the job and gave it an executor.
        registered = master_log.read_text(errors="replace")
        assert "Registering app " in registered, registered[-3000:]
        assert "Launching executor" in registered, registered[-3000:]

    tables = standalone.tables(local)
    assert standalone.tables(on_cluster) == tables
    assert {"spans", "deliveries", "messages", "failover_timeline"} <= set(tables)
    for table in tables:
        assertDataFrameEqual(
            spark.read.parquet(str(on_cluster / table)), spark.read.parquet(str(local / table))
        )
    assert standalone.summary(on_cluster) == standalone.summary(local)


def test_main_refuses_missing_input(tmp_path: Path, spark: SparkSession) -> None:
    assert job.main([str(tmp_path / "nothing-here"), "--out", str(tmp_path / "out")]) == 2


def test_synth_writes_otlp_json_of_the_contract(tmp_path: Path) -> None:
    assert synth.main(["--spans", "400", "--out", str(tmp_path), "--files", "2"]) == 0

    names: set[str] = set()
    spans = 0
    for path in sorted(tmp_path.iterdir()):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        spans += 1
                        names.add(span["name"])
                        assert re.fullmatch("[0-9a-f]{32}", span["traceId"])
                        assert re.fullmatch("[0-9a-f]{16}", span["spanId"])
                        assert span["startTimeUnixNano"].isdigit()
    assert spans >= 400
    assert set(STAGES) <= names <= set(STAGES) | {
        SpanName.MEMBERSHIP_VIEW, SpanName.FAILOVER
    }  # fmt: skip
