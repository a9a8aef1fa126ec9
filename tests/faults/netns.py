"""The fault suite's private network: a namespace of its own, and iptables cuts inside it.

Why this shape (docs/faults.md says it for operators):

- Every run is a process re-executed inside `unshare --net` (as root), with its loopback
  brought up. Everything of the run (the cluster, its agreement server, the clients, the
  checker) lives and dies there: iptables rules never touch the machine's own network, and
  ports never collide with other test runs on the machine.
- Each node binds its own loopback address (`hexmq cluster up --hosts`), but a connection a
  process opens to 127.0.0.x leaves from 127.0.0.1 whatever process opens it (the kernel picks
  the local route's source), and gRPC has no option to bind a client's source address. So each
  node's processes run with a group id of their own (`--node-wrapper 'setpriv --regid ...'`),
  and a NAT rule (iptables `-m owner --gid-owner`, POSTROUTING) rewrites the source of every
  connection a node opens to the node's own address. Servers then see the true peer, and a
  connection between two nodes carries their two addresses in its conntrack entry.
- A cut "A cannot send to B" drops, in INPUT, every packet of a connection whose conntrack
  reply tuple names A and B the right way round (`-m conntrack --ctreplsrc/--ctrepldst` with
  `--ctdir`): whichever side opened the connection. Plain `-s A -d B` rules are not enough on
  loopback: the reply packets of a NATed connection reach INPUT already translated back to
  127.0.0.1. The clients of the workload connect from 127.0.0.1 without NAT and are never cut,
  so no node may use 127.0.0.1 itself.
- A cut drops packets silently, as a real partition does (TCP sees silence, not a reset).
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Set in the environment of the process re-executed inside the namespace.
INSIDE = "HEXMQ_FAULTS_NETNS"
# Node i's processes run with group id GID_BASE * 10 + i (setpriv); at most 9 nodes.
GID_BASE = 4710
CLIENT_ADDR = "127.0.0.1"
# A comment on every rule this module adds, so a listing shows what is ours.
COMMENT = "hexmq-faults"
REQUIRED_COMMANDS = ("unshare", "iptables", "ip", "setpriv")


def node_gid(node: int) -> int:
    if not 1 <= node <= 9:
        raise ValueError(f"the fault network has group ids for nodes 1-9, not {node}")
    return GID_BASE * 10 + node


NODE_EXEC = Path(__file__).with_name("node-exec")


def node_wrapper(faketime: tuple[str, str] | None = None) -> str:
    """The `--node-wrapper` that gives node i's processes group id node_gid(i) and, with
    `faketime` (libfaketime's path, the offset file with {node} in it), a wall clock of its
    own (tests/faults/node-exec)."""
    clock = f"{shlex.quote(faketime[0])} {shlex.quote(faketime[1])} " if faketime else ""
    return f"{shlex.quote(str(NODE_EXEC))} {GID_BASE}{{node}} {clock}--"


def why_unavailable() -> str | None:
    """Why a private network namespace with iptables cannot be made here (None: it can).
    Tries it for real: root alone does not say that unshare and iptables work (a container
    without CAP_SYS_ADMIN, a kernel without nf_tables or conntrack)."""
    if os.geteuid() != 0:
        return "the fault suite needs root (unshare --net, iptables); run it as root, as CI does"
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if missing:
        return f"missing command(s) {', '.join(missing)} (Debian: util-linux, iproute2, iptables)"
    probe = (
        "ip link set lo up && "
        "iptables -t nat -A POSTROUTING -m owner --gid-owner 1 -s 127.0.0.1 "
        "-j SNAT --to-source 127.0.0.2 && "
        "iptables -A INPUT -m conntrack --ctdir ORIGINAL --ctreplsrc 127.0.0.2 "
        "--ctrepldst 127.0.0.3 -j DROP && "
        "setpriv --regid 1 --clear-groups -- true"
    )
    try:
        done = subprocess.run(
            ["unshare", "--net", "--", "sh", "-c", probe],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare --net failed: {exc}"
    if done.returncode != 0:
        return (
            f"cannot make a network namespace with the iptables rules the suite needs "
            f"(exit {done.returncode}): {done.stderr.strip()[-500:]}"
        )
    return None


def inside() -> bool:
    return os.environ.get(INSIDE) == "1"


def reexec_argv(argv: Sequence[str]) -> list[str]:
    """The command line that runs `python argv...` in a fresh network namespace."""
    return ["unshare", "--net", "--", sys.executable, *argv]


def reexec_env() -> dict[str, str]:
    return {**os.environ, INSIDE: "1"}


def bring_up_loopback() -> None:
    _run(["ip", "link", "set", "lo", "up"])


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=20, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` failed ({done.returncode}): {done.stderr.strip()}")


def iptables(*args: str) -> None:
    _run(["iptables", "-w", *args])


def check_address(addr: str) -> None:
    """A node or agreement address: loopback, and never the clients' 127.0.0.1."""
    if not ipaddress.IPv4Address(addr).is_loopback or addr == CLIENT_ADDR:
        raise ValueError(f"{addr}: the fault network's addresses are 127.0.0.2-127.255.255.254")


@dataclass
class Network:
    """The cuts between the addresses of one run. `nodes`: node number -> its address;
    `agreement`: the agreement server's address (its own, so it can be cut alone)."""

    nodes: dict[int, str]
    agreement: str
    # (from, to) address pairs currently cut: `from` cannot send to `to`.
    cuts: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        for addr in [*self.nodes.values(), self.agreement]:
            check_address(addr)
        if len({*self.nodes.values(), self.agreement}) != len(self.nodes) + 1:
            raise ValueError("every node and the agreement server need an address of their own")

    def install(self) -> None:
        """Every node's outgoing connections leave from its own address."""
        for node, addr in sorted(self.nodes.items()):
            iptables(
                *("-t", "nat", "-A", "POSTROUTING"),
                *("-m", "owner", "--gid-owner", str(node_gid(node))),
                *("-s", CLIENT_ADDR, "-j", "SNAT", "--to-source", addr),
                *("-m", "comment", "--comment", COMMENT),
            )

    def cut(self, src: str, dst: str) -> None:
        """`src` can no longer send to `dst` (one way)."""
        if (src, dst) in self.cuts or src == dst:
            return
        # Connections `dst` opened to `src`: their replies (src -> dst) are the REPLY
        # direction, whose reply tuple is (src -> dst). Connections `src` opened to `dst`:
        # ORIGINAL direction, reply tuple (dst -> src).
        for ctdir, repl_src, repl_dst in (("REPLY", src, dst), ("ORIGINAL", dst, src)):
            iptables(
                *("-A", "INPUT", "-m", "conntrack", "--ctdir", ctdir),
                *("--ctreplsrc", repl_src, "--ctrepldst", repl_dst, "-j", "DROP"),
                *("-m", "comment", "--comment", f"{COMMENT} {src}->{dst}"),
            )
        self.cuts.add((src, dst))

    def cut_own(self, addr: str, port: int) -> None:
        """The processes of the node at `addr` can no longer reach its own service on `port`
        (issue 30: its edge from its partition service, its services from its agent); other
        nodes and the clients still can."""
        iptables(*own_cut_rule(addr, port))
        self.cuts.add((addr, f"{addr}:{port}"))

    def plain_cut(
        self, pairs: Iterable[tuple[str, str]], keep: Iterable[tuple[str, int]] = ()
    ) -> None:
        """Plain `-s A -d B -j DROP` rules, after rules that keep each (address, port) of
        `keep` (a node's Redis) reachable whatever they say."""
        for rule in plain_cut_rules(pairs, keep):
            iptables(*rule)
        self.cuts |= set(pairs)

    def cut_both(self, a: str, b: str) -> None:
        self.cut(a, b)
        self.cut(b, a)

    def partition(self, groups: Iterable[Iterable[str]]) -> None:
        """Cut every pair of addresses in different groups, both ways; an address in no
        group keeps every link."""
        sets = [set(g) for g in groups]
        for i, left in enumerate(sets):
            for right in sets[i + 1 :]:
                for a in left:
                    for b in right:
                        self.cut_both(a, b)

    def heal(self) -> None:
        """Every cut undone (the NAT rules stay)."""
        iptables("-F", "INPUT")
        self.cuts.clear()

    def rules(self) -> list[str]:
        done = subprocess.run(
            ["iptables", "-w", "-S"], capture_output=True, text=True, timeout=20, check=False
        )
        nat = subprocess.run(
            ["iptables", "-w", "-t", "nat", "-S"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return [*done.stdout.splitlines(), *nat.stdout.splitlines()]


def own_cut_rule(addr: str, port: int) -> list[str]:
    """iptables arguments that drop every packet of a connection the node at `addr` opened to
    its own `port`. Under the per-node source NAT its reply tuple runs from addr:port to addr
    (the NAT gave it the node's address); a client's (127.0.0.1) or another node's has
    another reply destination. `--ctreplsrcport` needs the protocol."""
    return [
        *("-A", "INPUT", "-p", "tcp", "-m", "conntrack"),
        *("--ctreplsrc", addr, "--ctrepldst", addr, "--ctreplsrcport", str(port)),
        *("-j", "DROP", "-m", "comment", "--comment", f"{COMMENT} own {addr}:{port}"),
    ]


def plain_cut_rules(
    pairs: Iterable[tuple[str, str]], keep: Iterable[tuple[str, int]] = ()
) -> list[list[str]]:
    """iptables arguments of a plain cut: `-s src -d dst -j DROP` per pair, as an operator
    would write them, after an ACCEPT of each kept (address, port) both ways (inserted first).

    Under the per-node source NAT they cut less than they say, and asymmetrically: a packet a
    node sends on a connection it opened carries its address, but the replies of its servers
    reach INPUT translated back to 127.0.0.1 (and a client's packets come from 127.0.0.1). So
    `-s A -d B` stops the connections A opens to B, not B's to A; `-s A -d 127.0.0.1` stops
    every reply of A's servers (to the clients, to the other nodes and to A's own processes:
    the cut a plain rule makes on a machine without the NAT, where every node's connections
    come from 127.0.0.1); `-s 127.0.0.1 -d A` stops the clients' packets to A. Which is why a
    node's Redis is kept: its partition service talks to it through the same address."""
    rules = [
        [
            *("-I", "INPUT", "1", "-p", "tcp", *match, "-j", "ACCEPT"),
            *("-m", "comment", "--comment", f"{COMMENT} keep {addr}:{port}"),
        ]
        for addr, port in keep
        for match in (("-d", addr, "--dport", str(port)), ("-s", addr, "--sport", str(port)))
    ]
    rules += [
        [
            *("-A", "INPUT", "-s", src, "-d", dst, "-j", "DROP"),
            *("-m", "comment", "--comment", f"{COMMENT} plain {src}->{dst}"),
        ]
        for src, dst in pairs
    ]
    return rules


def ring(nodes: Sequence[str]) -> list[tuple[str, str]]:
    """The pairs to cut for a majority ring: around the ring each node keeps its nearest
    neighbours, enough of them on each side that it sees a majority (itself included), and
    loses the rest, so every node sees a majority and no two see the same one (Jepsen's
    majorities-ring)."""
    n = len(nodes)
    if n < 5:
        raise ValueError(f"a majority ring needs at least 5 nodes, got {n}")
    side = (n // 2 + 1) // 2  # 1 + 2 * side >= n // 2 + 1

    def distance(i: int, j: int) -> int:
        return min((i - j) % n, (j - i) % n)

    return [
        (nodes[i], nodes[j]) for i in range(n) for j in range(i + 1, n) if distance(i, j) > side
    ]
