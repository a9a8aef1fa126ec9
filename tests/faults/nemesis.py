"""Nemeses and their schedules: which fault, when, for how long, against whom. Pure.

A schedule is a function of a seed (and the kinds allowed, the run's length and size): the
same seed gives the same faults at the same times, so `python -m tests.faults run --seed S`
replays a run. Faults come one at a time, each healed before a quiet period and the next.
Whom a fault hits is decided when it starts, from the agreed view at that moment (`targets`):
"the master of partition p" means the node that masters it then. The view can differ between
a run and its replay when timing differs, but the schedule, the partition and every other
random choice do not.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tests.faults.netns import ring

# kind -> (shortest, longest) seconds the fault lasts before it is healed.
DURATIONS: dict[str, tuple[float, float]] = {
    "kill-master": (4.0, 12.0),  # kill -9 of the node mastering a partition, restarted after
    "kill-follower": (4.0, 12.0),  # kill -9 of a node that only follows that partition
    "kill-majority": (4.0, 10.0),  # kill -9 of a majority of the nodes at once
    "pause": (3.0, 12.0),  # SIGSTOP of every process of a node, past the failure timeout
    "isolate": (4.0, 20.0),  # one node cut from every other and from the agreement server
    "halves": (4.0, 20.0),  # the nodes split in two, the agreement server on one side
    "ring": (4.0, 16.0),  # a majority ring (5 nodes or more)
    "cut-agreement": (6.0, 25.0),  # one node cut from the agreement server only
    "one-way": (4.0, 16.0),  # one node cannot send to the others (or receive from them)
    "agreement-restart": (3.0, 15.0),  # kill -9 of the agreement server, restarted after
    "redis-kill": (3.0, 10.0),  # kill -9 of one node's Redis, restarted after
    "clock-jump": (5.0, 15.0),  # one node's wall clock steps, and steps back after
    # `hexmq cluster leave` of a node (handover, RF restored without it, SIGTERM: its edge
    # sends its clients elsewhere), then `hexmq cluster start` of it: it joins again
    "leave-rejoin": (6.0, 16.0),
    # a spare node joins (`hexmq cluster add`: partitions move onto it), then leaves
    "join-leave": (8.0, 20.0),
    # issue 30: a node's own processes cut from one of its own services (its edge from its
    # partition service, its edge and partition service from its agent, or both)
    "intra-node": (4.0, 20.0),
    # issue 30: plain `-s/-d` DROP rules on a node's address, one way or both, as an operator
    # would write them: without the conntrack matching the per-node source NAT needs
    "plain-cut": (4.0, 20.0),
}
NETWORK = frozenset(
    {"isolate", "halves", "ring", "cut-agreement", "one-way", "intra-node", "plain-cut"}
)
KILLS = frozenset({"kill-master", "kill-follower", "kill-majority"})
ELASTIC = frozenset({"leave-rejoin", "join-leave"})
# The node numbers of a fault network (tests/faults/netns.py gives each a group id).
MAX_NODES = 9
# How far a clock jumps (seconds, either way).
CLOCK_JUMPS = (30, 120, 600, 3600)


@dataclass(frozen=True)
class Fault:
    index: int
    kind: str
    at: float  # seconds after the workload started
    duration: float
    pick: int  # the random number `targets` turns into nodes, fixed by the seed
    jump_s: int = 0  # clock-jump: how far (+ forward, - back)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def kinds_for(
    nodes: int, kinds: Sequence[str] | None = None, *, colocated: bool = False
) -> list[str]:
    """The kinds a cluster of `nodes` nodes can take (a ring needs five; a join, a spare
    node's number; an intra-node cut, a process per service)."""
    chosen = list(DURATIONS) if kinds is None else list(kinds)
    unknown = [k for k in chosen if k not in DURATIONS]
    if unknown:
        raise ValueError(f"unknown nemesis {', '.join(unknown)}; known: {', '.join(DURATIONS)}")
    if colocated:
        if kinds is not None and "intra-node" in chosen:
            raise ValueError(
                "intra-node cuts a node's services from each other, and a co-located node "
                "runs them in one process"
            )
        chosen = [k for k in chosen if k != "intra-node"]
    if nodes < 5:
        chosen = [k for k in chosen if k != "ring"]
    if nodes + 1 > MAX_NODES:
        chosen = [k for k in chosen if k != "join-leave"]
    if not chosen:
        raise ValueError(f"no nemesis left for {nodes} nodes")
    return chosen


def schedule(
    seed: int,
    kinds: Sequence[str],
    length: float,
    *,
    first_at: float = 4.0,
    quiet: tuple[float, float] = (5.0, 9.0),
) -> list[Fault]:
    """Faults from `first_at` until `length` seconds (the last one may end after it), one at
    a time, with a quiet period drawn from `quiet` after each."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    t = first_at
    while t < length:
        kind = rng.choice(list(kinds))
        low, high = DURATIONS[kind]
        duration = round(rng.uniform(low, high), 1)
        jump = rng.choice(CLOCK_JUMPS) * rng.choice((1, -1)) if kind == "clock-jump" else 0
        faults.append(Fault(len(faults), kind, round(t, 1), duration, rng.getrandbits(31), jump))
        t += duration + rng.uniform(*quiet)
    return faults


@dataclass
class Targets:
    """What a fault does, in nodes (numbers, 1-based) and address groups."""

    nodes: list[int] = field(default_factory=list)  # killed, paused, cut off, clock jumped
    partition: int | None = None  # kill-master / kill-follower: the partition chosen
    # Network faults: node groups (the agreement server as node 0) cut from each other.
    groups: list[list[int]] = field(default_factory=list)
    # Network faults: (from, to) node pairs cut one way (0: the agreement server).
    one_way: list[tuple[int, int]] = field(default_factory=list)
    # The nodes on the minority side (G7: their clients must stay connected).
    minority: list[int] = field(default_factory=list)
    # intra-node: the services of `nodes[0]` its own processes can no longer reach
    # (OWN_SERVICES: "partition", its edge's links; "membership", its services' agent).
    own: list[str] = field(default_factory=list)
    # plain-cut: (from, to) pairs, each one rule `-s from -d to -j DROP` (AGREEMENT: the
    # agreement server; CLIENTS: 127.0.0.1, where the clients are and where, without the
    # source NAT, every node's connections come from).
    plain: list[tuple[int, int]] = field(default_factory=list)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


AGREEMENT = 0
# plain-cut: 127.0.0.1, as a peer in a rule.
CLIENTS = -1
# intra-node: which of a node's own services its own processes lose, and who uses them.
OWN_SERVICES = {
    "partition": "its edge -> its partition service",
    "membership": "its edge and partition service -> its agent",
}


def targets(
    fault: Fault, nodes: Sequence[int], table: Sequence[Sequence[int]], *, spare: int = 0
) -> Targets:
    """The nodes a fault hits, given the live nodes and the agreed table (per partition its
    replicas, master first, as node numbers) and the spare node a join adds. Deterministic
    in fault.pick."""
    rng = random.Random(fault.pick)
    live = sorted(nodes)
    n = len(live)
    majority = n // 2 + 1
    kind = fault.kind
    if kind in ("kill-master", "kill-follower"):
        candidates = [p for p, replicas in enumerate(table) if replicas and replicas[0] in live]
        if not candidates:
            return Targets(note="no partition has a live master")
        p = rng.choice(candidates)
        replicas = [r for r in table[p] if r in live]
        if kind == "kill-master":
            return Targets(nodes=[replicas[0]], partition=p)
        followers = replicas[1:]
        if not followers:
            return Targets(partition=p, note=f"partition {p} has no live follower")
        return Targets(nodes=[rng.choice(followers)], partition=p)
    if kind == "kill-majority":
        return Targets(nodes=sorted(rng.sample(live, majority)))
    if kind in ("pause", "redis-kill", "clock-jump"):
        return Targets(nodes=[rng.choice(live)])
    if kind == "isolate":
        node = rng.choice(live)
        rest = [x for x in live if x != node]
        return Targets(nodes=[node], groups=[[node], [*rest, AGREEMENT]], minority=[node])
    if kind == "halves":
        order = list(live)
        rng.shuffle(order)
        small, large = sorted(order[: n // 2]), sorted(order[n // 2 :])
        agreement_with_small = rng.random() < 0.5
        if agreement_with_small:
            groups = [[*small, AGREEMENT], large]
        else:
            groups = [small, [*large, AGREEMENT]]
        where = "minority" if agreement_with_small else "majority"
        return Targets(
            nodes=small, groups=groups, minority=small, note=f"agreement server on the {where}"
        )
    if kind == "ring":
        order = list(live)
        rng.shuffle(order)
        cuts = ring(order)
        pairs = [*cuts, *((b, a) for a, b in cuts)]
        return Targets(nodes=order, one_way=sorted(pairs), note=f"ring order {order}")
    if kind == "cut-agreement":
        node = rng.choice(live)
        return Targets(
            nodes=[node], one_way=[(node, AGREEMENT), (AGREEMENT, node)], minority=[node]
        )
    if kind == "one-way":
        node = rng.choice(live)
        others = [x for x in live if x != node]
        if rng.random() < 0.5:
            return Targets(
                nodes=[node], one_way=[(node, o) for o in others], note="cannot send to the others"
            )
        return Targets(
            nodes=[node], one_way=[(o, node) for o in others], note="cannot hear from the others"
        )
    if kind == "intra-node":
        node = rng.choice(live)
        own = rng.choice((["partition"], ["membership"], ["partition", "membership"]))
        return Targets(nodes=[node], own=own, note="; ".join(OWN_SERVICES[s] for s in own) + " cut")
    if kind == "plain-cut":
        node = rng.choice(live)
        how = rng.choice(("cannot send", "cannot hear", "both ways"))
        clients = rng.random() < 0.5
        peers = [*(x for x in live if x != node), AGREEMENT, *((CLIENTS,) if clients else ())]
        plain = []
        if how != "cannot hear":
            plain += [(node, peer) for peer in peers]
        if how != "cannot send":
            plain += [(peer, node) for peer in peers]
        who = "the other nodes, the agreement server" + (" and 127.0.0.1" if clients else "")
        return Targets(
            nodes=[node], plain=plain, minority=[node], note=f"{how}: plain rules with {who}"
        )
    if kind == "agreement-restart":
        return Targets()
    if kind == "leave-rejoin":
        if n < 2:
            return Targets(note="a lone live node has nobody to leave to")
        return Targets(nodes=[rng.choice(live)])
    if kind == "join-leave":
        if not spare:
            return Targets(note="no spare node to join")
        return Targets(nodes=[spare])
    raise ValueError(f"unknown nemesis {kind!r}")
