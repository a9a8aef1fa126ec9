"""The simulators' shared script runner and seed runs (tests/support/scenario_script.py), on a
toy simulation: a counter that must stay below a limit."""

from __future__ import annotations

import random

import pytest

from tests.support import scenario_script
from tests.support.scenario_script import Run, ScriptError, ScriptRunner, SimError


class Counter:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.value = 0

    def add(self, n: int) -> None:
        if n < 0:
            raise ScriptError("only additions")
        self.value += n
        if self.value >= self.limit:
            raise SimError(f"value {self.value} reached the limit {self.limit}")


class Script(ScriptRunner[Counter]):
    def __init__(self, source: str = "<script>") -> None:
        super().__init__(source)
        self.commands = {
            "nodes": lambda a: setattr(self, "sim", Counter(int(a[0]))),
            "add": lambda a: self.s.add(int(a[0])),
            "check": self.do_check,
        }
        self.checks = {"value": lambda a: self.expect("value", self.s.value, int(a[0]))}


def test_a_script_runs_line_by_line_and_errors_name_the_line() -> None:
    script = Script("toy.txt")
    script.run_text("nodes 10  # the limit\n\nadd 2\nadd 3 # more\ncheck value 5\n")
    assert script.s.value == 5
    with pytest.raises(SimError, match=r"toy\.txt:2: 'check value 4': value: expected 4, got 5"):
        script.run_text("# again\ncheck value 4\n")
    with pytest.raises(ScriptError, match=r"toy\.txt:1: 'frobnicate': unknown command"):
        script.run_text("frobnicate")
    with pytest.raises(ScriptError, match=r"unknown check 'colour'"):
        script.run_line("check colour red")
    with pytest.raises(ScriptError, match="'add x': invalid literal"):
        script.run_line("add x")
    with pytest.raises(ScriptError, match="the first command must be `nodes`"):
        Script().run_line("add 1")


class Chaos:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lines = ["nodes 20"]
        self.script = Script(f"seed {seed}")
        self.script.run_line(self.lines[0])

    def run(self, line: str) -> None:
        self.lines.append(line)
        self.script.run_line(line)

    def step(self) -> None:
        self.run(f"add {self.rng.choice([0, 0, 0, 1, 9])}")

    def finish(self) -> None:
        self.run("check value 0")


def play(seed: int, middle: list[str] | None = None) -> Run:
    return scenario_script.play(Chaos(seed), 12, middle)


def kind(error: SimError) -> str:
    return str(error).split("': ", 1)[-1].split()[0]


def test_a_failing_seed_is_reported_with_its_script_shrunk() -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        scenario_script.run_seeds(5, play, kind)
    report = str(failed.value)
    assert "of 5 seeds failed" in report
    # Each kind of failure is shrunk to the fewest commands that still fail that way.
    assert "shrunk to a scenario:\nnodes 20\nadd 9\nadd 9\nadd 9\n" in report
    assert "shrunk to a scenario:\nnodes 20\nadd 1\ncheck value 0" in report


def test_seeds_that_all_pass_report_nothing() -> None:
    scenario_script.run_seeds(3, lambda seed, middle: Run(["nodes 1"], [], None), kind)
