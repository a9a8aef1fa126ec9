"""`hexmq node`: a node's membership agent, partition service and edge in one process.

    hexmq node -- membership --node-id n1 ... -- partition --node-id n1 ... -- edge --node-id n1 ...

Each section after a `--` is one service's own command line, parsed by that service's own
parser (`hexmq SERVICE --help` lists its options), in any order; all three are needed and name
the same node. Each service is built by its own `prepare` (services/*/main.py) and runs as it
does in a process of its own, on one event loop: its gRPC server still listens for the other
nodes (with its own certificate), and the node's own services call each other in process
(hexmq/inproc.py: the same servicer methods, the messages themselves, no serialisation,
socket or TLS).

What is the process's rather than a service's: the log (the most verbose --log-level of the
sections) and the pacing of batches (--batch-interval-us, --batch-interval-max-us,
--ack-linger-us: the sections that take them must give the same values).

The environment: each section reads HEXMQ_<OPTION> as its service does, and, winning over it,
HEXMQ_NODE_<SERVICE>_<OPTION> (HEXMQ_NODE_EDGE_CLUSTER_CERT: the edge's certificate), for
the options whose values differ between the services of one node.

Stopping: SIGINT stops the services one after the other, edge, partition service, membership
agent (the order `hexmq cluster stop` stops a node's processes in); SIGTERM tells all three
at once, as an orchestrator stopping a node's processes does: the node leaves the cluster
first (docs/operations.md, "Leaving"). A partition service that ends by itself (it lost its
Redis, and stops so that its state reloads from Redis) is started again in this process, as
its own process would be, while the edge keeps its clients and the agent the node's
registration (`Restarts`). Any other service that ends by itself (an agent that cannot go on)
stops the other two, and the process exits with its code: the node restarts as one.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from hexmq import envoptions
from hexmq.inproc import NodeServers
from hexmq.service import ServiceMain, StopEvent, run_service, setup_logging

log = logging.getLogger("hexmq.node")

# Start order (each one's gRPC server before the next one's clients need it), and the modules.
SECTIONS: Final = {
    "membership": "services.membership.main",
    "partition": "services.partition.main",
    "edge": "services.edge.main",
}
# Stop order of a plain stop: the reverse.
STOP_ORDER: Final = ("edge", "partition", "membership")
SEPARATOR: Final = "--"
# Options that configure the process, not the service (hexmq.pacing): the sections that take
# them must agree.
PROCESS_WIDE: Final = ("batch_interval_us", "batch_interval_max_us", "ack_linger_us")
NODE_PREFIX: Final = envoptions.PREFIX + "NODE_"

USAGE = (
    "usage: hexmq node -- membership OPTIONS -- partition OPTIONS -- edge OPTIONS\n"
    "  each section: that service's own options (hexmq SERVICE --help); every section names "
    "the same --node-id"
)

EXIT_USAGE: Final = 2
# A partition service that ends by itself is started again in the node's process (Restarts):
# first after this many seconds, doubling up to RESTART_MAX_S while it keeps ending within
# RESTART_STEADY_S of its start.
RESTART_FIRST_S: Final = 1.0
RESTART_MAX_S: Final = 30.0
RESTART_STEADY_S: Final = 60.0


class NodeUsageError(ValueError):
    """The command line cannot make a node; the message says why."""


def split_sections(argv: Sequence[str]) -> dict[str, list[str]]:
    """{service: its words} from `-- SERVICE WORDS... -- SERVICE WORDS...`."""
    if not argv or argv[0] != SEPARATOR:
        raise NodeUsageError(f"the first word must be {SEPARATOR}, then a service")
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for word in argv:
        if word == SEPARATOR:
            current = None
            continue
        if current is None:
            if word not in SECTIONS:
                raise NodeUsageError(f"{word!r} is not a service of a node ({', '.join(SECTIONS)})")
            if word in sections:
                raise NodeUsageError(f"the {word} section is given twice")
            current = sections[word] = []
            continue
        current.append(word)
    missing = [s for s in SECTIONS if s not in sections]
    if missing and not any(_asks_help(words) for words in sections.values()):
        raise NodeUsageError(f"no {' or '.join(missing)} section")
    return sections


def _asks_help(words: Sequence[str]) -> bool:
    return any(w in ("-h", "--help") for w in words)


def section_environment(service: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables a section reads: HEXMQ_<OPTION>, and HEXMQ_NODE_<SERVICE>_<OPTION> as
    HEXMQ_<OPTION> (it wins)."""
    out = dict(env)
    prefix = f"{NODE_PREFIX}{service.upper()}_"
    for name, value in env.items():
        if name.startswith(prefix):
            out[envoptions.PREFIX + name[len(prefix) :]] = value
    return out


