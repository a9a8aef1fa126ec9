"""The fault suite's command line (docs/faults.md).

    python -m tests.faults run --seed 7 [--nodes 5] [--kinds isolate,pause] [--length 45]
        one run (a replay, given a failed run's seed and options), in a network namespace of
        its own; prints the verdict, writes OUT/NAME/result.json and latency.png
    python -m tests.faults table DIR...
        the Markdown table of the runs whose result.json files lie under DIR (docs/faults.md)
    python -m tests.faults selftest
        the namespace machinery alone: two servers as two nodes, a one-way cut, the heal

`run` and `selftest` re-execute themselves inside `unshare --net` (as root); where that cannot
be done they say why and exit 3.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.faults import netns

EXIT_FAILED, EXIT_UNAVAILABLE = 1, 3
RUN_TIMEOUT_S = 1200


def _kinds(text: str) -> list[str]:
    return [k.strip() for k in text.split(",") if k.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    actions = parser.add_subparsers(dest="action", required=True)
    run = actions.add_parser("run", help="one fault run (a replay, with a failed run's seed)")
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--nodes", type=int, default=3)
    run.add_argument("--rf", type=int, default=3)
    run.add_argument("--partitions", type=int, default=32)
    run.add_argument("--kinds", type=_kinds, default=None, help="nemeses, comma-separated")
    run.add_argument("--length", type=float, default=45.0, help="seconds of faults")
    run.add_argument("--trace", action="store_true", help="the cluster writes trace files")
    run.add_argument(
        "--colocated",
        action="store_true",
        help="each node's services in one process (hexmq cluster up --colocated), not one each",
    )
    run.add_argument("--out", type=Path, default=Path(".hexmq/faults"))
    run.add_argument("--name", default="")
    run.add_argument("--keep-data", action="store_true", help="keep Redis data of a pass")
    table = actions.add_parser("table", help="the results table of the runs under DIR")
    table.add_argument("dirs", type=Path, nargs="+")
    actions.add_parser("selftest", help="the namespace machinery alone")
    return parser


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _reexec(argv: list[str], timeout: float, cluster_dir: Path | None = None) -> int:
    """Run `python -m tests.faults argv` inside a fresh network namespace; on a timeout or a
    SIGTERM, end everything it started: its process group, then the cluster's processes (each
    runs in a session of its own; they carry the cluster's marker in their environment)."""
    why = netns.why_unavailable()
    if why is not None:
        print(f"tests.faults: cannot make a network namespace here: {why}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    child = subprocess.Popen(
        netns.reexec_argv(["-m", "tests.faults", *argv]),
        env=netns.reexec_env(),
        start_new_session=True,
    )
    # A SIGTERM (a stopped campaign, pytest-timeout's parent going away) ends the run's
    # processes too: they live in sessions of their own and would run on, orphaned.
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        return child.wait(timeout=timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt) as stopped:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        if cluster_dir is not None:
            from hexmq_cli import clusterstate, procs

            for pid in procs.pids_with_env(clusterstate.ENV_MARKER, str(cluster_dir)):
                ident = procs.identity_of(pid)
                if ident is not None:
                    procs.send_signal(ident, signal.SIGKILL)
        why = (
            "was interrupted"
            if isinstance(stopped, KeyboardInterrupt)
            else (f"did not end within {timeout:g} s")
        )
        print(f"tests.faults: the run {why}; its processes are killed", file=sys.stderr)
        return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(args_list)
    if args.action == "table":
        from tests.faults.results import table_markdown

        print(table_markdown(args.dirs))
        return 0
    if not netns.inside():
        cluster_dir = None
        if args.action == "run":
            cluster_dir = (args.out / (args.name or f"seed-{args.seed}")).absolute() / "cluster"
        return _reexec(args_list, RUN_TIMEOUT_S, cluster_dir)
    if args.action == "selftest":
        from tests.faults.selftest import selftest

        return selftest()
    from tests.faults.results import summary_line
    from tests.faults.runner import Run, RunConfig

    config = RunConfig(
        seed=args.seed,
        nodes=args.nodes,
        rf=args.rf,
        partitions=args.partitions,
        kinds=args.kinds,
        length=args.length,
        trace=args.trace,
        colocated=args.colocated,
        out=args.out,
        name=args.name,
        keep_data=args.keep_data,
    )
    result = Run(config).execute()
    print(summary_line(result))
    if not result["verdict"]["ok"]:
        print(json.dumps(result["verdict"]["failures"], indent=1))
        if "error" in result:
            print(result["error"], file=sys.stderr)
    return 0 if result["verdict"]["ok"] else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
