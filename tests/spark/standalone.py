"""A standalone Spark cluster for the trace job's test on a Spark cluster (tests/spark/test_job.py):
a master and a worker started from the installed pyspark (loopback only), and spark-submit's
command line for it (docs/traces.md says how to run the job on a cluster).

Nothing of hexmq is installed for the cluster's executors: the job uses only built-in Spark SQL
functions, so only the driver (spark-submit's) imports spark.hexmq_traces.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from tests.support import start_bounds
from tests.support.ports import free_ports
from tests.support.processes import end

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent
CLASS = {
    "master": "org.apache.spark.deploy.master.Master",
    "worker": "org.apache.spark.deploy.worker.Worker",
}
DAEMON_START_BOUND_S = 600  # a JVM each: 10-15 s here at load 15; JVM starts took 290 s loaded
QUIET_DAEMON_START_S = 12.0
SUBMIT_BOUND_S = 900  # the job's driver and executor JVMs and its stages, on a loaded machine


def spark_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(tmp_path / "logs"),
        SPARK_WORKER_DIR=str(tmp_path / "work"),
        # The master's REST submission server would take a fixed port (6066): off.
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    )
    return env


def wait_for_line(log: Path, text: str, process: subprocess.Popen[bytes], bound: float) -> None:
    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.2)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no log)"
    pytest.fail(f"{log.name}: no {text!r} within {bound:.0f} s (exit {process.poll()}):\n{tail}")


@contextlib.contextmanager
def standalone_cluster(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A standalone Spark master and one worker (2 cores) on 127.0.0.1: its master URL and the
    master's log. Both are ended, by pid, on the way out."""
    env = spark_env(tmp_path)
    port, master_ui, worker_ui = free_ports(3)
    url = f"spark://127.0.0.1:{port}"
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    commands = {
        "master": ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(master_ui)],
        "worker": [
            *(url, "--host", "127.0.0.1", "--cores", "2", "--memory", "1g"),
            *("--webui-port", str(worker_ui), "--work-dir", str(tmp_path / "work")),
        ],
    }
    ready = {
        "master": ("master", "I have been elected leader"),
        "worker": ("master", "Registering worker"),
    }
    processes: list[subprocess.Popen[bytes]] = []
    logs = {name: tmp_path / f"{name}.log" for name in CLASS}
    try:
        for name, args in commands.items():
            with logs[name].open("wb") as out:
                processes.append(
                    subprocess.Popen(
                        [spark_class, CLASS[name], *args],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
            log, text = ready[name]
            # Timed like a cluster start and kept off this test's timeout (start_bounds).
            with start_bounds.outside_test_timeout(DAEMON_START_BOUND_S):
                started = time.monotonic()
                wait_for_line(logs[log], text, processes[-1], DAEMON_START_BOUND_S)
                start_bounds.record_start(time.monotonic() - started, QUIET_DAEMON_START_S)
        yield url, logs["master"]
    finally:
        for process in reversed(processes):
            end(process, grace=30)  # a JVM's shutdown hooks, on a loaded machine


def submit(url: str, traces: Path, out: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """spark-submit the job to the cluster at `url`: its tables and summary into `out`."""
    argv = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        *("--master", url),
        *("--conf", "spark.driver.host=127.0.0.1"),
        *("--conf", "spark.driver.bindAddress=127.0.0.1"),
        *("--conf", "spark.ui.enabled=false"),
        # As the shared local session's: every shuffle partition is a task, and a task on
        # a standalone executor costs more than in local mode.
        *("--conf", "spark.sql.shuffle.partitions=2"),
        *("--executor-memory", "512m"),
        str(ROOT / "spark" / "hexmq_traces" / "job.py"),
        *(str(traces), "--out", str(out), "--late-ms", "500"),
    ]
    return subprocess.run(
        argv,
        env=spark_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=SUBMIT_BOUND_S,
        check=False,
    )


def tables(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if (p / "_SUCCESS").exists())


def summary(out: Path) -> dict[str, object]:
    """summary.json without what differs between any two runs (where it went, how long)."""
    doc = json.loads((out / "summary.json").read_text())
    return {k: v for k, v in doc.items() if k not in ("out", "elapsed_s")}
