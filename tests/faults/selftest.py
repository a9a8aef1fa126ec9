"""The namespace machinery alone, in seconds (`python -m tests.faults selftest`, and the
smoke test in `make test`): two echo servers as nodes 1 and 2 on their own addresses, each
under its node's group id; a connection between them carries the true addresses (NAT by
group id), a one-way cut 1 -> 2 stops traffic both ways a connection needs, the clients'
127.0.0.1 is never cut, and the heal restores everything. Then issue 30's cuts: node 1's own
processes cut from its own server while node 2 and the clients reach it (`intra-node`), and
plain rules (`plain-cut`): `-s n1 -d n2` stops what n1 opens to n2 but not what n2 opens to
n1; `-s n1 -d 127.0.0.1` stops every reply of n1's servers (to n2, to n1 itself, to the
clients) but those of the port it keeps (its Redis). Runs inside the namespace."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from tests.faults import netns

SERVER = """
import socket, sys, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()
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
    address = (sys.argv[1], int(sys.argv[3]))
    with socket.create_connection(address, timeout=float(sys.argv[2])) as c:
        c.sendall(b"?"); print(c.recv(100).decode())
except OSError:
    print("timeout")
"""


def _as_node(node: int) -> list[str]:
    return ["setpriv", "--regid", str(netns.node_gid(node)), "--clear-groups", "--"]


def ask(dst: str, as_node: int | None, timeout: float = 1.0, port: int = 7000) -> str:
    """The peer address `dst`'s server sees, asked from node `as_node` (None: a client)."""
    argv = [*(_as_node(as_node) if as_node else []), sys.executable, "-c", CLIENT, dst]
    done = subprocess.run(
        [*argv, str(timeout), str(port)], capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout.strip() or done.stderr.strip()


def selftest() -> int:
    netns.bring_up_loopback()
    addrs = {1: "127.0.0.11", 2: "127.0.0.12"}
    network = netns.Network(addrs, "127.0.0.10")
    network.install()
    # Node 1 also serves on 7001: the port a plain cut keeps (as it keeps a node's Redis).
    listening = [(1, addrs[1], 7000), (2, addrs[2], 7000), (1, addrs[1], 7001)]
    servers = [
        subprocess.Popen([*_as_node(n), sys.executable, "-c", SERVER, addr, str(port)])
        for n, addr, port in listening
    ]
    try:
        for _n, addr, port in listening:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection((addr, port), timeout=1).close()
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
        issue30, expected30 = _issue30_cuts(network, addrs)
    finally:
        for server in servers:
            server.kill()
            server.wait()
    problems = []
    for what, got, want in (
        ("before the cut", seen, expected),
        ("during the cut", cut, expected_cut),
        ("after the heal", healed, {"n1->n2": addrs[1], "n2->n1": addrs[2]}),
        *((f"issue 30, {what}", issue30[what], expected30[what]) for what in expected30),
    ):
        if got != want:
            problems.append(f"{what}: {got}, expected {want}")
    for problem in problems:
        print(f"selftest: {problem}", file=sys.stderr)
    if not problems:
        print("selftest: NAT by group id, one-way cut and heal work")
        print("selftest: a node's own cut, plain cuts and a kept port work")
    return 1 if problems else 0


def _issue30_cuts(
    network: netns.Network, addrs: dict[int, str]
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """Issue 30's cuts for real, each healed after: what was seen, what must be."""
    seen: dict[str, dict[str, str]] = {}
    network.cut_own(addrs[1], 7000)
    seen["n1 cut from its own server"] = {
        "n1->n1": ask(addrs[1], 1),
        "n2->n1": ask(addrs[1], 2),
        "client->n1": ask(addrs[1], None),
    }
    network.heal()
    network.plain_cut([(addrs[1], addrs[2])])
    seen["plain -s n1 -d n2"] = {"n1->n2": ask(addrs[2], 1), "n2->n1": ask(addrs[1], 2)}
    network.heal()
    network.plain_cut([(addrs[1], netns.CLIENT_ADDR)], keep=[(addrs[1], 7001)])
    seen["plain -s n1 -d 127.0.0.1, 7001 kept"] = {
        "n1->n1": ask(addrs[1], 1),
        "n2->n1": ask(addrs[1], 2),
        "client->n1": ask(addrs[1], None),
        "n1->n2": ask(addrs[2], 1),
        "n1->n1:7001": ask(addrs[1], 1, port=7001),
    }
    network.heal()
    expected = {
        "n1 cut from its own server": {
            "n1->n1": "timeout",
            "n2->n1": addrs[2],
            "client->n1": netns.CLIENT_ADDR,
        },
        "plain -s n1 -d n2": {"n1->n2": "timeout", "n2->n1": addrs[2]},
        "plain -s n1 -d 127.0.0.1, 7001 kept": {
            "n1->n1": "timeout",
            "n2->n1": "timeout",
            "client->n1": "timeout",
            "n1->n2": addrs[1],
            "n1->n1:7001": addrs[1],
        },
    }
    return seen, expected
