"""Failure detection (docs/failover.md, "Failure detection"): probe every other view member's
partition service with the standard gRPC health check, and turn the outcomes into reports.

`FailureDetector` is the pure core (outcomes in, with the time; reports out). `probe_once` is
the I/O of one probe: a health check, and for a failure that looks like a gone process, one
plain TCP connect to confirm it. `Prober` runs one loop per peer and feeds the detector.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hexmq.netaddr import parse_hostport
from hexmq.service import cancel_and_wait
from hexmq.trust.grpc_tls import ClusterTLS, PeerRefused
from hexmq.trust.identity import PARTITION, Identity

log = logging.getLogger(__name__)


class Outcome(enum.Enum):
    OK = "ok"
    # Connection refused or reset, confirmed by a second, plain TCP connect: the process is gone.
    REFUSED = "refused"
    # No answer in time, or an answer that is not SERVING: evidence only when it lasts.
    FAILED = "failed"


# After a false alarm (a peer this agent reported silent answers again) the silence it allows
# that peer doubles, up to this many doublings; it is back to --suspect-after once the peer
# has answered for FORGIVE_MS since its last false alarm.
MAX_STRIKES = 3
FORGIVE_MS = 30_000


@dataclass(slots=True)
class SilenceAllowance:
    """How long one peer may stay silent before this agent reports it.

    --suspect-after at first, doubled after each false alarm: a peer reported silent that
    answers again was alive (stalled: a loaded machine, a busy event loop, a pause), and was
    removed from the view for it. A node whose loop stalls under the work its admission brings
    (a join's catch-up, the partitions a restore gives back) would otherwise be removed again
    at its next stall of the same length, and flap for as long as the load lasts (the
    rebalance benchmark at load 20: 32 removals in 3 minutes). Real deaths are unaffected: a
    gone process is refused, not silent, and a peer that stays silent is reported, only later.
    Shared by FailureDetector and the agreement simulator (tests/support/agreement_sim.py)."""

    base_ms: int
    strikes: int = 0
    # A silence report of this peer stands (made, and no answer since).
    reported: bool = False
    # When its last false alarm ended.
    cleared_ms: int = 0

    def limit_ms(self, now_ms: int) -> int:
        if self.strikes and not self.reported and now_ms - self.cleared_ms >= FORGIVE_MS:
            self.strikes = 0
        return self.base_ms << self.strikes

    def report(self) -> None:
        self.reported = True

    def answered(self, now_ms: int) -> None:
        if self.reported:
            self.reported = False
            self.strikes = min(self.strikes + 1, MAX_STRIKES)
            self.cleared_ms = now_ms


@dataclass(slots=True)
class _Peer:
    # The last time the peer answered (or when probing it began): silence is counted from here.
    last_ok_ms: int
    allowance: SilenceAllowance
    last: Outcome | None = None
    # Whether it has answered since this agent began probing it: until then a refusal is
    # only silence (a partition service starts serving a moment after the view admits it).
    answered: bool = False


class FailureDetector:
    """What this agent reports about its peers, from its probes' outcomes.

    A confirmed refusal of a peer that has answered before is reported "refused" at once;
    failures (and refusals of a peer that never answered yet) are reported "silent" once the
    peer has not answered for `suspect_after_ms` (longer after false alarms:
    `SilenceAllowance`); any answer clears the report."""

    def __init__(self, suspect_after_ms: int) -> None:
        if suspect_after_ms <= 0:
            raise ValueError(f"suspect_after_ms must be positive, got {suspect_after_ms}")
        self._suspect_after_ms = suspect_after_ms
        self._peers: dict[str, _Peer] = {}

    def watch(self, peers: Iterable[str], now_ms: int) -> None:
        """Probe exactly these peers from now on: new ones start unsuspected at `now_ms`,
        others are forgotten (with their reports)."""
        wanted = set(peers)
        self._peers = {
            node: self._peers.get(node)
            or _Peer(last_ok_ms=now_ms, allowance=SilenceAllowance(self._suspect_after_ms))
            for node in sorted(wanted)
        }

    def record(self, node: str, outcome: Outcome, now_ms: int) -> None:
        peer = self._peers.get(node)
        if peer is None:
            return  # a probe that finished after its peer left the view
        if outcome is Outcome.REFUSED and not peer.answered:
            outcome = Outcome.FAILED
        peer.last = outcome
        if outcome is Outcome.OK:
            peer.last_ok_ms = now_ms
            peer.answered = True
            peer.allowance.answered(now_ms)
        elif outcome is Outcome.REFUSED:
            peer.allowance.reported = False  # gone, not stalled: no false alarm

    def reports(self, now_ms: int) -> dict[str, str]:
        """{node: "refused" | "silent"} for the peers this agent finds unreachable now."""
        found = {}
        for node, peer in self._peers.items():
            if peer.last is Outcome.REFUSED:
                found[node] = "refused"
            elif (
                peer.last is Outcome.FAILED
                and now_ms - peer.last_ok_ms >= peer.allowance.limit_ms(now_ms)
            ):
                found[node] = "silent"
                peer.allowance.report()
        return found

    def doubted_since(self, node: str) -> int | None:
        """When `node` last answered, if its latest probe failed (None: it answers, or it is
        not probed): the start of this agent's doubt about it."""
        peer = self._peers.get(node)
        if peer is None or peer.last in (None, Outcome.OK):
            return None
        return peer.last_ok_ms

    def probe_states(self, now_ms: int) -> dict[str, str]:
        """For Status: "ok", "silent" (failing, not yet or already reported) or "refused"."""
        states = {}
        for node, peer in self._peers.items():
            if peer.last is None:
                states[node] = ""
            elif peer.last is Outcome.FAILED:
                states[node] = "silent"
            else:
                states[node] = peer.last.value
        return states


def looks_gone(code: object) -> bool:
    """A failed health check that may mean the process is gone (refused or reset connection):
    gRPC reports those as UNAVAILABLE. Timeouts (DEADLINE_EXCEEDED) and every other status
    are silence, never strong evidence."""
    return bool(code == grpc.StatusCode.UNAVAILABLE)


def name_gone(exc: socket.gaierror) -> bool:
    """A lookup answered "no such name" (NXDOMAIN; EAI_NONAME), not one that got no answer
    (EAI_AGAIN: the DNS server is down or cut off, which is silence)."""
    return exc.errno == socket.EAI_NONAME


async def tcp_refused(addr: str, timeout_s: float) -> bool:
    """True only if nothing is there: a TCP connect to `addr` is refused or reset, or its host
    name no longer exists.

    A container engine's DNS (Docker's, podman's aardvark-dns) drops a container's name as
    soon as the container stops, and Kubernetes a pod's once the pod is deleted: a killed
    container refuses connections for only the ~0.1-0.2 s before its network is torn down
    (measured under podman), and then its name is gone. Taken as silence, that needed a
    majority of reports after --suspect-after (longer after false alarms) where a refusal
    needs one: a compose node's kill failed over in 0.5 s or in 2-8 s, depending on which
    the confirming connect met (issue 27)."""
    host, port = parse_hostport(addr)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    except socket.gaierror as exc:
        return name_gone(exc)
    except (TimeoutError, OSError):
        return False  # unreachable or slow: silence, not a refusal
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return False


class ProbeTarget(NamedTuple):
    """A peer's partition service: its address, and whether it serves TLS (Member.tls)."""

    addr: str
    tls: bool


class ProbeChannel:
    """One peer's health-check channel. A failed probe drops the channel, so the next probe
    connects afresh instead of waiting out gRPC's reconnect backoff (up to minutes), which
    would report a restarted peer silent long after it is back."""

    def __init__(self, node: str, target: ProbeTarget, tls: ClusterTLS) -> None:
        self.addr = target.addr
        self._peer = Identity(PARTITION, node)
        self._peer_tls = target.tls
        self._tls = tls
        self._channel: grpc.aio.Channel | None = None
        self._refusal_logged = False

    async def check(self, timeout_s: float) -> Outcome:
        if self._channel is None:
            # A subchannel of its own: gRPC shares subchannels between channels to one address,
            # and a new channel could pick up the dropped one's, still in reconnect backoff
            # (its first probe then failed at once though the peer was back: a flaky test).
            try:
                self._channel = self._tls.channel(
                    self.addr,
                    peer=self._peer,
                    peer_tls=self._peer_tls,
                    options=[("grpc.use_local_subchannel_pool", 1)],
                )
            except PeerRefused as exc:
                # A peer this agent may not dial cannot be vouched for: silence, reported as
                # any other once it lasts.
                if not self._refusal_logged:
                    log.error("not probing %s at %s: %s", self._peer, self.addr, exc)
                    self._refusal_logged = True
                return Outcome.FAILED
        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            await self.close()
            if looks_gone(exc.code()) and await tcp_refused(self.addr, timeout_s):
                return Outcome.REFUSED
            return Outcome.FAILED
        # Any status answers the question asked here: the process is alive and reachable.
        # Whether it serves the view is its incarnation's business (NOT_SERVING while it
        # starts or stops must not get it suspected by its peers).
        del reply
        return Outcome.OK

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


Clock = Callable[[], int]


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Prober:
    """One probing loop per peer partition service; every outcome goes to the detector, and
    `on_change` is called whenever the reports change."""

    def __init__(
        self,
        detector: FailureDetector,
        *,
        interval_s: float,
        timeout_s: float,
        on_change: Callable[[], None],
        clock: Clock = monotonic_ms,
        tls: ClusterTLS,
    ) -> None:
        self._detector = detector
        self._tls = tls
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._on_change = on_change
        self._clock = clock
        self._tasks: dict[str, tuple[ProbeTarget, asyncio.Task[None]]] = {}
        self._reports: dict[str, str] = {}

    @property
    def reports(self) -> dict[str, str]:
        return dict(self._reports)

    def set_peers(self, peers: Mapping[str, ProbeTarget]) -> None:
        """Probe exactly these peers ({node: its partition service}) from now on."""
        self._detector.watch(peers, self._clock())
        for node, (target, task) in list(self._tasks.items()):
            if peers.get(node) != target:
                del self._tasks[node]
                task.cancel()  # its loop closes its channel on the way out
        for node, target in sorted(peers.items()):
            if node not in self._tasks:
                task = asyncio.create_task(self._probe_loop(node, target), name=f"probe-{node}")
                self._tasks[node] = (target, task)
        self._refresh()

    async def stop(self) -> None:
        for _, task in self._tasks.values():
            await cancel_and_wait(task)
        self._tasks.clear()

    def refresh(self) -> None:
        """Re-evaluate the reports (silence grows with time, not only with outcomes)."""
        self._refresh()

    def _refresh(self) -> None:
        reports = self._detector.reports(self._clock())
        if reports != self._reports:
            self._reports = reports
            self._on_change()

    async def _probe_loop(self, node: str, target: ProbeTarget) -> None:
        channel = ProbeChannel(node, target, self._tls)
        try:
            while True:
                started = time.monotonic()
                outcome = await channel.check(self._timeout_s)
                self._detector.record(node, outcome, self._clock())
                self._refresh()
                spent = time.monotonic() - started
                await asyncio.sleep(max(0.0, self._interval_s - spent))
        finally:
            await channel.close()
