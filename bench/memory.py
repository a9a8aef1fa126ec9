"""Edge memory per idle connection: `python -m bench.memory` (`make bench-memory`).

Each round starts a fresh one-node hexmq (`hexmq cluster up`, as bench/brokers.py does) and a
fresh Debian mosquitto, opens WARM idle clean-session MQTT 3.1.1 clients to each (CONNECT with
`--keepalive` seconds, 60 by default as paho's and most clients', wait for CONNACK, then nothing
for less than that) and keeps them, reads the broker process's resident
memory (VmRSS, /proc/PID/status), opens N more, and reads it again. The figure is the growth per
1,000 connections, in MiB: the warm-up absorbs what a process allocates once (interpreter
caches, the first arenas), and a fresh broker per round means no memory freed by an earlier
round is reused (a process's RSS does not shrink when connections close). Only the MQTT-facing
process is measured: hexmq's edge (its partition service holds the session records, which
mosquitto keeps in its one process; the other processes' growth is in the JSON output).

Clients are plain non-blocking sockets in this process (no MQTT library per client), so the
generator costs little: the open-file limit (20,000 here) bounds N.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.brokers import LOOPBACK, Broker, BrokerFailure, make_broker
from hexmq.mqtt import ConnAck, Connect, MQTTConnection, Role

CONNECT_TIMEOUT_S = 60.0
# After the last CONNACK: time for the broker to finish what a CONNECT starts (the session's
# open at the partition, the CONNACK's write) before memory is read.
SETTLE_S = 1.0


def rss_kib(pid: int) -> int:
    """The process's resident set size in KiB (VmRSS)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_clients(port: int, n: int, tag: str, keepalive: int) -> list[socket.socket]:
    """`n` connected, idle MQTT 3.1.1 clients (clean session, Keep Alive `keepalive`: the
    broker keeps a timer for each unless it is 0), each past its CONNACK."""
    sel = selectors.DefaultSelector()
    socks: list[socket.socket] = []
    pending: dict[socket.socket, MQTTConnection] = {}
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    try:
        for i in range(n):
            s = socket.create_connection((LOOPBACK, port), timeout=10)
            s.setblocking(False)
            codec = MQTTConnection(Role.CLIENT)
            s.sendall(codec.send(Connect(f"mem-{tag}-{i}", clean_start=True, keepalive=keepalive)))
            socks.append(s)
            pending[s] = codec
            sel.register(s, selectors.EVENT_READ)
            if len(pending) >= 200 or i == n - 1:
                while pending and (len(pending) >= 100 or i == n - 1):
                    _read_connacks(sel, pending, deadline)
        return socks
    except BaseException:
        for s in socks:
            s.close()
        raise
    finally:
        sel.close()


def _read_connacks(
    sel: selectors.BaseSelector, pending: dict[socket.socket, MQTTConnection], deadline: float
) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise BrokerFailure(f"{len(pending)} clients got no CONNACK in {CONNECT_TIMEOUT_S:g} s")
    for key, _ in sel.select(timeout=min(left, 1.0)):
        s = key.fileobj
        assert isinstance(s, socket.socket)
        data = s.recv(4096)
        if not data:
            raise BrokerFailure("the broker closed a client before its CONNACK")
        codec = pending[s]
        codec.receive_data(data)
        event = codec.next_event()
        if isinstance(event, ConnAck):
            if event.reason_code != 0:
                raise BrokerFailure(f"CONNACK {event.reason_code}")
            sel.unregister(s)
            del pending[s]


def close_clients(socks: list[socket.socket]) -> None:
    disconnect = b"\xe0\x00"  # DISCONNECT (3.1.1): a normal end, nothing left behind
    for s in socks:
        try:
            s.send(disconnect)
        except OSError:
            pass
        s.close()


def measured_pid(broker: Broker) -> int:
    return broker.pids.get("hexmq-edge") or broker.pids["mosquitto"]


def one_round(broker: Broker, n: int, warm: int, tag: str, keepalive: int) -> dict[str, Any]:
    pid = measured_pid(broker)
    warm_socks = open_clients(broker.port, warm, f"{tag}-warm", keepalive)
    time.sleep(SETTLE_S)
    before = rss_kib(pid)
    others_before = {name: rss_kib(p) for name, p in broker.pids.items() if p != pid}
    started = time.monotonic()
    socks = open_clients(broker.port, n, tag, keepalive)
    connect_s = time.monotonic() - started
    time.sleep(SETTLE_S)
    after = rss_kib(pid)
    others_after = {name: rss_kib(p) for name, p in broker.pids.items() if p != pid}
    close_clients(socks + warm_socks)
    per_1000 = (after - before) / 1024 / n * 1000
    return {
        "connections": n,
        "keepalive_s": keepalive,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "mib_per_1000": round(per_1000, 3),
        "connect_s": round(connect_s, 2),
        "other_processes_kib_growth": {k: others_after[k] - others_before[k] for k in others_after},
    }


def machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "commit": commit,
        "loadavg": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__)
    parser.add_argument("--connections", type=int, default=5000, metavar="N")
    parser.add_argument("--warm", type=int, default=500, metavar="N", help="warm-up clients")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--keepalive",
        type=int,
        default=60,
        metavar="S",
        help="the clients' Keep Alive (0: none, so the broker keeps no timer for them); a "
        "round must end within 1.5 times it (default %(default)s)",
    )
    parser.add_argument("--broker", choices=["hexmq", "mosquitto", "both"], default="both")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the results here")
    args = parser.parse_args(argv)
    if not 0 <= args.keepalive <= 65535:
        parser.error("--keepalive must be 0-65535 seconds")
    names = ["hexmq", "mosquitto"] if args.broker == "both" else [args.broker]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:  # in turn, so drift touches both alike
            broker = make_broker(name)
            try:
                broker.start()
                result = one_round(broker, args.connections, args.warm, f"r{r}", args.keepalive)
            finally:
                broker.stop()
                broker.cleanup(keep=False)
            results[name].append(result)
            print(
                f"{name:10} round {r + 1}: {result['mib_per_1000']:.2f} MiB per 1,000 idle "
                f"connections ({result['rss_before_kib']} -> {result['rss_after_kib']} KiB "
                f"for {args.connections} more)",
                file=sys.stderr,
            )
    doc = {"machine": machine(), "results": results}
    for name, runs in results.items():
        figures = sorted(run["mib_per_1000"] for run in runs)
        median = figures[len(figures) // 2] if figures else None
        doc.setdefault("median_mib_per_1000", {})[name] = median
        print(f"{name}: {median} MiB per 1,000 idle clean-session connections (median)")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
