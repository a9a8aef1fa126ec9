"""The node's liveness in Consul: its service registration with a TTL check, and a session
(TTL, LockDelay 0, behavior delete, bound to that check) renewed every TTL/3.

The session is the node's lease: valid while the last successful renewal is younger than the
TTL (Consul may keep it up to 2 x TTL, never less than TTL). A renewal answered 404 means the
session is gone (its keys with it): a new one is created at once and `on_new_session` tells the
agent to write its keys again. Consul unreachable: keep trying with backoff, one log line per
change of state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import consul

from services.membership.records import (
    SERVICE_NAME,
    MemberRecord,
    service_check_id,
    service_registration,
)

log = logging.getLogger("hexmq.membership")

# Errors that mean "Consul did not do it" (unreachable, timed out, refused the request).
CONSUL_ERRORS: tuple[type[BaseException], ...] = (
    consul.ConsulException,
    aiohttp.ClientError,
    OSError,
    TimeoutError,
)

MAX_BACKOFF_S = 2.0


@dataclass(frozen=True, slots=True)
class Lease:
    valid: bool
    valid_for_ms: int


class Reachability:
    """Whether this agent reaches Consul, from every part that talks to it (session, watches,
    writes). Logged once per change of state, not once per failed request."""

    def __init__(self, on_restored: Callable[[], None] = lambda: None) -> None:
        self._failing: dict[str, str] = {}
        self._ever_ok = False
        # Called when Consul answers again after a stretch in which some part found it
        # unreachable (not on the first answer).
        self._on_restored = on_restored

    @property
    def ok(self) -> bool:
        return self._ever_ok and not self._failing

    def report(self, part: str, exc: BaseException | None) -> None:
        was_ok, was_failing = self.ok, bool(self._failing)
        if exc is None:
            self._failing.pop(part, None)
            self._ever_ok = True
        else:
            self._failing[part] = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if self._failing and not was_failing:
            log.warning(
                "Consul unreachable (%s: %s); keeping the last view and retrying",
                part,
                self._failing[part],
            )
        elif self.ok and not was_ok:
            log.info("Consul reachable: node registered, session held, cluster watched")
            if was_failing:
                self._on_restored()


def lease_at(renewed_at: float | None, ttl_s: float, now: float) -> Lease:
    """The lease at monotonic time `now`, given the last successful renewal (or creation)."""
    if renewed_at is None:
        return Lease(False, 0)
    left = renewed_at + ttl_s - now
    return Lease(True, int(left * 1000)) if left > 0 else Lease(False, 0)


class LivenessSession:
    def __init__(
        self,
        client: Any,
        *,
        name: str,
        ttl_s: int,
        on_new_session: Callable[[str], None],
        on_lease_change: Callable[[], None],
        reachability: Reachability,
        clock: Callable[[], float] = time.monotonic,
        service_name: str = SERVICE_NAME,
        service_tags: Sequence[str] = (),
    ) -> None:
        self._consul = client
        self._service = (service_name, tuple(service_tags))
        self._name = name
        self._ttl_s = ttl_s
        self._cleared_old = False
        self._on_new_session = on_new_session
        self._on_lease_change = on_lease_change
        self._reachability = reachability
        self._clock = clock
        self.session_id: str | None = None
        self.renewed_at: float | None = None
        self.reachable = False
        self._record: MemberRecord | None = None
        self._registered: MemberRecord | None = None
        self._wake = asyncio.Event()

    @property
    def holds_session(self) -> bool:
        """The last round with Consul succeeded and a session is held."""
        return self.reachable and self.session_id is not None

    def lease(self) -> Lease:
        return lease_at(self.renewed_at, self._ttl_s, self._clock())

    def set_record(self, record: MemberRecord) -> None:
        """The node's current record: re-registered in the next round (at once)."""
        if record != self._record:
            self._record = record
            self._wake.set()

    async def run(self) -> None:
        backoff = 0.1
        while True:
            try:
                async with asyncio.timeout(max(1.0, self._ttl_s / 3)):
                    await self._round()
                backoff = 0.1
                self._set_reachable(True, None)
                delay = self._ttl_s / 3
            except CONSUL_ERRORS as exc:
                self._set_reachable(False, exc)
                delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_S)
            # A lapsed lease is news for the Lease streams even when nothing answers.
            self._on_lease_change()
            self._wake.clear()
            try:
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _round(self) -> None:
        record = self._record
        assert record is not None, "set_record before run"
        check_id = service_check_id(record.node_id)
        if record != self._registered:
            name, tags = self._service
            await self._consul.agent.service.register(
                **service_registration(record, self._ttl_s, name, tags)
            )
            self._registered = record
        await self._consul.agent.check.ttl_pass(check_id)
        if self.session_id is not None:
            try:
                await self._consul.session.renew(self.session_id)
            except consul.NotFound:
                log.warning(
                    "session %s of node %s is gone (expired or invalidated): creating a new one "
                    "and writing the node's keys again",
                    self.session_id,
                    record.node_id,
                )
                self.session_id = None
            else:
                self.renewed_at = self._clock()
                return
        if not self._cleared_old:
            await self._end_sessions_of_a_previous_agent()
            self._cleared_old = True
        # Only the node's own check: a critical check then ends the session too (passing
        # `checks` replaces Consul's default serfHealth, which a dev server may not run).
        started = self._clock()
        session_id = await self._consul.session.create(
            name=self._name,
            checks=[check_id],
            lock_delay=0,
            behavior="delete",
            ttl=self._ttl_s,
        )
        self.session_id = session_id
        self.renewed_at = started
        log.info(
            "session %s created for node %s (ttl %d s)", session_id, record.node_id, self._ttl_s
        )
        self._on_new_session(session_id)

    async def _end_sessions_of_a_previous_agent(self) -> None:
        """A session of this node's previous agent (killed, restarted) still holds the node's
        keys until Consul ends it, up to 2 x TTL later: this agent could not write them
        meanwhile, and the node would drop out of the view when that session finally lapsed.
        End it now instead (its keys go, and this agent writes them again at once)."""
        _, sessions = await self._consul.session.list()
        for session in sessions or []:
            if session.get("Name") == self._name:
                log.warning(
                    "ending session %s of a previous agent of this node (%s)",
                    session.get("ID"),
                    self._name,
                )
                await self._consul.session.destroy(session["ID"])

    def _set_reachable(self, reachable: bool, exc: BaseException | None) -> None:
        self.reachable = reachable
        self._reachability.report("session", exc)

    async def close(self) -> None:
        """On a graceful stop: end the session (its keys go at once, so peers remove this node
        without waiting for the TTL) and deregister the service."""
        record = self._record
        try:
            async with asyncio.timeout(2.0):
                if self.session_id is not None:
                    await self._consul.session.destroy(self.session_id)
                if record is not None and self._registered is not None:
                    await self._consul.agent.service.deregister(record.node_id)
        except CONSUL_ERRORS as exc:
            log.warning("could not end session %s on stop: %s", self.session_id, exc)
        self.session_id = None
        self.renewed_at = None
