"""The saturated suite's hexmq variants (issue 28): co-located (`--colocated`, hexmq-colo) and
another checkout's (`--baseline PYTHON`, hexmq-base) beside hexmq in both suites, their
ratios to mosquitto, and the batching counters read around every hexmq run."""

from __future__ import annotations

import argparse
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import cli, moderate, report
from bench.brokers import Hexmq, Mosquitto, checkout


def labels(hexmqs: list[Hexmq]) -> list[str]:
    return [h.label for h in hexmqs]


def fake_python(tmp_path: Path, *, with_hexmq_cli: bool) -> Path:
    """An 'interpreter' whose hexmq lives in a checkout under tmp_path: it answers the probe
    with that checkout and echoes any other command line with its working directory, and
    fails if PYTHONPATH reaches it."""
    root = tmp_path / "checkout"
    (root / "hexmq").mkdir(parents=True)
    if with_hexmq_cli:
        (root / "hexmq_cli").mkdir()
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        '[ -n "$PYTHONPATH" ] && { echo "PYTHONPATH=$PYTHONPATH" >&2; exit 3; }\n'
        f'if [ "$1" = "-c" ]; then echo "{root} 0.0.9"; else echo "$PWD $*"; fi\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python


def test_both_suites_run_hexmq_colo_beside_hexmq_by_default() -> None:
    args = cli.build_parser().parse_args([])
    assert args.colocated is True
    assert args.baseline is None
    single = cli.single_hexmqs(args)
    assert labels(single) == ["hexmq", "hexmq-colo"]
    assert [h.colocated for h in single] == [False, True]
    # A co-located cluster at every replication factor; plain links at the highest only.
    assert labels(cli.cluster_hexmqs(args)) == [
        "hexmq 3n rf1",
        "hexmq-colo 3n rf1",
        "hexmq 3n rf2",
        "hexmq-colo 3n rf2",
        "hexmq 3n rf3",
        "hexmq-plain 3n rf3",
        "hexmq-colo 3n rf3",
    ]
    args = cli.build_parser().parse_args(["--no-colocated", "--no-plain", "--rf", "3"])
    assert labels(cli.single_hexmqs(args)) == ["hexmq"]
    assert labels(cli.cluster_hexmqs(args)) == ["hexmq 3n rf3"]


def test_edges_per_node_apply_to_separate_processes_and_the_baseline_takes_its_turn(
    tmp_path: Path,
) -> None:
    python = str(fake_python(tmp_path, with_hexmq_cli=False))
    args = cli.build_parser().parse_args(
        ["--edges-per-node", "1,2", "--baseline", python, "--rf", "1,3", "--no-plain"]
    )
    single = cli.single_hexmqs(args)
    assert labels(single) == ["hexmq", "hexmq-2e", "hexmq-colo", "hexmq-base"]
    # The co-located node and the baseline run one edge per node.
    assert [h.edges for h in single] == [1, 2, 1, 1]
    assert [h.python for h in single][-1] == python
    assert labels(cli.cluster_hexmqs(args)) == [
        "hexmq 3n rf1",
        "hexmq-2e 3n rf1",
        "hexmq-colo 3n rf1",
        "hexmq-base 3n rf1",
        "hexmq 3n rf3",
        "hexmq-2e 3n rf3",
        "hexmq-colo 3n rf3",
        "hexmq-base 3n rf3",
    ]
    # --profile samples the first of separate processes with TLS at the highest RF.
    assert [h.label for h in cli.cluster_hexmqs(args) if h.profileable][-2] == "hexmq 3n rf3"


def test_a_colocated_hexmq_with_several_edges_per_node_is_refused_as_cluster_up_does() -> None:
    with pytest.raises(ValueError, match="separate processes"):
        Hexmq(3, 3, colocated=True, edges=2)


