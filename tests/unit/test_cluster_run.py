"""`hexmq cluster run` (make run): a Ctrl-C stops the cluster it started, wherever it lands once
the cluster is up."""

from __future__ import annotations

import argparse
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hexmq_cli import cli


class _InterruptedTerminal:
    """The command's print to a terminal whose reader pressed Ctrl-C as soon as the banner
    reached it: the signal's handler runs before print returns."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, *values: object, **options: Any) -> None:
        text = " ".join(str(v) for v in values)
        self.lines.append(text)
        if "Ctrl-C stops" in text:
            raise KeyboardInterrupt


def test_ctrl_c_while_the_banner_goes_out_still_stops_the_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = SimpleNamespace(dir=tmp_path)
    stopped: list[tuple[Path, Any]] = []

    def stop_nodes(cluster_dir: Path, numbers: Any, *, grace: float) -> tuple[int, list[str]]:
        stopped.append((cluster_dir, numbers))
        return 5, []

    monkeypatch.setattr(cli, "_start_cluster", lambda args: state)
    monkeypatch.setattr(
        cli, "_banner", lambda s: "hexmq: cluster running\nCtrl-C stops the cluster."
    )
    monkeypatch.setattr(cli.localcluster, "stop_nodes", stop_nodes)
    terminal = _InterruptedTerminal()
    monkeypatch.setattr(cli, "print", terminal, raising=False)

    try:
        code = cli._run(argparse.Namespace(dir=tmp_path, grace=10.0))
    except KeyboardInterrupt:  # would end the test session itself
        pytest.fail("the interrupt left `run` (exit 130) with the cluster still running")

    assert code == cli.EXIT_OK
    assert stopped == [(tmp_path, None)]
    assert "cluster stopped (5 process(es))" in terminal.lines[-1]
