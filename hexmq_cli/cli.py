"""The `hexmq` command: the three services of a node, and `hexmq cluster` for local clusters.

    hexmq edge|partition|membership ...     run one service in the foreground
    hexmq node -- membership ... -- partition ... -- edge ...   a node's three services in one
                                            process (hexmq_cli/node.py)
    hexmq consul-dev ...                    the embedded Consul HTTP API server (one machine)
    hexmq cluster up|run|status|stop|kill|start|add|leave|down ...
    hexmq passwd FILE USER [PASSWORD]       add or replace a user in a password file
    hexmq certs cluster|ca|issue|request|show ...   the cluster CA and its certificates
    hexmq secrets init --dir DIR --nodes N1,N2,...  every secret a deployment needs (compose)
    hexmq health [--live] [--url URL]       is the service here ready? (the image's HEALTHCHECK)

Every option of a service can also be given as an environment variable, HEXMQ_<OPTION>
(hexmq.envoptions); the command line wins.

Service modules are imported only when their subcommand runs (gRPC and protobuf imports are
slow), so `hexmq cluster ...` and `--help` stay fast. Exit codes: 0 success, 1 the command
failed, 2 bad arguments, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from hexmq import __version__, envoptions
from hexmq_cli import clusterstate, linkstatus, localcluster, localmembers, localsecure
from hexmq_cli.clusterstate import ClusterError, UsageError
from hexmq_cli.localcluster import StartFailure

SERVICE_MODULES = {
    "edge": ("services.edge.main", "the MQTT server of a node (client connections)"),
    "partition": ("services.partition.main", "the partition service of a node (durable state)"),
    "membership": ("services.membership.main", "the membership agent of a node (cluster view)"),
    "consul-dev": (
        "services.membership.consul_dev.main",
        "the embedded Consul HTTP API server for one machine (local clusters, tests)",
    ),
}

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (the full usage is one --help away)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required") and (
            self.prog.rpartition(" ")[2] in SERVICE_MODULES
        ):
            message += " (or their HEXMQ_* environment variables)"
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 1-65535, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _add_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir", required=True, type=Path, help="the cluster's directory (state, logs, data)"
    )


def _add_node(p: argparse.ArgumentParser) -> None:
    p.add_argument("node", type=_positive_int, metavar="NODE", help="node number, from 1")


def _add_cluster_shape(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nodes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="number of nodes (default: as many as --hosts lists, else 1)",
    )
    p.add_argument(
        "--edges-per-node",
        type=_positive_int,
        default=1,
        metavar="N",
        help="edge processes per node, all on the node's MQTT port (SO_REUSEPORT: the kernel "
        "spreads new connections over them), so that a node's connection handling uses N "
        "cores; edge k > 1 is edge<k> in status, id n<i>-e<k>, metrics on the node block's "
        f"slot 4+k (at most {clusterstate.MAX_EDGES_PER_NODE}; default 1)",
    )
    p.add_argument(
        "--hosts",
        default=None,
        metavar="A,B,...",
        help="one loopback address per node (e.g. 127.0.0.2,127.0.0.3,127.0.0.4): node i binds "
        "every port of it on the i-th, so links between nodes can be told apart and cut "
        "(default: every node on 127.0.0.1)",
    )
    p.add_argument(
        "--agreement-listen",
        default=None,
        metavar="HOST:PORT",
        help="where the cluster's own agreement server (hexmq consul-dev) listens (default "
        "127.0.0.1 and the port after the last node's block)",
    )
    p.add_argument(
        "--node-wrapper",
        default=None,
        metavar="'CMD ARGS'",
        help="run every process of node i as `CMD ARGS <its command line>`, {node} replaced by "
        "i (e.g. 'nice -n 5'); recorded in cluster.json, so `start` uses it too",
    )
    _add_dir(p)
    p.add_argument(
        "--base-port",
        type=_port,
        default=clusterstate.DEFAULT_BASE_PORT,
        metavar="P",
        help="node i serves MQTT on P+i-1; internal ports are P+1000+10*(i-1)+0..5 "
        "(redis, membership, partition, then edge, partition, membership metrics); the "
        "agreement server of N nodes is on P+1000+10*N (default %(default)s)",
    )
    p.add_argument(
        "--consul",
        default=os.environ.get("CONSUL_HTTP_ADDR") or None,
        metavar="HOST:PORT",
        help="use this external Consul for agreement instead of starting `hexmq consul-dev` "
        "(default: $CONSUL_HTTP_ADDR if set, else the cluster's own agreement server)",
    )
    p.add_argument(
        "--rf",
        type=_positive_int,
        default=1,
        metavar="R",
        help="replication factor (at most --nodes; default 1)",
    )
    p.add_argument(
        "--partitions",
        type=_positive_int,
        default=clusterstate.DEFAULT_PARTITIONS,
        metavar="COUNT",
        help="number of partitions, fixed when the cluster is created (default %(default)s)",
    )
    p.add_argument(
        "--trace-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="every service writes its spans to DIR as OTLP JSON lines (for the Spark job)",
    )
    p.add_argument(
        "--discovery",
        choices=clusterstate.DISCOVERY_CHOICES,
        default=None,
        help="static: the agents admit the nodes listed in DIR/members, and the first view "
        "waits for all of them (default: every node that registers, --expect N)",
    )
    p.add_argument(
        "--insecure-cluster",
        action="store_true",
        help="run the nodes' gRPC links in plain text, without certificates or identities "
        "(each service logs a warning); by default every link is mutual TLS with the "
        "certificates made under DIR/tls (docs/security.md)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--colocated",
        action="store_const",
        const=True,
        default=None,
        help="run each node's membership agent, partition service and edge as one process "
        "(`hexmq node`), calling each other in process: the default, unless --edges-per-node "
        'is above 1 (docs/operations.md, "Co-located nodes"; docs/benchmarks.md says why)',
    )
    mode.add_argument(
        "--separate",
        dest="colocated",
        action="store_const",
        const=False,
        help="run each node's membership agent, partition service and edge(s) as processes "
        "of their own (the default with --edges-per-node above 1)",
    )
    for service in ("edge", "partition", "membership"):
        p.add_argument(
            f"--{service}-arg",
            dest=f"{service}_args",
            action="append",
            default=[],
            metavar="ARG",
            help=f"an extra argument for every `hexmq {service}` (repeatable; write options as "
            f"--{service}-arg=--flag=value)",
        )
    _add_timeout(p)


def _add_timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=localcluster.DEFAULT_TIMEOUT,
        metavar="S",
        help="give up if a startup step (processes serving, then MQTT CONNECT answered) takes "
        "longer (default %(default)g s)",
    )


def _add_grace(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grace",
        type=_seconds,
        default=localcluster.DEFAULT_GRACE,
        metavar="S",
        help="how long each process may take to stop after its stop signal before SIGKILL "
        "(default %(default)g s)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hexmq", description="hexmq: a masterless, clustered MQTT broker.")
    parser.add_argument("--version", action="version", version=f"hexmq {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (_, summary) in SERVICE_MODULES.items():
        # Their options are added by the service module itself, in main(), only when needed.
        commands.add_parser(name, help=summary, description=f"Run {summary}.")

    commands.add_parser(
        "node",
        add_help=False,
        help="a node's membership agent, partition service and edge in one process: hexmq "
        "node -- membership ... -- partition ... -- edge ... (see hexmq node --help)",
    )
    cluster = commands.add_parser(
        "cluster",
        help="run a local cluster: N nodes as background processes on loopback addresses",
        description="Run a local cluster: N nodes (redis, membership, partition, edge each) as "
        "background processes on 127.0.0.1 (or a loopback address per node, --hosts), managed "
        "through the state in DIR/cluster.json.",
    )
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser(
        "up",
        help="start a cluster, wait until every node accepts MQTT, print it as JSON",
        description="Start N nodes and wait until every node answers an MQTT CONNECT; then print "
        "one JSON object on stdout (dir, and per node its ports and pids) and return.",
    )
    _add_cluster_shape(p)

    p = actions.add_parser(
        "run",
        help="`up`, then stay in the foreground until Ctrl-C, then `down` (make run)",
        description="Start a cluster like `up`, print how to reach it, and stay in the "
        "foreground until Ctrl-C or SIGTERM; then stop it gracefully like `down`.",
    )
    _add_cluster_shape(p)
    _add_grace(p)

    p = actions.add_parser(
        "status",
        help="show every process of every node (pid, alive or not), the view and any rebalance "
        "under way (partitions moving, entries and bytes left, an estimate)",
    )
    _add_dir(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = actions.add_parser(
        "stop",
        help="stop one node (SIGINT in reverse start order, then SIGKILL): no leave, so its "
        "partitions fail over",
    )
    _add_node(p)
    _add_dir(p)
    _add_grace(p)

    p = actions.add_parser("kill", help="SIGKILL every process of one node, Redis included")
    _add_node(p)
    _add_dir(p)

    p = actions.add_parser(
        "start",
        help="start a node's stopped processes with the same config and data",
        description="Start the processes of a node that are not running, with the same "
        "config and data, wait until it accepts MQTT, and print the node as JSON.",
    )
    _add_node(p)
    _add_dir(p)
    _add_timeout(p)
    p.add_argument(
        "--python",
        metavar="PATH",
        help="run the node's services from this Python's hexmq from now on (another "
        "release's venv: a rolling upgrade or a rollback, docs/operations.md); the node must "
        "be stopped",
    )

    p = actions.add_parser(
        "add",
        help="add a node (N+1) to the running cluster; it joins and partitions move onto it",
        description="Plan node N+1 (ports, data), start it, wait until the view admits it and "
        "its edge accepts MQTT, and print the node as JSON. About 1/(N+1) of the partitions then "
        "move onto it while traffic flows: `hexmq cluster status` shows the rebalance.",
    )
    _add_dir(p)
    _add_timeout(p)
    p.add_argument(
        "--host",
        metavar="ADDR",
        help="the loopback address every port of the new node binds: needed (and only "
        "allowed) when the cluster was made with `up --hosts`",
    )

    p = actions.add_parser(
        "leave",
        help="take a node out of the cluster gracefully (handover, RF restored), then stop it",
        description="Ask the node to leave: its master roles move to other nodes by handover "
        "and its replicas are copied elsewhere until RF is restored without it; then its "
        "processes get SIGTERM and its edge disconnects its clients (MQTT 5.0: DISCONNECT 0x8B "
        "with another node as Server Reference). `stop` is the plain stop (a failover).",
    )
    _add_node(p)
    _add_dir(p)
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=localmembers.DEFAULT_LEAVE_TIMEOUT,
        metavar="S",
        help="give up (leaving the node running and leaving) if the view has not let it go "
        "within S seconds (default %(default)g)",
    )
    _add_grace(p)

    p = actions.add_parser(
        "secure",
        help="switch a running plain-text cluster (one made by a release before TLS, then "
        "upgraded) to mutual TLS, Redis passwords and the agreement server's token, node by "
        "node under traffic (three rolling restarts; docs/security.md)",
    )
    _add_dir(p)
    p.add_argument(
        "--step-timeout",
        type=_seconds,
        default=localsecure.DEFAULT_STEP_TIMEOUT,
        metavar="S",
        help="how long each node may take to be back with the cluster whole again (default "
        "%(default)g s)",
    )
    _add_grace(p)

    p = actions.add_parser("down", help="stop every node gracefully")
    _add_dir(p)
    _add_grace(p)

    commands.add_parser(
        "passwd",
        add_help=False,
        help="add or replace a user in a mosquitto password file: hexmq passwd FILE USER "
        "[PASSWORD] (see hexmq passwd --help)",
    )

    commands.add_parser(
        "certs",
        add_help=False,
        help="make the cluster CA and the certificates of its services and operators "
        "(mutual TLS inside the cluster) (see hexmq certs --help)",
    )

    commands.add_parser(
        "secrets",
        add_help=False,
        help="make every secret a deployment needs, keeping those that exist: the cluster CA "
        "and certificates, the Consul token, each node's Redis password and ACL file (see "
        "hexmq secrets --help)",
    )

    commands.add_parser(
        "health",
        add_help=False,
        help="exit 0 if the service on this machine is ready (GET /readyz on "
        "$HEXMQ_METRICS_LISTEN; --live: /healthz) (see hexmq health --help)",
    )

    traces = commands.add_parser(
        "traces",
        help="analyse OTLP JSON trace exports with Spark",
        description="Analyse the OTLP JSON trace files that `--trace-dir` writes.",
    )
    tactions = traces.add_subparsers(dest="action", metavar="ACTION", required=True)
    tactions.add_parser(
        "analyze",
        add_help=False,
        help="run the Spark trace-analysis job: hexmq traces analyze INPUT --out DIR "
        "(see hexmq traces analyze --help)",
    )
    return parser


def _service_subcommand(argv: Sequence[str]) -> str | None:
    """The service named by argv, if any: the first word that is not an option."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in SERVICE_MODULES else None
    return None


