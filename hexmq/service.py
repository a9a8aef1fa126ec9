"""Process scaffolding shared by the services: logging, telemetry, the event loop, signals."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexmq import telemetry
from hexmq.netaddr import parse_hostport
from hexmq.readiness import LoopReadiness, Probe, declared_by_health

log = logging.getLogger(__name__)


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel a service's background task (if it was started) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


def setup_logging(service: str, node_id: str, level: str = "INFO") -> None:
    """Plain lines by default; one JSON object per line when HEXMQ_LOG_FORMAT=json."""
    if telemetry.json_logs_requested():
        telemetry.setup_json_logging(service, node_id, level)
        return
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {service}[{node_id}] %(name)s: %(message)s",
    )


def add_observability_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-listen",
        default=None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics, and /healthz (the process "
        "is up) and /readyz (the service is ready for work) (default: off)",
    )
    parser.add_argument(
        "--trace-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="also write spans to DIR as OTLP JSON lines; OTLP/gRPC export follows the "
        "standard OTEL_EXPORTER_OTLP_* variables",
    )


# The running services' readiness (one; three in a co-located node), so that a stop signal
# withdraws it at once (load balancers stop sending new clients while the service shuts down in
# stages).
_readiness: list[LoopReadiness] = []


@dataclass
class Observability:
    node_id: str
    tracing: telemetry.Tracing
    metrics_server: telemetry.MetricsServer | None
    readiness: LoopReadiness

    def ready_when(self, probe: Probe) -> None:
        """Make `probe` (run on this loop) the service's readiness, for /readyz and for gRPC
        health followers (hexmq.readiness.follow_in_health). Until a service calls this, its
        readiness is its declared gRPC health (hexmq.readiness.declared_by_health)."""
        self.readiness.bind(asyncio.get_running_loop(), probe)

    async def close(self) -> None:
        # A service started again in the same process (a co-located node's partition service)
        # has a readiness of its own: the stopped one's is no longer withdrawn on a signal.
        if self.readiness in _readiness:
            _readiness.remove(self.readiness)
        # Both block (a flush, an HTTP server's poll interval): keep them off the event loop.
        if self.metrics_server is not None:
            await asyncio.to_thread(self.metrics_server.close)
        await asyncio.to_thread(self.tracing.shutdown)


def start_observability(service: str, node_id: str, args: argparse.Namespace) -> Observability:
    """Tracing (exporters from the environment and --trace-dir), the readiness (declared gRPC
    health until the service names its own probe) and the metrics endpoint. Call it from the
    service's running loop."""
    tracing = telemetry.setup_tracing(service, node_id, trace_dir=args.trace_dir)
    telemetry.METRICS.bind_tracing(tracing)
    readiness = LoopReadiness()
    readiness.bind(asyncio.get_running_loop(), declared_by_health)
    _readiness.append(readiness)
    server = None
    if args.metrics_listen:
        host, port = parse_hostport(args.metrics_listen, what="--metrics-listen")
        server = telemetry.start_metrics_server(host, port, readiness=readiness)
    log.info(
        "tracing %s%s; metrics %s",
        "on" if tracing.enabled else "off",
        f" (files in {args.trace_dir})" if args.trace_dir else "",
        f"on http://{args.metrics_listen}/metrics" if server else "off",
    )
    return Observability(node_id, tracing, server, readiness)


class StopEvent(asyncio.Event):
    """Set by a stop signal. SIGTERM (an orchestrator's stop) sets `leave`: the node leaves the
    cluster gracefully before its services exit (docs/operations.md, "Leaving"); SIGINT (what
    `hexmq cluster stop` sends) is the plain stop, and also cuts a leave under way short
    (`plain` is set)."""

    def __init__(self) -> None:
        super().__init__()
        self.leave = False
        self.plain = asyncio.Event()


# The garbage collector's thresholds for the services (CPython's defaults: 700, 10, 10). A
# partition service keeps a few million long-lived objects (sessions, queued messages, each
# partition's recent replication log) and allocates a few hundred thousand short-lived ones a
# second at moderate load; with the defaults, collections that walk the old generations ran
# so often that they took a quarter of its busy time (py-spy --native at 5,000 msg/s, 3 nodes
# RF 3: docs/benchmarks.md), an eighth of the edge's. With these the young generation is
# collected every 20,000 net allocations instead of 700 (a collection of that many young
# objects takes about a millisecond), the middle one every 1,000,000 instead of 7,000, the
# whole heap at most every 20,000,000 instead of 70,000 (and, as before, only once it grew by a
# quarter since the last full collection).
GC_THRESHOLDS = (20_000, 50, 20)


def tune_gc() -> None:
    """Objects made while starting (modules, descriptors, parsers) are never garbage: move them
    out of the collector's sight (gc.freeze: no collection first, which took a third of a second
    of a service's start on a busy machine), and collect the rest less often."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


# A service's life on a running loop: serve until the event is set, stop in stages, return the
# exit code (each service's `prepare` makes one; `run_service` runs one, `hexmq node` three).
ServiceMain = Callable[["StopEvent"], Coroutine[Any, Any, int]]


def run_service(main: ServiceMain) -> int:
    """Run `main(stop_event)` on uvloop (when installed); SIGTERM and SIGINT set the event, and
    `main` is expected to shut down in stages and return its exit code."""
    tune_gc()

    async def wrapper() -> int:
        stop = StopEvent()
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            for readiness in _readiness:
                readiness.stopping()
            if sig == signal.SIGTERM and not stop.is_set():
                stop.leave = True
            elif sig == signal.SIGINT:
                stop.plain.set()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        return await main(stop)

    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(wrapper())
