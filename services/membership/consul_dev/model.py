"""Records, errors, changes and watches of the Consul-API core (no I/O, no clock).

Field names and JSON shapes are Consul's (agent/structs), so that `api()` of a record is what
Consul answers and py-consul reads.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

PASSING, WARNING, CRITICAL = "passing", "warning", "critical"
HEALTH_STATUSES = (PASSING, WARNING, CRITICAL)
SERF_CHECK_ID = "serfHealth"
DATACENTER = "dc1"
BEHAVIOR_RELEASE, BEHAVIOR_DELETE = "release", "delete"

NS = 1_000_000_000  # nanoseconds in a second: Go's time.Duration unit
SESSION_TTL_MIN_NS = 10 * NS  # Consul's session_ttl_min default
SESSION_TTL_MAX_NS = 86400 * NS  # structs.SessionTTLMax
SESSION_TTL_MULTIPLIER = 2  # structs.SessionTTLMultiplier: the server's timer is 2 x TTL
LOCK_DELAY_DEFAULT_NS = 15 * NS
LOCK_DELAY_MAX_NS = 60 * NS  # structs.MaxLockDelay: longer delays are cut to this
LOCK_DELAY_SECONDS_BELOW_NS = 1000  # lockDelayMinThreshold: smaller numbers mean seconds
CHECK_DEREGISTER_MIN_NS = 60 * NS  # check_deregister_interval_min
CHECK_OUTPUT_MAX = 4096  # bytes of check output kept (checks.DefaultBufSize)
TOMBSTONE_TTL_S = 900.0  # tombstone_ttl: how long KV tombstones keep prefix indexes up
KV_MAX_VALUE_SIZE = 512 * 1024  # kv_max_value_size


class ConsulError(Exception):
    """A request Consul refuses: `status` is the HTTP status Consul answers, `text` its body."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def bad_request(text: str) -> ConsulError:
    return ConsulError(400, text)


def not_found(text: str) -> ConsulError:
    return ConsulError(404, text)


def server_error(text: str) -> ConsulError:
    """Consul answers 500 for errors its RPC layer returns (unknown session, missing check...)."""
    return ConsulError(500, text)


# --- Go durations --------------------------------------------------------------------------

_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": NS}
_UNIT_NS |= {"m": 60 * NS, "h": 3600 * NS}
_NUMBER = re.compile(r"(\d*)(\.\d*)?")
_UNIT = re.compile(r"[^\d.]*")


class DurationError(ValueError):
    """A string Go's time.ParseDuration refuses; the message is Go's."""


def parse_go_duration(text: str) -> int:
    """Go's time.ParseDuration ("10s", "1m30s", "1.5h", "300ms", "0") in nanoseconds."""
    rest = text
    negative = rest[:1] == "-"
    if rest[:1] in ("-", "+"):
        rest = rest[1:]
    if rest == "0":
        return 0
    if not rest:
        raise DurationError(f'time: invalid duration "{text}"')
    total = 0
    while rest:
        number = _NUMBER.match(rest)
        assert number is not None  # the pattern matches the empty string
        whole, frac = number.group(1), number.group(2) or ""
        if not whole and len(frac) <= 1:
            raise DurationError(f'time: invalid duration "{text}"')
        rest = rest[number.end() :]
        unit_match = _UNIT.match(rest)
        unit = unit_match.group(0) if unit_match else ""
        if not unit:
            raise DurationError(f'time: missing unit in duration "{text}"')
        if unit not in _UNIT_NS:
            raise DurationError(f'time: unknown unit "{unit}" in duration "{text}"')
        rest = rest[len(unit) :]
        total += round(float((whole or "0") + frac) * _UNIT_NS[unit])
    return -total if negative else total


def _decimal(value: int, unit: int) -> str:
    whole, part = divmod(value, unit)
    if not part:
        return str(whole)
    digits = str(part).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}"


def format_go_duration(ns: int) -> str:
    """Go's Duration.String(): 10s, 1m30s, 24h0m0s, 1.5s, 300ms."""
    if ns == 0:
        return "0s"
    sign, u = ("-", -ns) if ns < 0 else ("", ns)
    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{_decimal(u, 1_000)}µs"
    if u < NS:
        return f"{sign}{_decimal(u, 1_000_000)}ms"
    hours, rem = divmod(u, 3600 * NS)
    minutes, rem = divmod(rem, 60 * NS)
    text = f"{hours}h{minutes}m" if hours else (f"{minutes}m" if minutes else "")
    return f"{sign}{text}{_decimal(rem, NS)}s"


# --- records ---------------------------------------------------------------------------------


@dataclass(slots=True)
class KVEntry:
    """structs.DirEntry."""

    key: str
    value: bytes | None  # None: stored from an empty body (Consul answers "Value": null)
    flags: int = 0
    session: str = ""
    lock_index: int = 0
    create_index: int = 0
    modify_index: int = 0

    def same_content(self, other: KVEntry) -> bool:
        """DirEntry.Equal: an unchanged write does not bump ModifyIndex."""
        return (
            self.lock_index == other.lock_index
            and self.key == other.key
            and self.flags == other.flags
            and (self.value or b"") == (other.value or b"")
            and self.session == other.session
        )

    def api(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "LockIndex": self.lock_index,
            "Key": self.key,
            "Flags": self.flags,
            "Value": None if self.value is None else base64.b64encode(self.value).decode(),
        }
        if self.session:
            doc["Session"] = self.session
        doc["CreateIndex"] = self.create_index
        doc["ModifyIndex"] = self.modify_index
        return doc


