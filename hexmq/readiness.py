"""Readiness: whether a service should be sent work now, as HTTP /readyz and gRPC health say.

A service passes a small probe function (`Probe`) saying whether it is ready and why not; the
probe runs on the service's event loop, where the state it reads lives, so it needs no locks.
`LoopReadiness` answers from any thread (the metrics HTTP server's) by running the probe on
that loop and waiting a bounded time: a loop that does not answer is not ready either.

Liveness (/healthz) is only "the process answers"; readiness is the service's own predicate:
the edge's in services/edge/readiness.py, the membership service's in its main, and for a
service that passes none (the partition service), `declared_by_health`: ready once the service
has set its gRPC health status to SERVING (hexmq.health), which it does once it has a view and
serves. docs/deploy.md says what each one means to a load balancer or orchestrator.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:  # gRPC is slow to import; the metrics server imports this module
    from hexmq.health import DeclaringHealthServicer

# How long an HTTP /readyz waits for the event loop to run the probe.
PROBE_TIMEOUT_S: Final = 2.0


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    # One line for operators: what it serves, or why it is not ready.
    reason: str


Probe = Callable[[], Readiness]

STARTING: Final = Readiness(False, "starting")
STOPPING: Final = Readiness(False, "shutting down")


def declared_by_health() -> Readiness:
    """Ready once the service has declared its gRPC health SERVING (and not withdrawn it)."""
    from hexmq import health

    status = health.declared_status()
    if status is None:
        return Readiness(False, "gRPC health not declared yet (no view, or not serving yet)")
    if status != health.SERVING:
        return Readiness(False, "gRPC health is NOT_SERVING")
    return Readiness(True, "serving")


class LoopReadiness:
    """The service's readiness as other threads see it: the probe, run on the service's loop.

    Before `bind` (startup) it answers STARTING; after `stopping()` (shutdown began, so load
    balancers drain the service before it closes its listeners) it answers STOPPING."""

    def __init__(self, timeout: float = PROBE_TIMEOUT_S) -> None:
        self._timeout = timeout
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._probe: Probe | None = None
        self._stopping = False

    def bind(self, loop: asyncio.AbstractEventLoop, probe: Probe) -> None:
        with self._lock:
            self._loop, self._probe = loop, probe

    def stopping(self) -> None:
        with self._lock:
            self._stopping = True

    def check_on_loop(self) -> Readiness:
        """The readiness, called on the service's own loop (gRPC health followers)."""
        with self._lock:
            probe, stopping = self._probe, self._stopping
        if stopping:
            return STOPPING
        if probe is None:
            return STARTING
        return probe()

    def __call__(self) -> Readiness:
        """The readiness, from any thread but the loop's own (it waits for the loop)."""
        with self._lock:
            loop, probe, stopping = self._loop, self._probe, self._stopping
        if stopping:
            return STOPPING
        if loop is None or probe is None:
            return STARTING
        answer: concurrent.futures.Future[Readiness] = concurrent.futures.Future()

        def run() -> None:
            try:
                answer.set_result(probe())
            except Exception as exc:  # a probe bug must read as "not ready", not hang /readyz
                answer.set_result(Readiness(False, f"readiness probe failed: {exc!r}"))

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError:  # the loop is closed: the service is going away
            return STOPPING
        try:
            return answer.result(self._timeout)
        except TimeoutError:
            return Readiness(False, f"event loop did not answer within {self._timeout:g} s")


async def follow_in_health(
    readiness: LoopReadiness,
    servicer: DeclaringHealthServicer,
    interval: float = 0.5,
) -> None:
    """Keep the gRPC health status ("") equal to the readiness, checked every `interval`
    (services whose readiness is a predicate, not a declared status: edge, membership)."""
    from hexmq import health

    last: int | None = None
    while True:
        status = health.SERVING if readiness.check_on_loop().ready else health.NOT_SERVING
        if status != last:
            await servicer.set("", status)
            last = status
        await asyncio.sleep(interval)
