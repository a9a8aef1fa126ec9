"""Builders of small input frames for the transformation tests."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark.hexmq_traces.schema import SPANS_SCHEMA

# 2026-01-01T00:00:00Z in epoch nanoseconds, and shorthands for offsets from it.
T0 = 1_767_225_600_000_000_000
MS = 1_000_000
S = 1_000_000_000


def span_row(**values: Any) -> dict[str, Any]:
    """A spans-table row: every column null (attributes empty) except those given."""
    unknown = set(values) - set(SPANS_SCHEMA.fieldNames())
    assert not unknown, f"not span columns: {unknown}"
    row: dict[str, Any] = dict.fromkeys(SPANS_SCHEMA.fieldNames())
    row["attributes"] = {}
    row["status"] = "UNSET"
    row.update(values)
    if row["start_ns"] is not None and row["end_ns"] is not None and "duration_ms" not in values:
        row["duration_ms"] = (row["end_ns"] - row["start_ns"]) / MS
    return row


def spans_frame(spark: SparkSession, *rows: dict[str, Any]) -> DataFrame:
    return spark.createDataFrame(
        [tuple(r[f] for f in SPANS_SCHEMA.fieldNames()) for r in rows], SPANS_SCHEMA
    )
