"""The run's supervisor (tests/faults/runner.py, `_supervise`): it starts again what exited on
a node no fault holds down, as every deployment's supervisor does, and records it for the
verdict. Without processes: a stand-in for the cluster's process table."""

from __future__ import annotations

import time
from typing import Any, cast

from tests.faults.runner import SUPERVISE_EVERY_S, Run


class Processes:
    """What `FaultCluster.exited` and `start` see and do, for nodes 1-4."""

    def __init__(self, exited: dict[int, list[str]]) -> None:
        self.nodes = {n: object() for n in (1, 2, 3, 4)}
        self._exited = exited
        self.started: list[int] = []

    def exited(self, node: int) -> list[str]:
        return self._exited.get(node, [])

    def start(self, node: int) -> str | None:
        self.started.append(node)
        self._exited.pop(node, None)
        return None


def supervised(processes: Processes, *, held: set[int], spare: int) -> Run:
    run = object.__new__(Run)  # (no cluster, network or directories: only the supervisor)
    run.cluster = cast(Any, processes)
    run.t0 = time.monotonic() - 63.0
    run.spare = spare
    run._held = held
    run._agreement_held = False
    run._next_supervise = 0.0
    run.restarts = []
    return run


def test_the_supervisor_starts_again_only_what_no_fault_holds_down() -> None:
    # n1's partition exited (its Redis was killed by a fault that has healed); n2 is held down
    # by a fault in progress; n4 is the join-leave spare, which comes and goes with its fault.
    processes = Processes({1: ["partition"], 2: ["redis"], 4: ["edge"]})
    run = supervised(processes, held={2}, spare=4)
    run._supervise()
    assert processes.started == [1]
    (restart,) = run.restarts
    assert (restart["node"], restart["exited"], restart["start_failed"]) == (1, ["partition"], "")
    assert 62.0 <= restart["at"] <= 64.0
    # Not again before SUPERVISE_EVERY_S; and never while the agreement server is down on
    # purpose (a node's start would start it too).
    processes._exited[3] = ["edge"]
    run._supervise()
    assert processes.started == [1]
    run._next_supervise -= SUPERVISE_EVERY_S
    run._agreement_held = True
    run._supervise()
    assert processes.started == [1]
    run._agreement_held = False
    run._supervise()
    assert processes.started == [1, 3]
