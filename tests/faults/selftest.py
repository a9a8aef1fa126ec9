"""The namespace machinery alone, in seconds (`python -m tests.faults selftest`, and the
smoke test in `make test`): two echo servers as nodes 1 and 2 on their own addresses, each
under its node's group id; a connection between them carries the true addresses (NAT by
group id), a one-way cut 1 -> 2 stops traffic both ways a connection needs, the clients'
127.0.0.1 is never cut, and the heal restores everything. Runs inside the namespace."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from tests.faults import netns

SERVER = """
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 7000)); s.listen()
def serve(c, peer):
    with c:
        while data := c.recv(100):
            c.sendall(peer[0].encode())
while True:
    c, peer = s.accept()
    threading.Thread(target=serve, args=(c, peer), daemon=True).start()
"""

CLIENT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], 7000), timeout=float(sys.argv[2])) as c:
        c.sendall(b"?"); print(c.recv(100).decode())
except OSError:
    print("timeout")
"""


def _as_node(node: int) -> list[str]:
    return ["setpriv", "--regid", str(netns.node_gid(node)), "--clear-groups", "--"]


def ask(dst: str, as_node: int | None, timeout: float = 1.0) -> str:
    """The peer address `dst`'s server sees, asked from node `as_node` (None: a client)."""
    argv = [*(_as_node(as_node) if as_node else []), sys.executable, "-c", CLIENT, dst]
    done = subprocess.run(
        [*argv, str(timeout)], capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout.strip() or done.stderr.strip()


def selftest() -> int:
    netns.bring_up_loopback()
    addrs = {1: "127.0.0.11", 2: "127.0.0.12"}
    network = netns.Network(addrs, "127.0.0.10")
    network.install()
    servers = [
        subprocess.Popen([*_as_node(n), sys.executable, "-c", SERVER, addr])
        for n, addr in addrs.items()
    ]
    try:
        for addr in addrs.values():
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection((addr, 7000), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        seen = {
            "n1->n2": ask(addrs[2], 1),
            "n2->n1": ask(addrs[1], 2),
            "client->n2": ask(addrs[2], None),
        }
        expected = {"n1->n2": addrs[1], "n2->n1": addrs[2], "client->n2": "127.0.0.1"}
        network.cut(addrs[1], addrs[2])
        cut = {
            "n1->n2": ask(addrs[2], 1),
            "n2->n1": ask(addrs[1], 2),
            "client->n2": ask(addrs[2], None),
            "client->n1": ask(addrs[1], None),
        }
        expected_cut = {
            "n1->n2": "timeout",
            "n2->n1": "timeout",  # n1's answers to n2 cannot reach it
            "client->n2": "127.0.0.1",
            "client->n1": "127.0.0.1",
        }
        network.heal()
        healed = {"n1->n2": ask(addrs[2], 1), "n2->n1": ask(addrs[1], 2)}
    finally:
        for server in servers:
            server.kill()
            server.wait()
    problems = []
    for what, got, want in (
        ("before the cut", seen, expected),
        ("during the cut", cut, expected_cut),
        ("after the heal", healed, {"n1->n2": addrs[1], "n2->n1": addrs[2]}),
    ):
        if got != want:
            problems.append(f"{what}: {got}, expected {want}")
    for problem in problems:
        print(f"selftest: {problem}", file=sys.stderr)
    if not problems:
        print("selftest: NAT by group id, one-way cut and heal work")
    return 1 if problems else 0