@dataclass
class Section:
    service: str
    module: Any
    args: argparse.Namespace


def parse_sections(argv: Sequence[str], env: Mapping[str, str]) -> list[Section]:
    """Each service's options, parsed by its own parser (in SECTIONS order). SystemExit for
    --help and argparse's usage errors, NodeUsageError for the rest."""
    words = split_sections(argv)
    helped = [service for service, given in words.items() if _asks_help(given)]
    out = []
    for service, module_name in SECTIONS.items():
        if helped and service not in helped:
            continue
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(
            prog=f"hexmq node -- {service}", description=f"The {service} section of hexmq node."
        )
        module.add_arguments(parser)
        try:
            from_env = envoptions.apply_environment(parser, section_environment(service, env))
        except envoptions.EnvOptionError as exc:
            raise NodeUsageError(f"{service}: {exc}") from None
        args = from_env.finish(parser.parse_args(words[service]))
        out.append(Section(service, module, args))
    nodes = {s.args.node_id for s in out}
    if len(nodes) != 1:
        named = ", ".join(f"{s.service} {s.args.node_id}" for s in out)
        raise NodeUsageError(f"the sections name different nodes ({named})")
    for option in PROCESS_WIDE:
        given = {s.service: getattr(s.args, option) for s in out if hasattr(s.args, option)}
        if len(set(given.values())) > 1:
            named = ", ".join(f"{service} {value}" for service, value in given.items())
            raise NodeUsageError(
                f"--{option.replace('_', '-')} differs between the sections ({named}): it "
                "sets the pacing of the whole process"
            )
    return out


def log_level(sections: Sequence[Section]) -> str:
    """The most verbose of the sections' --log-level (one process has one log)."""
    levels: list[str] = [s.args.log_level.upper() for s in sections]
    return min(levels, key=lambda name: logging.getLevelNamesMapping().get(name, logging.INFO))


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    if argv[:1] in (["-h"], ["--help"]):
        print(__doc__.strip())
        return 0
    try:
        sections = parse_sections(argv, env)
    except NodeUsageError as exc:
        print(f"hexmq node: error: {exc}\n{USAGE}", file=sys.stderr)
        return EXIT_USAGE
    except SystemExit as exc:  # a section's --help or usage error (argparse printed it)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    first = sections[0].args
    setup_logging("node", first.node_id, log_level(sections))
    colocated = NodeServers(first.node_id)
    mains: dict[str, ServiceMain] = {}
    for section in sections:
        prepared = section.module.prepare(section.args, colocated)
        if isinstance(prepared, int):
            log.error("the %s section's options cannot be used (above)", section.service)
            return int(prepared)
        mains[section.service] = prepared
    return run_service(lambda stop: run_node(mains, stop))


