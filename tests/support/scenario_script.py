"""What the deterministic simulators share (tests/support/replication_sim.py,
tests/support/agreement_sim.py): the script runner of their scenario language, and the
randomized runs over many seeds that print a failing seed's script, shrunk, ready to save as a
scenario.

A script is one command a line, `#` starting a comment; its first command, `nodes ...`, makes
the simulation, and `check NAME ARGS` runs one of the simulator's checks. An error names the
script and line that raised it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import pytest


class SimError(AssertionError):
    """The simulated core broke an invariant, or a check failed."""


class ScriptError(SimError):
    """A script asked for something impossible (an unknown node or command, a down node, a
    message that is not there)."""


S = TypeVar("S")
Handler = Callable[[list[str]], None]


class ScriptRunner(Generic[S]):
    """Runs scenario lines against a simulation of type S, which the `nodes` command makes
    (`self.sim`). A simulator's Script fills `commands` (with "nodes" and "check": do_check)
    and `checks`."""

    def __init__(self, source: str = "<script>") -> None:
        self.source = source
        self.sim: S | None = None
        self.commands: dict[str, Handler] = {}
        self.checks: dict[str, Handler] = {}

    def run_text(self, text: str) -> None:
        for lineno, raw in enumerate(text.splitlines(), 1):
            self.run_line(raw, lineno)

    def run_file(self, path: Path) -> None:
        self.source = str(path)
        self.run_text(path.read_text())

    def run_line(self, raw: str, lineno: int = 0) -> None:
        words = raw.split("#", 1)[0].split()
        if not words:
            return
        try:
            handler = self.commands.get(words[0])
            if handler is None:
                raise ScriptError(f"unknown command {words[0]!r}")
            if self.sim is None and words[0] != "nodes":
                raise ScriptError("the first command must be `nodes`")
            handler(words[1:])
        except (SimError, ValueError, IndexError, KeyError) as exc:
            where = f"{self.source}:{lineno}" if lineno else self.source
            kind = SimError if type(exc) is SimError else ScriptError
            raise kind(f"{where}: {raw.strip()!r}: {exc}") from exc

    @property
    def s(self) -> S:
        assert self.sim is not None
        return self.sim

    def do_check(self, a: list[str]) -> None:
        check = self.checks.get(a[0])
        if check is None:
            raise ScriptError(f"unknown check {a[0]!r}")
        check(a[1:])

    @staticmethod
    def expect(what: str, have: object, want: object) -> None:
        if have != want:
            raise SimError(f"{what}: expected {want}, got {have}")


# ----- randomized runs ----------------------------------------------------------------------


class Chaos(Protocol):
    """A seed's random script: its lines so far (the first is `nodes ...`), one more random
    command that makes sense in the simulation's state (`step`), a given one (`run`), and the
    ending that heals everything and checks the outcome (`finish`)."""

    lines: list[str]

    def step(self) -> None: ...

    def run(self, line: str) -> None: ...

    def finish(self) -> None: ...


@dataclass
class Run:
    lines: list[str]  # the whole script
    middle: list[str]  # its commands between the setup and the finish
    error: SimError | None


def play(chaos: Chaos, steps: int, middle: list[str] | None = None) -> Run:
    """The chaos's setup, then `middle` (or `steps` random commands), then the finish."""
    try:
        if middle is None:
            for _ in range(steps):
                chaos.step()
        else:
            for line in middle:
                chaos.run(line)
        middle = chaos.lines[1:]
        chaos.finish()
    except SimError as exc:
        return Run(chaos.lines, middle or chaos.lines[1:], exc)
    return Run(chaos.lines, middle, None)


# A seed's run: (seed, the middle to play instead of random commands) -> the run.
Player = Callable[[int, "list[str] | None"], Run]


def shrink(play_seed: Player, seed: int, run: Run, kind: Callable[[SimError], str]) -> list[str]:
    """Drop commands from a failing script while it still fails the same way (`kind`)."""
    assert run.error is not None
    want, middle = kind(run.error), run.middle
    size = len(middle) // 2
    while size:
        i, shrunk = 0, False
        while i < len(middle):
            candidate = middle[:i] + middle[i + size :]
            exc = play_seed(seed, candidate).error
            if exc is not None and not isinstance(exc, ScriptError) and kind(exc) == want:
                middle, shrunk = candidate, True
            else:
                i += size
        if not shrunk:
            size //= 2
    return play_seed(seed, middle).lines


def run_seeds(seeds: int, play_seed: Player, kind: Callable[[SimError], str]) -> None:
    """Play seeds 0..seeds-1; fail with, for each kind of failure, its shortest seed's script
    shrunk to a scenario."""
    failures: dict[str, list[tuple[int, Run]]] = {}
    for seed in range(seeds):
        run = play_seed(seed, None)
        if run.error is not None:
            failures.setdefault(kind(run.error), []).append((seed, run))
    if failures:
        report = [f"{sum(map(len, failures.values()))} of {seeds} seeds failed"]
        for runs in failures.values():
            seed, run = min(runs, key=lambda r: len(r[1].lines))
            script = "\n".join(shrink(play_seed, seed, run, kind))
            report.append(
                f"{len(runs)} seeds like seed {seed}: {run.error}\nshrunk to a scenario:\n{script}"
            )
        pytest.fail("\n\n".join(report))
