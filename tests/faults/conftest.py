"""Fixtures of the fault suite: whether a network namespace can be made here (else every
test that needs one skips, saying why), and a run of `python -m tests.faults` in one."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.faults import netns

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def namespace() -> None:
    """Skip, loudly, where the suite cannot make its network namespace."""
    why = netns.why_unavailable()
    if why is not None:
        message = f"fault suite skipped: {why}"
        print(f"\n*** {message} ***", file=sys.stderr)
        pytest.skip(message)


def faults_command(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """`python -m tests.faults ARGV` from the repository root (it re-executes itself in a
    network namespace of its own)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.faults", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


RunFaults = Callable[[list[str], Path], dict[str, Any]]


@pytest.fixture
def run_faults(namespace: None) -> RunFaults:
    """Run `python -m tests.faults run ...` and return its result.json."""

    def run(argv: list[str], result_dir: Path) -> dict[str, Any]:
        done = faults_command(argv, timeout=1500)
        path = result_dir / "result.json"
        if not path.exists():
            pytest.fail(
                f"`python -m tests.faults {' '.join(argv)}` wrote no result "
                f"(exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}",
                pytrace=False,
            )
        result: dict[str, Any] = json.loads(path.read_text())
        return result

    return run
