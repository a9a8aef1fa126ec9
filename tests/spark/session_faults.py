"""Spark tests that break the shared session on purpose, in order. Its name keeps this file out
of the suite: tests/spark/test_session_fixture.py runs it in a pytest of its own and expects
the first test to fail (a timeout inside a Spark call) and every later one to pass, each on a
working session from the `spark` fixture although the test before it left the shared one
broken: a py4j connection with an answer nobody read, a dead JVM."""

from __future__ import annotations

import os
import signal

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

# A first job on a new JVM took 60-75 s at load 15-20 (the JVM's start is outside the timeout).
pytestmark = pytest.mark.timeout(360)


def works(spark: SparkSession) -> None:
    """A job with a shuffle, through the fixture's session."""
    numbers = spark.range(10)
    counts = numbers.groupBy((numbers.id % 2).alias("odd")).count()
    assert sorted(row["count"] for row in counts.collect()) == [5, 5]


@pytest.mark.timeout(5)
def test_times_out_inside_a_spark_call(spark: SparkSession) -> None:
    # The job sleeps 240 s in the JVM: pytest-timeout's signal interrupts the Python side while
    # it waits for py4j's answer, which comes later (if the JVM still runs), on a connection
    # nobody reads; pyspark's cleanup on the way out waits for it meanwhile.
    spark.range(1).selectExpr("java_method('java.lang.Thread', 'sleep', 240000L)").collect()


def test_after_a_timeout_and_kills_the_jvm(spark: SparkSession) -> None:
    works(spark)
    gateway = SparkContext._gateway
    assert gateway is not None
    jvm = gateway.proc  # the JVM pyspark started for this pytest (spark-submit execs java)
    os.kill(jvm.pid, signal.SIGKILL)
    jvm.wait(30)


def test_after_a_killed_jvm(spark: SparkSession) -> None:
    works(spark)
