"""The `spark` fixture (tests/spark/conftest.py): a Spark test that breaks the shared session
does not take the Spark tests after it down (make test at load 5-30: one Spark test hit its
timeout, and the 11 after it on that worker failed on the session it left), and one stuck in a
Spark call ends at its timeout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTS = "tests/spark/session_faults.py"

# A pytest of its own that starts three JVMs (at first, after the timeout, after the kill):
# about a minute on a quiet machine, 10 min at load 17 (150 s of make test's 3,337 in a quiet
# run), so it runs with the fault runs (make test-fault): it breaks the JVM on purpose. The
# timeout is a hang detector, not a speed check.
pytestmark = [pytest.mark.fault, pytest.mark.timeout(1200)]


def test_each_test_after_a_timeout_or_a_killed_jvm_gets_a_working_session(
    tmp_path: Path,
) -> None:
    # Not this run's xdist worker, options or markers: a plain pytest of the faults file.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYSPARK_"))}
    argv = [sys.executable, "-m", "pytest", FAULTS, "-p", "no:cacheprovider", "-rA", "-v"]
    argv += ["--durations=0"]
    argv += ["--basetemp", str(tmp_path / "inner")]
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1150, check=False
    )
    outcomes = {
        name: outcome
        for outcome, name in re.findall(
            rf"^(PASSED|FAILED|ERROR) {re.escape(FAULTS)}::(\w+)", done.stdout, re.MULTILINE
        )
    }
    assert outcomes == {
        "test_times_out_inside_a_spark_call": "FAILED",
        "test_after_a_timeout_and_kills_the_jvm": "PASSED",
        "test_after_a_killed_jvm": "PASSED",
    }, done.stdout[-6000:]
    assert "Timeout (>5.0s) from pytest-timeout" in done.stdout, done.stdout[-6000:]
    # Its job sleeps 240 s in the JVM: the test ended at its timeout and the watchdog's grace.
    (stuck,) = re.findall(
        r"^([0-9.]+)s call +\S+::test_times_out_inside_a_spark_call$", done.stdout, re.MULTILINE
    )
    assert float(stuck) < 120, done.stdout[-6000:]