def test_a_baseline_interpreter_that_is_not_there_is_refused_by_both_suites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "nowhere" / "python")
    for parser in (cli.build_parser(), moderate.build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args(["--baseline", missing])
        assert "no such interpreter" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="cannot import hexmq"):
        cli.baseline_facts(str(tmp_path))  # there, but a directory: no interpreter at all


@pytest.mark.parametrize(("with_hexmq_cli", "module"), [(True, "hexmq_cli"), (False, "hexmq.cli")])
def test_the_baseline_runs_its_own_checkouts_command_without_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_hexmq_cli: bool, module: str
) -> None:
    # The bench itself runs from a worktree with PYTHONPATH on it: the baseline must not.
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    python = str(fake_python(tmp_path, with_hexmq_cli=with_hexmq_cli))
    found = checkout(python)
    assert found["checkout"] == str(tmp_path / "checkout")
    assert found["version"] == "0.0.9"
    assert found["cli_module"] == module
    base = Hexmq(python=python, variant="base")
    assert base.foreign
    assert not Hexmq().foreign
    # This very interpreter as the baseline: main's checkout while the bench runs a worktree's.
    assert Hexmq(python=sys.executable).foreign
    assert not base.profileable
    base.workdir = tmp_path
    done = base._cli("cluster", "status", timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(tmp_path), "-m", module, "cluster", "status"]


@pytest.mark.parametrize("knows_separate", [True, False])
def test_each_hexmq_says_its_mode_as_its_checkout_understands_it(
    tmp_path: Path, knows_separate: bool
) -> None:
    # `cluster up` co-locates by default since issue 28: hexmq (separate processes) must say
    # --separate, hexmq-colo --colocated; a baseline from before --separate says nothing (its
    # default is separate processes), one from after says --separate as this checkout does.
    python = str(fake_python(tmp_path, with_hexmq_cli=True))
    cli_source = tmp_path / "checkout" / "hexmq_cli" / "cli.py"
    cli_source.write_text('p.add_argument("--separate")\n' if knows_separate else "# old\n")
    assert Hexmq()._mode_options() == ["--separate"]
    assert Hexmq(colocated=True)._mode_options() == ["--colocated"]
    base = Hexmq(python=python, variant="base")
    assert base._mode_options() == (["--separate"] if knows_separate else [])


def run(label: str, rf: int | None, delivered: float, **extra: Any) -> dict[str, Any]:
    return {
        "broker": label.split()[0],
        "label": label,
        "suite": "cluster",
        "rf": rf,
        "scenario": "cluster-pairs",
        "shape": "pairs",
        "mode": "saturated",
        "qos": 1,
        "delivered_per_s": delivered,
        "latency": {"p50_us": 1000.0, "p99_us": 4000.0},
        "clients": {"publishers": 100, "subscribers": 100},
        "lost": 0,
        "cpu": {"others_pct": 3.0},
        **extra,
    }


def test_hexmq_colo_and_hexmq_base_each_have_their_own_ratio_and_row() -> None:
    runs = [
        run("hexmq 3n rf3", 3, 3000.0),
        run("hexmq-colo 3n rf3", 3, 4500.0),
        run("hexmq-base 3n rf3", 3, 1500.0),
        run("hexmq-colo 3n rf1", 1, 6000.0),
        run("mosquitto", None, 15000.0),
    ]
    ratios = cli.compute_ratios(runs)
    assert {r["label"]: r["throughput"] for r in ratios} == {
        "hexmq 3n rf3": 0.2,
        "hexmq-colo 3n rf3": 0.3,
        "hexmq-base 3n rf3": 0.1,
        "hexmq-colo 3n rf1": 0.4,
    }
    _, rows = report.cluster_rows({"runs": runs, "ratios": ratios})
    # Each replication factor's hexmqs together, then mosquitto.
    assert [(row[1], row[4]) for row in rows] == [
        ("hexmq-colo 3n rf1", "0.40"),
        ("hexmq 3n rf3", "0.20"),
        ("hexmq-base 3n rf3", "0.10"),
        ("hexmq-colo 3n rf3", "0.30"),
        ("mosquitto", "-"),
    ]
    single = [
        {**r, "suite": "single", "scenario": "fanin-qos0", "shape": "fanin", "rf": 1}
        for r in (runs[0], runs[1], runs[4])
    ]
    table = report.ratios_table(cli.compute_ratios(single))
    assert [line.split()[2] for line in table.splitlines()[2:]] == ["hexmq", "hexmq-colo"]


