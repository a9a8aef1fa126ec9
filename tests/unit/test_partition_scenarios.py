"""The partition master's command core (services/partition/commands.py over PartitionState)
driven without a node, an event loop or Redis (tests/support/partition_sim.py): each file in
partition_scenarios/ is a script of its language; the property test drives the same language
at random and prints the failing script, so a failure replays as a scenario."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from hexmq.api.common.v1.common_pb2 import Message
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition import commands, roles
from services.partition.effects import SendToAll
from services.partition.stored import StoredPartition, StoredSession
from services.partition.wills import WILL_LINK_GRACE_MS
from tests.support import scenario_script
from tests.support.partition_sim import Script, ScriptChaos, failure_kind
from tests.support.scenario_script import Run

SCENARIOS = Path(__file__).with_name("partition_scenarios")
FILES = sorted(SCENARIOS.glob("*.txt"))


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_scenario(path: Path) -> None:
    Script().run_file(path)


# ----- randomized: publishes, acks, disconnects, reconnects and takeovers, edge links lost and
# back, time; then every client reconnects and acknowledges all: each has every QoS 1 message
# published after it subscribed (at least once), and its queue is empty --------------------------

SEEDS = int(os.environ.get("SIM_SEEDS", "100"))
STEPS = 60
EDGES = ("e1", "e2")


class Chaos(ScriptChaos):
    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        self.clients = [f"c{i}" for i in range(rng.choice([2, 3, 4]))]
        setup = [f"nodes n1 partitions {rng.choice([1, 2, 3])}", *(f"link {e}" for e in EDGES)]
        for c in self.clients:
            setup += [f"connect {rng.choice(EDGES)} {c}", f"subscribe {c} t/+ 1"]
        setup.append("durable")
        super().__init__(f"seed {seed}", setup)
        self.published: list[str] = []

    def run(self, line: str) -> None:
        super().run(line)
        words = line.split()
        if words[0] == "publish" and words[3] == "1":
            self.published.append(words[4])

    def step(self) -> None:
        rng, sim = self.rng, self.sim
        linked = [e for e in EDGES if e in sim.links]
        online = [c for c in self.clients if sim.clients[c].conn]
        offline = [c for c in self.clients if not sim.clients[c].conn]
        kind = rng.choices(
            ["publish", "durable", "ack", "disconnect", "connect", "unlink", "link", "advance"],
            [6, 4, 3, 1, 2, 1, 1, 1],
        )[0]
        if kind == "publish" and online:
            qos = rng.choice([0, 1, 1])
            self.run(f"publish {rng.choice(online)} t/{rng.choice('xy')} {qos} m{len(self.lines)}")
        elif kind == "ack" and online:
            self.run(f"ack {rng.choice(online)}")
        elif kind == "disconnect" and online:
            self.run(f"disconnect {rng.choice(online)}")
        elif kind == "connect" and linked:
            # A client offline, or one online again (a takeover of its own session).
            self.run(f"connect {rng.choice(linked)} {rng.choice(offline or self.clients)}")
        elif kind == "unlink" and len(linked) == len(EDGES):
            self.run(f"unlink {rng.choice(linked)}")
        elif kind == "link" and len(linked) < len(EDGES):
            self.run(f"link {next(e for e in EDGES if e not in linked)}")
        elif kind == "advance":
            self.run(f"advance {rng.choice([10, 500, 2000])}")
        else:
            self.run("durable")

    def finish(self) -> None:
        for e in EDGES:
            if e not in self.sim.links:
                self.run(f"link {e}")
        for c in self.clients:
            if not self.sim.clients[c].conn:
                self.run(f"connect e1 {c}")
        self.run("durable")
        for _ in range(STEPS):
            for c in self.clients:
                self.run(f"ack {c}")
            self.run("durable")
        self.run("check answered")
        for c in self.clients:
            self.run(f"check has {c} {' '.join(self.published)}")
            self.run(f"check queued {c} 0")


def play_seed(seed: int, middle: list[str] | None) -> Run:
    return scenario_script.play(Chaos(seed), STEPS, middle)


def test_random_commands_lose_no_qos1_message() -> None:
    scenario_script.run_seeds(SEEDS, play_seed, failure_kind)


# ----- promotion, as the pure core has it (the load from Redis is the adapter's) -------------


def test_a_promoted_partition_holds_its_commands_then_activates_and_serves() -> None:
    script = Script()
    script.run_text("nodes n1 partitions 1\nlink e1\n")
    sim = script.s
    state, now = sim.state, sim.clock()
    roles.promote(state, 1, 2, 0)
    open_b = pb.EdgeCommand(
        request_id=99,
        partition=1,
        partition_epoch=2,
        open_session=pb.OpenSession(client_id="b", connection_id="e1.b.1", session_expiry_s=60),
    )
    # Loading: a command for it waits (the adapter queues it with its deadline).
    assert commands.handle(state, sim.links["e1"], open_b, now) == 1
    record = pb.SessionRecord(client_id="a", connection_id="e1.a.1", session_expiry_s=60)
    record.will.message.topic = "w/a"
    record.will.delay_interval_s = 3
    loaded = StoredPartition(
        sessions=[StoredSession(record, [pb.SubscriptionSpec(filter="t", qos=1)])],
        retained=[Message(topic="r", payload=b"x", retain=True)],
    )
    assert roles.activate(state, 1, 2, loaded, now)
    assert not roles.activate(state, 1, 2, loaded, now)  # once
    session = state.conns.sessions["a"]
    # Its connection lives on an edge that will re-attach it: its will waits for that.
    assert session.orphan == "e1.a.1"
    assert state.wills.due["a"] == now + WILL_LINK_GRACE_MS + 3000
    assert state.roles.mastered[1] == 2
    assert state.delivery.retained.get("r") is not None
    roles.serve(state, [1], 0)
    [announce] = state.outbox
    assert isinstance(announce, SendToAll)
    update = announce.event.index_update
    assert [(r.partition, r.epoch) for r in update.reset_partitions] == [(1, 2)]
    assert [(e.partition, e.filter, e.epoch) for e in update.entries] == [(1, "t", 2)]
    sim.carry()
    # The command that waited goes on now; demoted, the partition's state goes.
    assert commands.handle(state, sim.links["e1"], open_b, now) is None
    roles.demote(state, [1])
    assert set(state.conns.sessions) == set()
    assert state.index.refs == {}
    assert "a" not in state.wills.due
