"""Which fault runs `make test-fault` makes: a fixed, seeded set, or (FAULT_RUNS=N) N random
ones from a base seed (FAULT_SEED, else one drawn and printed)."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(".hexmq/faults")


@dataclass(frozen=True)
class RunSpec:
    name: str
    seed: int
    nodes: int = 3
    kinds: tuple[str, ...] | None = None  # None: every kind the size allows
    length: float = 45.0
    trace: bool = False
    # Each node one process (`hexmq cluster up --colocated`, the default of `cluster up`)
    # rather than a process per service.
    colocated: bool = False

    def argv(self, out: Path) -> list[str]:
        """`python -m tests.faults ...` arguments: also the replay command of a failure."""
        return [
            "run",
            *("--seed", str(self.seed), "--nodes", str(self.nodes)),
            *(("--kinds", ",".join(self.kinds)) if self.kinds else ()),
            *("--length", f"{self.length:g}", "--out", str(out), "--name", self.name),
            *(("--trace",) if self.trace else ()),
            *(("--colocated",) if self.colocated else ()),
        ]


# The fixed set: every nemesis at least once (tests/faults/test_nemesis.py checks that the
# seeds' schedules cover them), in six runs of a few minutes together. The traced one is
# also checked against the Spark job's audit (tests/faults/crosscheck.py): no kills there, so
# no span is lost with a killed process.
FIXED = (
    RunSpec(
        "kills-and-pauses",
        1452,
        kinds=("kill-master", "kill-follower", "kill-majority", "pause"),
        length=40.0,
    ),
    RunSpec(
        "splits-3-nodes",
        1218,
        kinds=("isolate", "cut-agreement", "one-way"),
        length=40.0,
        trace=True,
    ),
    RunSpec("splits-5-nodes", 1302, nodes=5, kinds=("halves", "ring"), length=30.0),
    RunSpec(
        "agreement-redis-clock",
        1418,
        kinds=("agreement-restart", "redis-kill", "clock-jump"),
        length=40.0,
    ),
    RunSpec("joins-and-leaves", 1505, kinds=("leave-rejoin", "join-leave"), length=40.0),
    # Issue 30: a node's own services cut from each other, and plain rules (one of them cuts
    # a node from everything, 127.0.0.1 included, for 19.8 s: the scenario).
    RunSpec("own-and-plain-cuts", 1635, kinds=("intra-node", "plain-cut"), length=40.0),
    # Co-located nodes, `hexmq cluster up`'s default (issue 28): a node's edge, partition
    # service and agent in one process, so a kill or a pause takes all three at once.
    RunSpec(
        "colocated-kills-and-splits",
        2172,
        kinds=("kill-master", "kill-follower", "pause", "isolate", "one-way", "redis-kill"),
        length=60.0,
        colocated=True,
    ),
    RunSpec(
        "colocated-joins-and-kills",
        2831,
        kinds=("kill-master", "kill-majority", "pause", "one-way", "leave-rejoin"),
        length=60.0,
        colocated=True,
    ),
)


def random_specs(runs: int, base: int) -> list[RunSpec]:
    """`runs` random runs from `base`: the seed decides the size (one in three has five nodes)
    and the packing (odd seeds co-located nodes, even ones a process per service), every
    nemesis the packing allows."""
    return [
        RunSpec(f"seed-{seed}", seed, nodes=5 if seed % 3 == 0 else 3, colocated=seed % 2 == 1)
        for seed in range(base, base + runs)
    ]


def campaign_from_environment() -> tuple[int, int] | None:
    """(runs, base seed) from FAULT_RUNS / FAULT_SEED; None without FAULT_RUNS."""
    text = os.environ.get("FAULT_RUNS", "").strip()
    if not text:
        return None
    try:
        runs = int(text)
    except ValueError:
        raise ValueError(f"FAULT_RUNS must be a whole number, got {text!r}") from None
    if runs < 1:
        raise ValueError(f"FAULT_RUNS must be at least 1, got {runs}")
    seed_text = os.environ.get("FAULT_SEED", "").strip()
    try:
        base = int(seed_text) if seed_text else random.SystemRandom().randrange(1, 10**6)
    except ValueError:
        raise ValueError(f"FAULT_SEED must be a whole number, got {seed_text!r}") from None
    return runs, base
