"""ConsulState: the deterministic core of `hexmq consul-dev`.

KV, sessions and the agent's services and TTL checks of a one-node Consul, with Consul's
semantics (agent/consul/state/{kvs,session,catalog}.go, session_ttl.go). Every call that can
change something takes the clock (`now`, seconds on the server's monotonic clock); timers are
deadlines that `tick(now)` acts on and `next_deadline()` reports. What changed is recorded, not
acted on: `take_effects()` hands the adapter the changes (to wake blocking queries and persist)
and the notices (to log). Reads answer (index, result) as Consul's state store does.

Indexes work as Consul's Raft indexes: one counter for every table, a write that changes
something takes the next one, and every table keeps the highest index written to it.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from services.membership.consul_dev.catalog import Catalog
from services.membership.consul_dev.decode import ServiceDefinition, SessionSpec
from services.membership.consul_dev.kv import KVStore, Tombstone
from services.membership.consul_dev.model import (
    BEHAVIOR_DELETE,
    BEHAVIOR_RELEASE,
    CRITICAL,
    NS,
    SESSION_TTL_MAX_NS,
    SESSION_TTL_MIN_NS,
    SESSION_TTL_MULTIPLIER,
    TOMBSTONE_TTL_S,
    Change,
    Check,
    CheckCritical,
    DurationError,
    KVChanged,
    KVEntry,
    Notice,
    Service,
    ServiceChanged,
    ServiceReaped,
    Session,
    SessionChanged,
    SessionInvalidated,
    format_go_duration,
    parse_go_duration,
    server_error,
)

SNAPSHOT_FORMAT = "hexmq-consul-dev/1"
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def check_session_id(session_id: str) -> None:
    """Consul looks sessions up by UUID: anything else is an error of the lookup (500)."""
    if len(session_id) != 36:
        raise server_error("failed session lookup: UUID must be 36 characters")
    if not _UUID.fullmatch(session_id):
        raise server_error(f"failed session lookup: invalid UUID {session_id!r}")


@dataclass(slots=True)
class Effects:
    """What happened since the last take_effects(): changes (wake watchers, persist the state)
    and notices (one log line each)."""

    changes: list[Change] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)


class ConsulState:
    def __init__(
        self,
        node_name: str,
        *,
        node_id: str | None = None,
        address: str = "127.0.0.1",
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.node_name = node_name
        self.kv = KVStore()
        self.catalog = Catalog(node_name, node_id or new_id(), address)
        self.sessions: dict[str, Session] = {}
        self.sessions_index = 0
        self.last_index = 0
        self._new_id = new_id
        self._effects = Effects()
        self._session_changes: list[SessionChanged] = []
        # Index 1 goes to the node's registration, so no user write ever has index 1: a
        # blocking query answered index 1 (the floor) cannot miss the first write.
        self.catalog.bootstrap(1)
        self.last_index = 1

    # --- effects and indexes -----------------------------------------------------------------

    def take_effects(self) -> Effects:
        effects, self._effects = self._effects, Effects()
        return effects

    def _next(self) -> int:
        return self.last_index + 1

    def _commit(self, idx: int) -> None:
        """Close one write: if anything changed, `idx` becomes the last index."""
        changes: list[Change] = [KVChanged(k) for k in self.kv.drain_written()]
        changes += [ServiceChanged(n) for n in sorted(self.catalog.drain_changed())]
        changes += self._session_changes
        self._session_changes = []
        if changes:
            self.last_index = idx
            self._effects.changes.extend(changes)

    # --- KV ----------------------------------------------------------------------------------

    def kv_get(self, key: str) -> tuple[int, KVEntry | None]:
        return self.kv.get(key)

    def kv_list(self, prefix: str) -> tuple[int, list[KVEntry]]:
        return self.kv.list_prefix(prefix)

    def kv_keys(self, prefix: str, separator: str) -> tuple[int, list[str]]:
        return self.kv.keys(prefix, separator)

    def kv_put(
        self,
        key: str,
        value: bytes | None,
        *,
        now: float,
        flags: int = 0,
        cas: int | None = None,
        acquire: str | None = None,
        release: str | None = None,
    ) -> bool:
        """PUT /v1/kv/<key>: true if written (plain PUT: always). cas, acquire and release
        exclude each other (the HTTP layer answers 400 for more than one)."""
        if sum(x is not None for x in (cas, acquire, release)) > 1:
            raise ValueError("cas, acquire and release exclude each other")
        idx = self._next()
        if acquire is not None:
            # Lock-delay is checked first, before the session (Consul's kvsPreApply).
            if self.kv.in_lock_delay(key, now):
                return False
            self._require_session(acquire)
            done = self.kv.lock(idx, key, value, flags, acquire)
        elif release is not None:
            if not release:
                raise server_error("missing session")
            done = self.kv.unlock(idx, key, value, flags, release)
        elif cas is not None:
            done = self.kv.set_cas(idx, key, value, flags, cas)
        else:
            self.kv.set(idx, key, value, flags)
            done = True
        self._commit(idx)
        return done

    def kv_delete(
        self, key: str, *, now: float, recurse: bool = False, cas: int | None = None
    ) -> bool:
        """DELETE /v1/kv/<key>: true unless a CAS delete lost."""
        idx = self._next()
        if cas is not None:
            done = self.kv.delete_cas(idx, key, cas, now)
        elif recurse:
            self.kv.delete_tree(idx, key, now)
            done = True
        else:
            self.kv.delete(idx, key, now)
            done = True
        self._commit(idx)
        return done

    def _require_session(self, session_id: str) -> None:
        if not session_id:
            raise server_error("missing session")
        check_session_id(session_id)
        if session_id not in self.sessions:
            raise server_error(f'invalid session "{session_id}"')

    # --- sessions ----------------------------------------------------------------------------

    def session_create(self, spec: SessionSpec, now: float) -> str:
        """PUT /v1/session/create, validated in Consul's order (Session.Apply, then the state
        store's node and check lookups)."""
        node = self.node_name if spec.node is None else spec.node
        if not node:
            raise server_error("Must provide Node")
        behavior = spec.behavior or BEHAVIOR_RELEASE
        if behavior not in (BEHAVIOR_RELEASE, BEHAVIOR_DELETE):
            raise server_error(f"Invalid Behavior setting '{behavior}'")
        ttl_ns = 0
        if spec.ttl:
            try:
                ttl_ns = parse_go_duration(spec.ttl)
            except DurationError as exc:
                raise server_error(f"Session TTL '{spec.ttl}' invalid: {exc}") from None
            if ttl_ns != 0 and not SESSION_TTL_MIN_NS <= ttl_ns <= SESSION_TTL_MAX_NS:
                raise server_error(
                    f"Invalid Session TTL '{ttl_ns}', must be between "
                    f"[{format_go_duration(SESSION_TTL_MIN_NS)}="
                    f"{format_go_duration(SESSION_TTL_MAX_NS)}]"
                )
        if node != self.node_name:
            raise server_error("Missing node registration")
        session_id = self._new_id()
        while session_id in self.sessions:
            session_id = self._new_id()
        idx = self._next()
        session = Session(
            session_id,
            spec.name,
            node,
            spec.lock_delay_ns,
            behavior,
            spec.ttl,
            ttl_ns,
            spec.node_checks,
            spec.service_checks,
            spec.checks,
            idx,
            idx,
        )
        for check_id in session.check_ids():
            check = self.catalog.checks.get(check_id)
            if check is None:
                raise server_error(f"Missing check '{check_id}' registration")
            if check.status == CRITICAL:
                raise server_error(f"Check '{check_id}' is in {CRITICAL} state")
        self._renew(session, now)
        self.sessions[session_id] = session
        self.sessions_index = idx
        self._session_changes.append(SessionChanged(session_id, node))
        self._commit(idx)
        return session_id

    def _renew(self, session: Session, now: float) -> None:
        """The server's timer is 2 x TTL (session_ttl.go): TTL is the least a session lives."""
        if session.ttl_ns:
            session.expires_at = now + SESSION_TTL_MULTIPLIER * session.ttl_ns / NS

    def session_renew(self, session_id: str, now: float) -> Session | None:
        """PUT /v1/session/renew/<id>: None for an unknown session (Consul answers 404)."""
        check_session_id(session_id)
        session = self.sessions.get(session_id)
        if session is not None:
            self._renew(session, now)
        return session

    def session_destroy(self, session_id: str, now: float) -> None:
        """PUT /v1/session/destroy/<id>; destroying a missing session is no error."""
        check_session_id(session_id)
        session = self.sessions.get(session_id)
        if session is None:
            return
        idx = self._next()
        self._invalidate(session, "destroyed", idx, now)
        self._commit(idx)

    def session_info(self, session_id: str) -> tuple[int, Session | None]:
        check_session_id(session_id)
        return self.sessions_index, self.sessions.get(session_id)

    def session_list(self) -> tuple[int, list[Session]]:
        return self.sessions_index, [self.sessions[k] for k in sorted(self.sessions)]

    def session_node(self, node: str) -> tuple[int, list[Session]]:
        index, sessions = self.session_list()
        return index, [s for s in sessions if s.node == node]

    def _invalidate(self, session: Session, reason: str, idx: int, now: float) -> None:
        """Delete a session: behavior release frees the keys it holds, delete deletes them;
        either way each key starts the session's lock-delay (deleteSessionTxn)."""
        del self.sessions[session.id]
        self.sessions_index = idx
        self._session_changes.append(SessionChanged(session.id, session.node))
        released: list[str] = []
        deleted: list[str] = []
        for entry in sorted(self.kv.held_by(session.id), key=lambda e: e.key):
            if session.behavior == BEHAVIOR_DELETE:
                self.kv.delete(idx, entry.key, now)
                deleted.append(entry.key)
            else:
                self.kv.release_session(idx, entry.key)
                released.append(entry.key)
            self.kv.start_lock_delay(entry.key, session.lock_delay_ns, now)
        self._effects.notices.append(
            SessionInvalidated(session.id, session.name, reason, tuple(released), tuple(deleted))
        )

    def _invalidate_for_check(self, check_id: str, reason: str, idx: int, now: float) -> None:
        for session in [self.sessions[k] for k in sorted(self.sessions)]:
            if session.node == self.node_name and check_id in session.check_ids():
                self._invalidate(session, reason, idx, now)

    # --- agent services and checks -----------------------------------------------------------

    def service_register(self, definition: ServiceDefinition, now: float) -> None:
        idx = self._next()
        outcome = self.catalog.register(definition, idx, now)
        for check_id in outcome.removed_checks:
            self._invalidate_for_check(check_id, f"check {check_id} was deregistered", idx, now)
        self._commit(idx)

    def service_deregister(self, service_id: str, now: float) -> None:
        idx = self._next()
        for check_id in self.catalog.deregister(service_id, idx):
            self._invalidate_for_check(check_id, f"check {check_id} was deregistered", idx, now)
        self._commit(idx)

    def check_update(self, check_id: str, status: str, output: str, now: float) -> None:
        """PUT /v1/agent/check/{pass,warn,fail}/<id>?note=: sets the status and restarts the
        check's TTL; a check that goes critical invalidates the sessions that name it."""
        idx = self._next()
        if self.catalog.update_check(check_id, status, output, idx, now).went_critical:
            self._went_critical(self.catalog.checks[check_id], idx, now)
        self._commit(idx)

    def _went_critical(self, check: Check, idx: int, now: float) -> None:
        self._effects.notices.append(CheckCritical(check.check_id, check.service_id, check.output))
        self._invalidate_for_check(check.check_id, f"check {check.check_id} is critical", idx, now)

    def agent_services(self) -> dict[str, Any]:
        return self.catalog.agent_services()

    def agent_checks(self) -> dict[str, Any]:
        return self.catalog.agent_checks()

    def health_service(self, name: str, tags: list[str], passing: bool) -> tuple[int, list[Any]]:
        return self.catalog.health(name, tags, passing)

    def catalog_services(self) -> tuple[int, dict[str, list[str]]]:
        return self.catalog.catalog_services()

    def catalog_service(self, name: str, tags: list[str]) -> tuple[int, list[Any]]:
        return self.catalog.catalog_service(name, tags)

    # --- time --------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Act on every deadline that has passed: session TTLs (2 x TTL without a renew),
        check TTLs, DeregisterCriticalServiceAfter, tombstone and lock-delay expiry. Each
        expiry is its own write, as each is its own Raft entry in Consul."""
        for session in sorted(self.sessions.values(), key=lambda s: s.id):
            if session.expires_at is not None and session.expires_at <= now:
                idx = self._next()
                self._invalidate(
                    session,
                    f"TTL expired (no renew within 2 x TTL {session.ttl})",
                    idx,
                    now,
                )
                self._commit(idx)
        for check in self.catalog.due_ttl_checks(now):
            idx = self._next()
            if self.catalog.expire_ttl(check, idx, now).went_critical:
                self._went_critical(check, idx, now)
            self._commit(idx)
        for check in self.catalog.due_reaps(now):
            if self.catalog.checks.get(check.check_id) is not check:
                continue  # its service went with an earlier check of this loop
            idx = self._next()
            after = check.deregister_after_ns / NS
            self._effects.notices.append(ServiceReaped(check.service_id, check.check_id, after))
            for check_id in self.catalog.deregister(check.service_id, idx):
                self._invalidate_for_check(check_id, f"check {check_id} was deregistered", idx, now)
            self._commit(idx)
        self.kv.reap(now)

    def next_deadline(self) -> float | None:
        times = [s.expires_at for s in self.sessions.values() if s.expires_at is not None]
        times += [t for t in (self.catalog.next_deadline(), self.kv.next_reap()) if t is not None]
        return min(times, default=None)

    # --- snapshot ----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Everything durable, as JSON-able data. Timers are not: a restored state starts
        every session and check timer afresh, as Consul does on a leader change."""
        runtime = {"expires_at", "ttl_deadline", "critical_since"}

        def plain(record: Session | Check | Service) -> dict[str, Any]:
            return {k: v for k, v in asdict(record).items() if k not in runtime}

        return {
            "format": SNAPSHOT_FORMAT,
            "node_name": self.node_name,
            "node_id": self.catalog.node_id,
            "address": self.catalog.address,
            "last_index": self.last_index,
            "kv": {
                "table_index": self.kv.table_index,
                "entries": [_entry_doc(self.kv.entries[k]) for k in sorted(self.kv.entries)],
                "tombstones": {k: t.index for k, t in sorted(self.kv.tombstones.items())},
            },
            "sessions_index": self.sessions_index,
            "sessions": [plain(self.sessions[k]) for k in sorted(self.sessions)],
            "catalog": {
                "node_create_index": self.catalog.node_create_index,
                "nodes_index": self.catalog.nodes_index,
                "services_index": self.catalog.services_index,
                "checks_index": self.catalog.checks_index,
                "service_indexes": dict(sorted(self.catalog.service_indexes.items())),
                "extinction_index": self.catalog.extinction_index,
                "services": [plain(s) for _, s in sorted(self.catalog.services.items())],
                "checks": [plain(c) for _, c in sorted(self.catalog.checks.items())],
            },
        }

    @classmethod
    def restore(
        cls,
        doc: dict[str, Any],
        now: float,
        *,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> ConsulState:
        """A state from snapshot(); a ValueError names what is wrong with a bad document."""
        if not isinstance(doc, dict) or doc.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"not a {SNAPSHOT_FORMAT} snapshot")
        try:
            state = cls(doc["node_name"], node_id=doc["node_id"], address=doc["address"])
            state._new_id = new_id
            state.last_index = int(doc["last_index"])
            kv = doc["kv"]
            state.kv.table_index = int(kv["table_index"])
            for e in kv["entries"]:
                value = None if e["value"] is None else base64.b64decode(e["value"])
                state.kv.entries[e["key"]] = KVEntry(**{**e, "value": value})
            for key, index in kv["tombstones"].items():
                state.kv.tombstones[key] = Tombstone(int(index), now + TOMBSTONE_TTL_S)
            state.sessions_index = int(doc["sessions_index"])
            for s in doc["sessions"]:
                session = Session(**s)
                state._renew(session, now)
                state.sessions[session.id] = session
            cat = doc["catalog"]
            catalog = state.catalog
            catalog.node_create_index = int(cat["node_create_index"])
            catalog.nodes_index = int(cat["nodes_index"])
            catalog.services_index = int(cat["services_index"])
            catalog.checks_index = int(cat["checks_index"])
            catalog.service_indexes = {k: int(v) for k, v in cat["service_indexes"].items()}
            catalog.extinction_index = int(cat["extinction_index"])
            catalog.services = {s["id"]: Service(**s) for s in cat["services"]}
            catalog.checks = {}
            for c in cat["checks"]:
                check = Check(**c)
                if check.ttl_ns:
                    check.ttl_deadline = now + check.ttl_ns / NS
                if check.status == CRITICAL:
                    check.critical_since = now
                catalog.checks[check.check_id] = check
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed snapshot: {type(exc).__name__}: {exc}") from None
        state.catalog.drain_changed()
        state.kv.drain_written()
        return state


def _entry_doc(entry: KVEntry) -> dict[str, Any]:
    doc = asdict(entry)
    doc["value"] = None if entry.value is None else base64.b64encode(entry.value).decode()
    return doc
