"""The span contract is written twice on purpose (the Spark job must run where only pyspark is
installed); this keeps the two copies the same."""

from __future__ import annotations

from hexmq import telemetry
from spark.hexmq_traces import schema


def _names(cls: type) -> dict[str, str]:
    return {k: v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str)}


def test_span_names_agree() -> None:
    assert _names(schema.SpanName) == _names(telemetry.SpanName)


def test_every_attribute_the_job_reads_is_one_the_services_write() -> None:
    written = set(_names(telemetry.Attr).values())
    read = {key for key, _, _ in schema.ATTRIBUTE_COLUMNS}
    # "messaging.operation" is the older semantic-convention key, read as a fallback only.
    assert read - {"messaging.operation"} <= written


def test_the_unacknowledged_delivery_status_agrees() -> None:
    # The audit counts a delivery whose connection closed before its PUBACK as sent.
    assert schema.DELIVER_UNACKNOWLEDGED == telemetry.names.DELIVER_UNACKNOWLEDGED
