"""One local SparkSession for every Spark test: starting one costs 5-15 s here, so every Spark
test shares it (the Spark testing guide's session-scoped fixture)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from spark.hexmq_traces.job import build_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # The job's own settings (loopback, no UI, UTC), with fewer shuffle partitions: test
    # frames have a handful of rows, and every partition is a task.
    session = build_session(master="local[2]", shuffle_partitions=2)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