@dataclass(slots=True)
class Session:
    """structs.Session. `expires_at` (server clock, seconds) is runtime only: None without TTL."""

    id: str
    name: str
    node: str
    lock_delay_ns: int
    behavior: str
    ttl: str
    ttl_ns: int
    node_checks: list[str] | None
    service_checks: list[str] | None
    checks: list[str] | None  # the deprecated field, kept as Consul keeps it
    create_index: int
    modify_index: int
    expires_at: float | None = None

    def check_ids(self) -> list[str]:
        """Session.CheckIDs: every check the session depends on, whatever field named it."""
        return [*(self.checks or ()), *(self.node_checks or ()), *(self.service_checks or ())]

    def api(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ID": self.id,
            "Name": self.name,
            "Node": self.node,
            "LockDelay": self.lock_delay_ns,
            "Behavior": self.behavior,
            "TTL": self.ttl,
            "NodeChecks": self.node_checks,
            "ServiceChecks": None
            if self.service_checks is None
            else [{"ID": c, "Namespace": ""} for c in self.service_checks],
        }
        if self.checks:
            doc["Checks"] = self.checks
        doc["CreateIndex"] = self.create_index
        doc["ModifyIndex"] = self.modify_index
        return doc


@dataclass(slots=True)
class Check:
    """A health check of this server's node: serfHealth, or an agent TTL check of a service.

    `ttl_deadline` and `critical_since` are runtime only (server clock, seconds)."""

    check_id: str
    name: str
    service_id: str = ""
    service_name: str = ""
    service_tags: list[str] = field(default_factory=list)
    notes: str = ""
    ttl_ns: int = 0
    status: str = CRITICAL
    output: str = ""
    deregister_after_ns: int = 0  # 0: never
    create_index: int = 0
    modify_index: int = 0
    ttl_deadline: float | None = None
    critical_since: float | None = None

    def api(self, node: str, *, indexes: bool = True) -> dict[str, Any]:
        return {
            "Node": node,
            "CheckID": self.check_id,
            "Name": self.name,
            "Status": self.status,
            "Notes": self.notes,
            "Output": self.output,
            "ServiceID": self.service_id,
            "ServiceName": self.service_name,
            "ServiceTags": list(self.service_tags),
            "Type": "ttl" if self.ttl_ns else "",
            "Definition": {},
            "CreateIndex": self.create_index if indexes else 0,
            "ModifyIndex": self.modify_index if indexes else 0,
        }


@dataclass(slots=True)
class Service:
    """A service instance on this server's node (structs.NodeService)."""

    id: str
    name: str
    tags: list[str] = field(default_factory=list)
    address: str = ""
    port: int = 0
    meta: dict[str, str] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=lambda: {"Passing": 1, "Warning": 1})
    enable_tag_override: bool = False
    check_ids: list[str] = field(default_factory=list)
    create_index: int = 0
    modify_index: int = 0
    registered_by_agent: bool = True  # False for the "consul" service a server carries

    def has_tags(self, tags: list[str]) -> bool:
        """Consul's tag filter: every asked tag, compared without case."""
        own = {t.lower() for t in self.tags}
        return all(t.lower() in own for t in tags)

    def api(self) -> dict[str, Any]:
        """The agent's view (GET /v1/agent/services)."""
        return {
            "ID": self.id,
            "Service": self.name,
            "Tags": list(self.tags),
            "Meta": dict(self.meta),
            "Port": self.port,
            "Address": self.address,
            "Weights": dict(self.weights),
            "EnableTagOverride": self.enable_tag_override,
            "Datacenter": DATACENTER,
        }

    def catalog_api(self) -> dict[str, Any]:
        """The catalog's view inside health entries (structs.NodeService)."""
        return {
            "ID": self.id,
            "Service": self.name,
            "Tags": list(self.tags),
            "Address": self.address,
            "Meta": dict(self.meta),
            "Port": self.port,
            "Weights": dict(self.weights),
            "EnableTagOverride": self.enable_tag_override,
            "CreateIndex": self.create_index,
            "ModifyIndex": self.modify_index,
        }


# --- what changed, what a watcher waits for, what to log ---------------------------------------


@dataclass(frozen=True, slots=True)
class KVChanged:
    key: str


@dataclass(frozen=True, slots=True)
class SessionChanged:
    session_id: str
    node: str


@dataclass(frozen=True, slots=True)
class ServiceChanged:
    """A service's instances or their health changed (what health/service answers)."""

    name: str


Change = KVChanged | SessionChanged | ServiceChanged


@dataclass(frozen=True, slots=True)
class Watch:
    """What a blocking query waits for. A change it matches wakes it; the query then runs again
    and answers if its index passed the one asked for (Consul's watch sets do the same)."""

    kind: str  # one of WATCH_KINDS
    subject: str = ""

    def matches(self, change: Change) -> bool:
        match change:
            case KVChanged(key=key):
                return (self.kind == "kv-key" and key == self.subject) or (
                    self.kind == "kv-prefix" and key.startswith(self.subject)
                )
            case SessionChanged(session_id=sid, node=node):
                return (
                    (self.kind == "session" and sid == self.subject)
                    or self.kind == "sessions"
                    or (self.kind == "node-sessions" and node == self.subject)
                )
            case ServiceChanged(name=name):
                return (self.kind == "service" and name == self.subject) or self.kind == "services"
        return False


WATCH_KINDS = ("kv-key", "kv-prefix", "session", "sessions", "node-sessions", "service", "services")


@dataclass(frozen=True, slots=True)
class SessionInvalidated:
    session_id: str
    name: str
    reason: str
    released: tuple[str, ...]
    deleted: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CheckCritical:
    check_id: str
    service_id: str
    output: str


@dataclass(frozen=True, slots=True)
class ServiceReaped:
    service_id: str
    check_id: str
    after_s: float


Notice = SessionInvalidated | CheckCritical | ServiceReaped
