"""The agreement planner (services/membership/plan.py) run by simulated agents over an
in-memory Consul (tests/support/agreement_sim.py).

Each file in agreement_scenarios/ is a script of the simulator's language (one command a line,
`#` comments); the randomized test drives the same language and prints a failing seed's
script, shrunk, so a failure replays as a scenario.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import scenario_script
from tests.support.agreement_sim import Script, SimError
from tests.support.scenario_script import Run

SCENARIOS = Path(__file__).with_name("agreement_scenarios")
FILES = sorted(SCENARIOS.glob("*.txt"))


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_scenario(path: Path) -> None:
    Script().run_file(path)


def test_unknown_commands_and_failed_checks_name_the_line() -> None:
    with pytest.raises(SimError, match=r"x\.txt:2: 'frobnicate n1': unknown command"):
        Script("x.txt").run_text("nodes 2 partitions 1 rf 2\nfrobnicate n1\n")
    with pytest.raises(SimError, match=r"x\.txt:3: .*members: expected \['n1'\], got"):
        Script("x.txt").run_text("nodes 2 partitions 2 rf 2\ntick 3\ncheck members n1\n")


# ----- randomized: kills, restarts, pauses, cuts and time; then heal, wait, and compare ------

SEEDS = 200
STEPS = 40
QUIET = 60  # ticks after everything healed: 6 s, twice what rejoins, catch-up and handovers take


class Chaos:
    """Picks random faults that make sense in the simulation's current state."""

    def __init__(self, seed: int, *, elastic: bool = False) -> None:
        self.rng = rng = random.Random(seed)
        self.elastic = elastic
        nodes = rng.choice([2, 3, 3, 4, 5])
        self.lines = [
            f"nodes {nodes} partitions {rng.choice([4, 8, 16])} rf {rng.choice([2, 3])}"
            f" ttl {rng.choice([3000, 10000])} settle {rng.choice([0, 500, 1000])}"
            f" catchup {rng.choice([1, 3, 8])}"
        ]
        if elastic:
            # Spare nodes join by `restart`; members leave (and may come back the same way).
            self.lines[0] += f" spare {rng.choice([1, 2])}"
        self.script = Script(f"seed {seed}")
        self.script.run_line(self.lines[0])

    def run(self, line: str) -> None:
        self.lines.append(line)
        self.script.run_line(line, len(self.lines))

    def step(self) -> None:
        rng, sim = self.rng, self.script.s
        names = sorted(sim.nodes)
        running = [n for n in names if sim.nodes[n].running]
        dead = [n for n in names if not sim.nodes[n].alive]
        paused = [n for n in names if sim.nodes[n].paused]
        cut = sorted(tuple(sorted(pair)) for pair, healed in sim.cuts.items() if healed is None)
        choices: list[tuple[int, Callable[[], str]]] = [
            (30, lambda: f"tick {rng.choice([1, 2, 5, 10, 20])}"),
            (4, lambda: "cut {} {}".format(*rng.sample(names, 2))),
        ]
        members = {m.node_id for m in sim.view.members} if sim.view else set()
        leavers = [n for n in running if n in members and not sim.nodes[n].leaving]
        if self.elastic and leavers:
            choices.append((4, lambda: f"leave {rng.choice(leavers)}"))
        if running:
            choices.append((3, lambda: f"kill {rng.choice(running)}"))
            choices.append((3, lambda: f"pause {rng.choice(running)}"))
        if dead:
            choices.append((4, lambda: f"restart {rng.choice(dead)}"))
        if paused:
            choices.append((4, lambda: f"resume {rng.choice(paused)}"))
        if cut:
            choices.append((4, lambda: "heal {} {}".format(*rng.choice(cut))))
            choices.append((1, lambda: "heal"))
        weights = [w for w, _ in choices]
        self.run(rng.choices([make for _, make in choices], weights=weights)[0]())

    def finish(self) -> None:
        sim = self.script.s
        self.run("heal")
        for n in sorted(sim.nodes):
            if sim.nodes[n].paused:
                self.run(f"resume {n}")
            elif not sim.nodes[n].alive:
                self.run(f"restart {n}")
        self.run(f"tick {QUIET}")
        self.run("check goal")


def play(seed: int, middle: list[str] | None = None, *, elastic: bool = False) -> Run:
    """Seed `seed`'s setup, then `middle` (or STEPS random commands), then the finish."""
    return scenario_script.play(Chaos(seed, elastic=elastic), STEPS, middle)


def kind(error: SimError) -> str:
    """What failed, without the numbers and the view that broke it: `not at goal: members`,
    `p master n@ ->`, `removed n (by`..."""
    text = str(error).split("': ", 1)[-1]
    text = re.sub(r"^view \d+ \(proposed by \w+ at tick \d+\): ", "", text)
    return " ".join(re.sub(r"\d", "", text).split()[:4])


def test_random_faults_keep_every_view_safe_and_converge() -> None:
    """Every seed: random kills, restarts, pauses (longer or shorter than the session TTL),
    cuts and heals between agents, and time; the simulator checks every agreed view against
    the one before it (epochs, promotions from in_sync only, one master per partition epoch,
    removals by a rule only, and only of a node that was really dead, paused, restarted or cut
    from a majority). Then heal everything, restart the dead, wait: the view must reach the
    goal, every partition placed as assign() over all nodes places it, all in sync."""
    run_seeds(elastic=False)


def test_random_joins_and_leaves_amid_faults_keep_every_view_safe_and_converge() -> None:
    """As above, with spare nodes that join (and may be killed mid-transfer) and members that
    leave (and may crash while leaving, or come back): every removal is a loss by the rules or
    a finished leave (nothing held), a replica dropped alive leaves RF in sync, and after the
    finish every node, spares and leavers restarted, is placed as assign() over all of them."""
    run_seeds(elastic=True)


def run_seeds(*, elastic: bool) -> None:
    scenario_script.run_seeds(SEEDS, lambda seed, middle: play(seed, middle, elastic=elastic), kind)