def test_the_summary_names_the_variants_and_shows_what_each_publish_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stages = {"edge_link": 400, "replication_feed": 200, "group_commit": 150, "replica_write": 90}
    batching = {stage: {"batches": n} for stage, n in stages.items()}
    runs = [
        run("hexmq 3n rf3", 3, 3000.0, sent=100, batching=batching),
        run("hexmq-colo 3n rf3", 3, 4500.0, sent=200, batching=batching),
        run("mosquitto", None, 15000.0, sent=100),
    ]
    doc = {
        "machine": {
            "hexmq_commit": "0123456789abcdef",
            "hexmq_tree_dirty": False,
            "nproc": 2,
            "cpu_model": "test",
            "python": "3.11",
            "loadavg_before": [1.0],
            "loadavg_after": [1.0],
        },
        "config": {
            "colocated": True,
            "baseline_checkout": {
                "checkout": "/old",
                "commit": "aec096dfbab2",
                "python": "/old/.venv/bin/python",
            },
            "cluster": {
                "nodes": 3,
                "rf": [3],
                "fanin_publishers": 12,
                "fanout_subscribers": 12,
                "pairs": 100,
                "warmup_s": 1,
                "window_s": 2,
            },
        },
        "runs": runs,
        "ratios": cli.compute_ratios(runs),
        "brokers": {},
    }
    report.print_summary(doc, tmp_path / "results.json")
    out = capsys.readouterr().out
    assert "hexmq-colo: co-located" in out
    assert "hexmq-base: /old at aec096dfba (/old/.venv/bin/python)" in out
    per_publish = out[out.index("per publish over each run") :].splitlines()[3:5]
    assert [line.split() for line in per_publish] == [
        ["hexmq", "3n", "rf3", "cluster-pairs", "saturated", "6.00", "2.40"],
        ["hexmq-colo", "3n", "rf3", "cluster-pairs", "saturated", "3.00", "1.20"],
    ]


def test_every_hexmq_run_reads_the_batching_counters_around_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readings = iter(
        [
            {"edge_link": {"batches": 10.0, "batched_items": 20.0}},
            {"edge_link": {"batches": 60.0, "batched_items": 220.0}},
        ]
    )
    read: list[list[int]] = []

    def counters(ports: list[int]) -> dict[str, dict[str, float]]:
        read.append(ports)
        return next(readings)

    def run_once(broker: Any, *_: Any) -> dict[str, Any]:
        return {"label": broker.label, "cpu": {"others_pct": 0.0}}

    monkeypatch.setattr(cli, "batch_counters", counters)
    monkeypatch.setattr(cli, "run_once", run_once)
    monkeypatch.setattr(cli, "wait_for_quiet", lambda limit: 0.0)
    monkeypatch.setattr(report, "print_run", lambda run: None)
    bench = cli.Bench(argparse.Namespace(quiet_wait=0, redo_disturbed=0), {"runs": []})
    scenario = cli.Scenario(1, "saturated", "pairs", cluster=True)
    colo = Hexmq(3, 3, variant="colo", colocated=True)
    colo.metrics_ports = [9100, 9200]
    done = bench.run(colo, scenario, None)
    assert done["batching"] == {
        "edge_link": {"batches": 50, "items_per_batch": 4.0, "linger_us_per_batch": 0.0}
    }
    assert read == [[9100, 9200], [9100, 9200]]
    assert "batching" not in bench.run(Mosquitto(), scenario, None)