def _service_parser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[
        name
    ]
    assert isinstance(sub, argparse.ArgumentParser)
    return sub


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run the `hexmq` command; `env` (default: this process's environment) supplies the
    services' HEXMQ_* option variables (hexmq.envoptions)."""
    args_list = sys.argv[1:] if argv is None else argv
    environ = os.environ if env is None else env
    if args_list[:2] == ["traces", "analyze"]:
        # The Spark job parses its own options; imported only here (pyspark is slow to load).
        from spark.hexmq_traces import job

        return job.main(args_list[2:], prog="hexmq traces analyze")
    if args_list[:1] == ["passwd"]:
        return _passwd(args_list[1:])
    if args_list[:1] == ["certs"]:
        return _certs(args_list[1:])
    if args_list[:1] == ["secrets"]:
        return _secrets(args_list[1:])
    if args_list[:1] == ["health"]:
        return _health(args_list[1:], environ)
    if args_list[:1] == ["node"]:
        return _node(args_list[1:], environ)
    parser = build_parser()
    service = _service_subcommand(args_list)
    module: Any = None
    from_env = envoptions.EnvironmentOptions()
    if service is not None:
        module_name = SERVICE_MODULES[service][0]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            print(f"hexmq {service}: cannot load {module_name}: {exc}", file=sys.stderr)
            return EXIT_FAILED
        service_parser = _service_parser(parser, service)
        module.add_arguments(service_parser)
        try:
            from_env = envoptions.apply_environment(service_parser, environ)
        except envoptions.EnvOptionError as exc:
            print(f"hexmq {service}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        args = from_env.finish(parser.parse_args(args_list))
    except SystemExit as exc:  # --help, --version, usage errors: keep main() returning
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    if module is not None:
        code: int = module.run(args)
        if code == EXIT_USAGE and from_env.used:
            # The service names the option it refused; say which came from the environment.
            print(
                f"hexmq {service}: options from the environment: {from_env.describe()}",
                file=sys.stderr,
            )
        return code
    return _cluster(args)


def _passwd(argv: list[str]) -> int:
    """mosquitto_passwd's job without mosquitto; parses its own options."""
    from services.edge import passwd

    try:
        return passwd.main(argv, prog="hexmq passwd")
    except SystemExit as exc:  # --help, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _certs(argv: list[str]) -> int:
    """The cluster CA and its certificates; parses its own options."""
    from hexmq_cli import certs_cli

    try:
        return certs_cli.main(argv)
    except SystemExit as exc:  # --help, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _secrets(argv: list[str]) -> int:
    """Every secret of a deployment (compose's secrets volume); parses its own options."""
    from hexmq_cli import secrets_cli

    try:
        return secrets_cli.main(argv)
    except SystemExit as exc:  # --help, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _node(argv: list[str], env: Mapping[str, str]) -> int:
    """A node's three services in one process; each section parses its service's options."""
    from hexmq_cli import node

    return node.main(argv, env)


def _health(argv: list[str], env: Mapping[str, str]) -> int:
    """The container HEALTHCHECK; parses its own options."""
    from hexmq_cli import healthprobe

    try:
        return healthprobe.main(argv, env)
    except SystemExit as exc:  # --help, usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE


# --- hexmq cluster ---------------------------------------------------------------------------


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _cluster(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="hexmq cluster: %(message)s")
    # SIGTERM and SIGHUP (a closed terminal) take the same path as Ctrl-C, so a manager stopped
    # half-way through `up` still stops what it started. SIGINT too, explicitly: a shell starts
    # background jobs with SIGINT ignored, and `run` must still stop on it.
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, _raise_interrupt) for s in signals}
    prog = f"hexmq cluster {args.action}"
    try:
        command = {
            "up": _up,
            "run": _run,
            "status": _status,
            "stop": _stop,
            "kill": _kill,
            "start": _start,
            "add": _add,
            "leave": _leave,
            "secure": _secure,
            "down": _down,
        }[args.action]
        return command(args)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StartFailure as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        if exc.log_tail:
            print(f"---- last lines of {exc.log_path} ----", file=sys.stderr)
            for line in exc.log_tail:
                print(f"    {line}", file=sys.stderr)
        return EXIT_FAILED
    except (ClusterError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _print_json(doc: Any) -> None:
    print(json.dumps(doc), flush=True)


def _service_args(args: argparse.Namespace) -> dict[str, list[str]]:
    return {
        service: list(getattr(args, f"{service}_args"))
        for service in ("edge", "partition", "membership")
        if getattr(args, f"{service}_args")
    }


def _consul_arg(args: argparse.Namespace) -> str | None:
    if args.consul is None:
        return None
    from services.membership.consul_client import parse_consul_addr

    try:
        parse_consul_addr(args.consul)
    except ValueError as exc:
        raise UsageError(f"--consul: {exc}") from None
    return str(args.consul)


def _placement(args: argparse.Namespace) -> dict[str, Any]:
    """nodes, hosts, agreement_listen and node_wrapper of `up`/`run`, checked."""
    hosts = clusterstate.parse_hosts(args.hosts) if args.hosts is not None else None
    nodes = args.nodes if args.nodes is not None else len(hosts) if hosts else 1
    if hosts is not None and len(hosts) != nodes:
        raise UsageError(f"--hosts lists {len(hosts)} address(es) for --nodes {nodes}")
    listen = (
        clusterstate.parse_agreement_listen(args.agreement_listen)
        if args.agreement_listen is not None
        else None
    )
    if listen is not None and args.consul is not None:
        raise UsageError(
            "--agreement-listen places the cluster's own agreement server; with --consul "
            "(or CONSUL_HTTP_ADDR: an external Consul) there is none"
        )
    wrapper = (
        clusterstate.parse_node_wrapper(args.node_wrapper) if args.node_wrapper is not None else []
    )
    return {"nodes": nodes, "hosts": hosts, "agreement_listen": listen, "node_wrapper": wrapper}


def _start_cluster(args: argparse.Namespace) -> clusterstate.ClusterState:
    """The cluster `up` and `run` start, as their options say."""
    return localcluster.up(
        args.dir,
        base_port=args.base_port,
        partitions=args.partitions,
        rf=args.rf,
        timeout=args.timeout,
        service_args=_service_args(args),
        trace_dir=args.trace_dir,
        consul=_consul_arg(args),
        **_placement(args),
        discovery=args.discovery,
        insecure_cluster=args.insecure_cluster,
        edges_per_node=args.edges_per_node,
        colocated=_colocated(args),
    )


def _colocated(args: argparse.Namespace) -> bool:
    """Whether `up` and `run` co-locate each node's services: --colocated or --separate as
    given; otherwise co-located (it measured better on this machine: docs/benchmarks.md,
    "Co-located nodes"), unless the node runs several edges, which only separate processes
    can."""
    if args.colocated is not None:
        return bool(args.colocated)
    return bool(args.edges_per_node == 1)


def _up(args: argparse.Namespace) -> int:
    state = _start_cluster(args)
    _print_json(state.summary())
    return EXIT_OK


def _start(args: argparse.Namespace) -> int:
    node = localcluster.start_node(args.dir, args.node, timeout=args.timeout, python=args.python)
    _print_json({"dir": str(args.dir.absolute()), "nodes": [node.summary()]})
    return EXIT_OK


def _add(args: argparse.Namespace) -> int:
    node = localmembers.add_node(args.dir, host=args.host, timeout=args.timeout)
    _print_json({"dir": str(args.dir.absolute()), "nodes": [node.summary()]})
    return EXIT_OK


def _leave(args: argparse.Namespace) -> int:
    outcome = localmembers.leave_node(args.dir, args.node, timeout=args.timeout, grace=args.grace)
    for note in outcome.notes:
        print(f"hexmq cluster leave: warning: {note}", file=sys.stderr)
    print(
        f"hexmq cluster: node {args.node}: left the cluster in view {outcome.view_epoch} after "
        f"{outcome.seconds:.1f} s; stopped {outcome.stopped} process(es)",
        file=sys.stderr,
    )
    return EXIT_OK


def _stop(args: argparse.Namespace) -> int:
    count, notes = localcluster.stop_nodes(args.dir, [args.node], grace=args.grace)
    for note in notes:
        print(f"hexmq cluster stop: warning: {note}", file=sys.stderr)
    print(f"hexmq cluster: node {args.node}: stopped {count} process(es)", file=sys.stderr)
    return EXIT_OK


def _secure(args: argparse.Namespace) -> int:
    state = localsecure.secure(
        args.dir,
        step_timeout=args.step_timeout,
        grace=args.grace,
        say=lambda line: print(f"hexmq cluster secure: {line}", file=sys.stderr, flush=True),
    )
    modes = sorted({n.security for n in state.nodes})
    print(f"hexmq cluster: every node runs {', '.join(modes)}", file=sys.stderr)
    return EXIT_OK


def _down(args: argparse.Namespace) -> int:
    count, notes = localcluster.stop_nodes(args.dir, None, grace=args.grace)
    for note in notes:
        print(f"hexmq cluster down: warning: {note}", file=sys.stderr)
    print(f"hexmq cluster: stopped {count} process(es)", file=sys.stderr)
    return EXIT_OK


def _kill(args: argparse.Namespace) -> int:
    count = localcluster.kill_node(args.dir, args.node)
    print(f"hexmq cluster: node {args.node}: killed {count} process(es)", file=sys.stderr)
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    doc = localcluster.cluster_status(args.dir)
    doc["rebalance"] = localmembers.rebalance_progress(
        clusterstate.require_state(args.dir.absolute()), doc
    )
    if args.json:
        _print_json(doc)
        return EXIT_OK
    print(
        f"cluster {doc['dir']}: {len(doc['nodes'])} node(s), {doc['partitions']} partitions, "
        f"rf {doc['rf']}"
    )
    _print_agreement(doc["agreement"], doc["membership"])
    print(localmembers.describe_progress(doc["rebalance"]))
    modes = {n["node_id"]: n["security"] for n in doc["nodes"]}
    if set(modes.values()) == {"tls"}:
        print("cluster links: mutual TLS on every node")
    else:
        print(
            "cluster links: "
            + ", ".join(f"{node} {mode}" for node, mode in modes.items())
            + " (docs/security.md; plain text lets anyone who reaches a port act as a member)"
        )
    print()
    rows: list[tuple[str, ...]] = [("NODE", "ID", "SERVICE", "PID", "STATE", "ADDRESS")]
    for node in doc["nodes"]:
        for service, p in node["processes"].items():
            state = "alive" if p["alive"] else "dead"
            pid = "-" if p["pid"] is None else str(p["pid"])
            addr = f"{node['host']}:{p['port']}"
            rows.append((str(node["node"]), node["node_id"], service, pid, state, addr))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    rows = [("NODE", "MASTERS", "FOLLOWS", "SESSIONS", "CONNECTED", "QUEUED", "EDGES")]
    replication: list[tuple[str, ...]] = [
        ("MASTER", "FOLLOWER", "PARTITIONS", "IN-SYNC", "LAG", "MAX-LAG", "STATES")
    ]
    for node in doc["nodes"]:
        parts = node.get("partitions")
        if parts is None or "error" in parts:
            why = "partition service down" if parts is None else parts["error"]
            rows.append((str(node["node"]), f"({why})", "", "", "", "", ""))
            continue
        for follower, f in sorted(parts.get("followers", {}).items()):
            states = ",".join(f"{k}:{v}" for k, v in sorted(f["states"].items()))
            replication.append(
                (
                    node["node_id"],
                    follower,
                    str(f["partitions"]),
                    str(f["in_sync"]),
                    str(f["lag"]),
                    str(f["max_lag"]),
                    states,
                )
            )
        rows.append(
            (
                str(node["node"]),
                str(parts["roles"].get("master", 0)),
                str(parts["roles"].get("follower", 0)),
                str(parts["sessions"]),
                str(parts["connected_sessions"]),
                str(parts["queued_messages"]),
                str(parts["edges"]),
            )
        )
    for table in (rows, replication) if len(replication) > 1 else (rows,):
        print()
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        for row in table:
            print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    links = [line for n in doc["nodes"] for line in linkstatus.describe(n["node_id"], n["links"])]
    if links:
        print()
        print("\n".join(links))
    if doc["strays"]:
        pids = ", ".join(map(str, doc["strays"]))
        print(f"warning: processes {pids} carry this cluster's marker but are not in cluster.json")
    return EXIT_OK


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _print_agreement(agreement: dict[str, Any], membership: dict[str, Any] | None) -> None:
    """The agreement server, the view and its members' liveness, recent failovers."""
    if agreement["embedded"]:
        how = "alive" if agreement["alive"] else "dead"
        print(
            f"agreement: hexmq consul-dev on {agreement['addr']} (pid {agreement['pid']}, "
            f"{how}), cluster {agreement['cluster_name']!r}"
        )
    else:
        print(f"agreement: Consul at {agreement['addr']}, cluster {agreement['cluster_name']!r}")
    if membership is None:
        print("view: (no membership agent answers)")
        return
    epoch = membership["view_epoch"]
    print(
        f"view: epoch {epoch if epoch is not None else '- (none agreed yet)'} as node "
        f"{membership['from_node']} sees it; Consul "
        f"{'reachable' if membership['consul_reachable'] else 'UNREACHABLE'}, lease "
        f"{'valid' if membership['lease_valid'] else 'NOT valid'}"
    )
    protocol = membership["protocol"]
    if protocol["version"] is not None:
        on = ", ".join(protocol["features"]) or "none"
        print(f"protocol: version {protocol['version']}, features: {on} (what every member speaks)")
    rows: list[tuple[str, ...]] = [
        (
            "MEMBER",
            "IN-VIEW",
            "REGISTERED",
            "PROBE",
            "SUSPECTED-BY",
            "MASTERS",
            "FOLLOWS",
            "PROTOCOL",
        )
    ]
    roles = membership["partitions"]
    for m in membership["members"]:
        role = roles.get(m["node_id"], {})
        rows.append(
            (
                m["node_id"],
                "yes" if m["in_view"] else "no",
                f"yes ({m['incarnation']})" if m["registered"] else "no",
                m["probe"] or "-",
                ",".join(m["suspected_by"]) or "-",
                str(role.get("masters", 0)),
                str(role.get("follows", 0)),
                m["protocol"] or "-",
            )
        )
    print()
    _print_table(rows)
    for m in membership["members"]:
        if m["not_admitted"]:
            print(f"{m['node_id']} is not admitted: {m['not_admitted']}")
    recent = membership["recent_failovers"][-10:]
    if recent:
        print()
        failovers: list[tuple[str, ...]] = [("PARTITION", "KIND", "FROM", "TO", "EPOCH", "AT")]
        for r in recent:
            at = time.strftime("%H:%M:%S", time.localtime(r["at_ms"] / 1000))
            failovers.append(
                (f"p{r['partition']}", r["kind"], r["from"], r["to"] or "-", str(r["epoch"]), at)
            )
        _print_table(failovers)


def _banner(state: clusterstate.ClusterState) -> str:
    first, host = state.nodes[0].ports.mqtt, state.nodes[0].ports.host
    lines = [f"hexmq: {len(state.nodes)}-node cluster running (state and logs in {state.dir})"]
    lines += [
        f"  node {n.node} ({n.node_id}): MQTT on {n.ports.addr(n.ports.mqtt)}   logs {n.dir}/*.log"
        for n in state.nodes
    ]
    server = "hexmq consul-dev" if state.consul is not None else "Consul"
    lines.append(f"  agreement: {server} on {state.consul_addr}")
    lines += [
        "Try it:",
        f"  mosquitto_sub -h {host} -p {first} -t 'demo/#' -v",
        f"  mosquitto_pub -h {host} -p {first} -t demo/hello -m 'hello' -q 1",
        f"In another terminal: hexmq cluster status --dir {state.dir}",
        "Ctrl-C stops the cluster.",
    ]
    return "\n".join(lines)


def _watch(cluster_dir: Path) -> None:
    """Until interrupted, report processes that die or come back (other terminals may run
    `hexmq cluster kill/start` on this cluster meanwhile)."""
    seen: dict[str, int | None] = {}
    while True:
        time.sleep(1.0)
        try:
            state = clusterstate.require_state(cluster_dir)
        except ClusterError:  # cluster.json being replaced or removed by hand: look again
            continue
        records = [
            (f"node {node.node} {service}", record)
            for node in state.nodes
            for service, record in node.processes.items()
        ]
        if state.consul is not None:
            records.append(("the agreement server", state.consul))
        for name, record in records:
            pid = record.identity.pid if record.identity and record.running() else None
            if name in seen and seen[name] != pid:
                if pid is None:
                    print(f"hexmq: {name} is no longer running", flush=True)
                else:
                    print(f"hexmq: {name} is running (pid {pid})", flush=True)
            seen[name] = pid


def _run(args: argparse.Namespace) -> int:
    state = _start_cluster(args)
    try:
        # The banner inside the try: a Ctrl-C that arrives while it is going out (the user has
        # read "Ctrl-C stops the cluster" before print returns) stops the cluster like any
        # other rather than leaving it running behind an "interrupted".
        print(_banner(state), flush=True)
        _watch(state.dir)
    except KeyboardInterrupt:
        pass
    print("hexmq: stopping the cluster (Ctrl-C again to kill it at once)", flush=True)
    count, notes = localcluster.stop_nodes(state.dir, None, grace=args.grace)
    for note in notes:
        print(f"hexmq cluster run: warning: {note}", file=sys.stderr)
    print(f"hexmq: cluster stopped ({count} process(es))", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
