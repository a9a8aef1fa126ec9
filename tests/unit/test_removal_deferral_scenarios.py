"""The deferred removal of a QoS 1 message (issue 28) over random interleavings: publishes at
QoS 1 and 2, PUBACKs, PUBRECs and PUBCOMPs, the committer's batches made durable, the clock and
failovers of the master (the edges' connections dropped, or kept and re-attached with the
acknowledgements not answered yet), played on the partition simulation
(tests/support/partition_sim.py), whose committer asks the CommitQueue on the simulation's
clock. Then every client comes back and acknowledges all. Each seed checks:
- no QoS >= 1 message answered to its publisher is lost: each subscriber was sent it, though
  its master failed over with its removal (or the message) unwritten;
- a QoS 2 message never comes again once its subscriber had its PUBREL;
- no acknowledgement is answered before the removal it made is durable (the sim raises);
- every removal went within its linger of its acknowledgement (the removal linger for a QoS 1
  message's, the lazy linger for a PUBCOMP's), or with the next write; and QoS 1 removals alone
  waited the removal linger out.
A failing seed prints its script, shrunk, ready to save in partition_scenarios/."""

from __future__ import annotations

import os
import random

from tests.support import scenario_script
from tests.support.partition_sim import ScriptChaos, failure_kind
from tests.support.scenario_script import Run

SEEDS = int(os.environ.get("SIM_SEEDS_DEFERRAL", "200"))
STEPS = 60


class Chaos(ScriptChaos):
    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.subscribers = [f"s{i}" for i in range(rng.choice([1, 2, 3]))]
        self.clients = ["p", *self.subscribers]
        setup = [f"nodes n1 partitions {rng.choice([1, 2])}", "link e1", "connect e1 p"]
        for c in self.subscribers:
            setup += [f"connect e1 {c}", f"subscribe {c} a 1", f"subscribe {c} b 2"]
        setup += ["durable", "advance 10"]
        super().__init__(f"seed {seed}", setup)

    def step(self) -> None:
        rng, sim = self.rng, self.sim
        online = [c for c in self.subscribers if sim.clients[c].conn]
        offline = [c for c in self.clients if not sim.clients[c].conn]
        kind = rng.choices(
            ["publish", "ack", "pubrec", "pubcomp", "commit", "advance", "connect", "failover"],
            [5, 4, 2, 2, 4, 4, 3, 1],
        )[0]
        if kind == "publish" and sim.clients["p"].conn:
            topic, qos = rng.choice([("a", 1), ("b", 2)])
            self.run(f"publish p {topic} {qos} m{len(self.lines)}")
        elif kind in ("ack", "pubrec", "pubcomp") and online:
            self.run(f"{kind} {rng.choice(online)}")
        elif kind == "advance":
            self.run(f"advance {rng.choice([1, 4, 10, 40, 100])}")
        elif kind == "connect" and offline:
            self.run(f"connect e1 {rng.choice(offline)}")
        elif kind == "failover":
            self.run(rng.choice(["failover", "failover reattach"]))
        else:
            self.run("commit")

    def finish(self) -> None:
        self.run("check deferral")
        for c in self.clients:
            if not self.sim.clients[c].conn:
                self.run(f"connect e1 {c}")
        self.run("durable")
        for _ in range(4):
            for c in self.subscribers:
                self.run(f"ack {c}")
                self.run(f"pubrec {c}")
            self.run("durable")
            for c in self.subscribers:
                self.run(f"pubcomp {c}")
            self.run("durable")
        self.run("check answered")
        for c in self.subscribers:
            self.run(f"check has-published {c}")
            self.run(f"check once {c}")
            self.run(f"check queued {c} 0")


def test_random_deferred_removals_lose_nothing_and_keep_their_lingers() -> None:
    def play(seed: int, middle: list[str] | None) -> Run:
        return scenario_script.play(Chaos(seed), STEPS, middle)

    scenario_script.run_seeds(SEEDS, play, failure_kind)