async def run_node(mains: Mapping[str, ServiceMain], stop: StopEvent) -> int:
    """Run the services' mains on this loop until `stop` (or one of them ends), then stop them
    as the module docstring says; the first non-zero exit code, else 0."""
    stops = {service: StopEvent() for service in mains}
    tasks = {
        service: asyncio.create_task(main(stops[service]), name=f"node-{service}")
        for service, main in mains.items()
    }
    asked = asyncio.create_task(stop.wait())
    restarts = Restarts()
    codes: dict[str, int] = {}
    while True:
        done, _ = await asyncio.wait([asked, *tasks.values()], return_when=asyncio.FIRST_COMPLETED)
        ended = {s: _code(s, t) for s, t in tasks.items() if t in done}
        again = restarts.after(ended, asyncio.get_running_loop().time())
        if again is None or asked in done:
            codes = ended
            for service, code in ended.items():
                log.error(
                    "the %s service ended by itself (exit code %d): stopping the node",
                    service,
                    code,
                )
            break
        service, delay = again
        log.error(
            "the %s service ended by itself (exit code %d): starting it again in %.0f s; "
            "the node's other services go on (its edge keeps its clients)",
            service,
            ended[service],
            delay,
        )
        try:
            async with asyncio.timeout(delay):
                await asyncio.shield(asked)
        except TimeoutError:
            pass
        if asked.done():
            codes = ended
            break
        stops[service] = StopEvent()
        tasks[service] = asyncio.create_task(mains[service](stops[service]), name=f"node-{service}")
        restarts.started(service, asyncio.get_running_loop().time())
    asked.cancel()
    if stop.is_set() and stop.leave:
        # SIGTERM: every service at once, each with the leave as in a process of its own.
        for service_stop in stops.values():
            service_stop.leave = True
            service_stop.set()
        # A plain stop meanwhile (SIGINT) cuts the leave short, as in each process.
        forward = asyncio.create_task(_forward_plain(stop, stops.values()))
        for service, task in tasks.items():
            codes.setdefault(service, _code(service, await _wait(task)))
        forward.cancel()
    else:
        for service in STOP_ORDER:
            if service in codes:
                continue
            service_stop = stops[service]
            if stop.plain.is_set():
                service_stop.plain.set()
            service_stop.set()
            codes[service] = _code(service, await _wait(tasks[service]))
    for service in STOP_ORDER:
        if codes.get(service):
            return codes[service]
    return 0


@dataclass
class Restarts:
    """Which service a co-located node starts again in its own process when it ends by itself,
    and after how long. The partition service stops on purpose when it loses its Redis (so
    that its state reloads from Redis when it starts again, docs/failover.md); run alone, its
    process is started again by whoever runs it (`hexmq cluster start`, compose's restart
    policy, Kubernetes), and its node's edge keeps its clients meanwhile. In one process with
    the edge, stopping the node for it would end every MQTT connection of the node: so it alone
    is started again here, after RESTART_FIRST_S, doubling to RESTART_MAX_S while it keeps
    ending within RESTART_STEADY_S of its start. Any other end (the agent, the edge, a
    partition service that exits 0 unasked, two at once) stops the node as before."""

    backoff: float = 0.0
    started_at: dict[str, float] = field(default_factory=dict)

    def after(self, ended: Mapping[str, int], now: float) -> tuple[str, float] | None:
        """(service, seconds to wait before starting it again), or None: stop the node."""
        if list(ended) != ["partition"] or ended["partition"] == 0:
            return None
        since = self.started_at.get("partition")
        steady = since is None or now - since >= RESTART_STEADY_S
        self.backoff = (
            RESTART_FIRST_S if steady or not self.backoff else min(2 * self.backoff, RESTART_MAX_S)
        )
        return "partition", self.backoff

    def started(self, service: str, now: float) -> None:
        self.started_at[service] = now


async def _forward_plain(stop: StopEvent, stops: Iterable[StopEvent]) -> None:
    await stop.plain.wait()
    for service_stop in stops:
        service_stop.plain.set()


async def _wait(task: asyncio.Task[int]) -> asyncio.Task[int]:
    await asyncio.wait([task])
    return task


def _code(service: str, task: asyncio.Task[int]) -> int:
    if task.cancelled():
        return 1
    exc = task.exception()
    if exc is not None:
        log.error("the %s service failed", service, exc_info=exc)
        return 1
    return task.result()
