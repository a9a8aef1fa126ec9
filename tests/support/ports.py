"""Free loopback ports for tests and benchmarks, the one place they are picked.

Ports are drawn at random below the kernel's ephemeral range: a port the kernel hands out for
bind(0) is soon handed to an outgoing connection's local end or to the next bind(0) as well,
and could be taken between the check and the process that binds it. Under pytest-xdist each
worker draws from a share of its own (`worker_window`), so that a test that stops a process
and starts it again on its port cannot find it taken by another worker meanwhile.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
# The lowest port drawn (below it: well-known services and fixed ports of other tools).
LOW = 20000


def ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_window(low: int, top: int, span: int) -> tuple[int, int]:
    """The ports [low, top) of this pytest-xdist worker's own share: workers never draw
    overlapping ranges, so a test that stops a node and starts it again on its ports cannot
    find them taken by another worker's cluster meanwhile (make test: "cannot serve metrics
    on ...: Address already in use" in test_two_nodes_stop_and_start_one)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or count < 2:
        return low, top
    width = (top - low) // count
    if width < 2 * span:
        return low, top  # too narrow to share: drawn from the whole range as before
    index = int(worker[2:]) % count
    return low + index * width, low + (index + 1) * width


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now."""
    ports: list[int] = []
    low, top = worker_window(LOW, ephemeral_low(), 1)
    while len(ports) < count:
        port = random.randint(low, top - 1)
        if port not in ports and port_free(port):
            ports.append(port)
    return ports


def free_port() -> int:
    """One port free on 127.0.0.1 now."""
    (port,) = free_ports(1)
    return port
