"""An extra `hexmq edge` process with options of a test's choosing, beside a cluster started by
the `hexmq_cluster` fixtures: it joins the cluster through the node's membership service, with
its own edge id, and is stopped (by its pid) when the test or module is done.

Used where the cluster's own edge cannot serve: several listeners on free ports, or a
password-protected edge (the cluster's readiness probe connects anonymously)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexmq.trust.identity import EDGE
from tests.conftest import HEXMQ
from tests.support.ports import free_ports
from tests.support.processes import end
from tests.support.trust import cluster_env


@dataclass
class EdgeProcess:
    proc: subprocess.Popen[bytes]
    port: int  # the plain MQTT listener
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        # The plain stop (SIGTERM would first wait up to 5 s for its node to leave).
        end(self.proc, signal.SIGINT)


def membership_addr(cluster: Any, node: int = 1) -> str:
    return f"127.0.0.1:{cluster.node(node)['membership_port']}"


@contextlib.contextmanager
def edge_process(
    cluster: Any,
    workdir: Path,
    args: Sequence[str] = (),
    *,
    name: str = "edge",
    node: int = 1,
    env: Mapping[str, str] | None = None,
) -> Iterator[EdgeProcess]:
    """Start `hexmq edge --node-id NAME` linked to `cluster`'s node, with `args` (and `env`
    instead of this process's environment); yield once it has linked to every partition node;
    stop it afterwards."""
    (port,) = free_ports(1)
    log = workdir / f"{name}.log"
    argv = [
        str(HEXMQ),
        "edge",
        *("--node-id", name),
        *("--listen", f"127.0.0.1:{port}"),
        *("--membership", membership_addr(cluster, node)),
        "--sys-interval=0",
        *args,
    ]
    # An edge of its own name: its certificate from the cluster's CA names it.
    env = {**(os.environ if env is None else env), **cluster_env(cluster.dir, EDGE, name)}
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    edge = EdgeProcess(proc, port, log)
    try:
        _wait_linked(edge, len(cluster.nodes))
        yield edge
    finally:
        edge.stop()


def _wait_linked(edge: EdgeProcess, partition_nodes: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if edge.proc.poll() is not None:
            raise AssertionError(
                f"hexmq edge exited with {edge.proc.returncode}:\n{edge.log_text()}"
            )
        text = edge.log_text()
        if "MQTT on" in text and text.count("ready; re-attached") >= partition_nodes:
            return
        time.sleep(0.05)
    raise AssertionError(f"hexmq edge did not link within {timeout} s:\n{edge.log_text()}")


def run_edge_expecting_failure(args: Sequence[str], timeout: float = 30) -> tuple[int, str]:
    """Run `hexmq edge` with arguments it must refuse at startup: (exit code, its stderr)."""
    (port,) = free_ports(1)
    argv = [
        str(HEXMQ),
        "edge",
        *("--node-id", "bad"),
        *("--listen", f"127.0.0.1:{port}"),
        *("--membership", "127.0.0.1:1"),
        "--startup-timeout=1",
        *args,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    return result.returncode, result.stderr
