"""Requests as Consul reads them: KV keys, query parameters, and JSON bodies (keys matched
without regard to case, as Go's encoding/json does), with Consul's defaults and fix-ups and a
400 naming what is malformed.

Consul ignores JSON fields it does not know; this server refuses them (400), so that a typo or
a feature it lacks shows at once instead of being silently dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from services.membership.consul_dev.model import (
    BEHAVIOR_RELEASE,
    HEALTH_STATUSES,
    LOCK_DELAY_DEFAULT_NS,
    LOCK_DELAY_SECONDS_BELOW_NS,
    NS,
    SERF_CHECK_ID,
    DurationError,
    bad_request,
    parse_go_duration,
)


@dataclass(slots=True)
class SessionSpec:
    """PUT /v1/session/create after Consul's defaults and fixupEmptySessionChecks."""

    name: str = ""
    node: str | None = None  # None: the agent's node
    lock_delay_ns: int = LOCK_DELAY_DEFAULT_NS
    behavior: str = BEHAVIOR_RELEASE
    ttl: str = ""
    node_checks: list[str] | None = field(default_factory=lambda: [SERF_CHECK_ID])
    service_checks: list[str] | None = None
    checks: list[str] | None = field(default_factory=lambda: [SERF_CHECK_ID])


@dataclass(slots=True)
class CheckDefinition:
    """One TTL check of a service registration (structs.CheckType)."""

    check_id: str = ""  # "": service:<service id>[:<n>]
    name: str = ""
    notes: str = ""
    ttl_ns: int = 0
    status: str = ""  # "": critical until the first update
    deregister_after_ns: int = 0


@dataclass(slots=True)
class ServiceDefinition:
    """PUT /v1/agent/service/register (structs.ServiceDefinition, the subset served here)."""

    name: str
    id: str = ""
    tags: list[str] = field(default_factory=list)
    address: str = ""
    port: int = 0
    meta: dict[str, str] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=lambda: {"Passing": 1, "Warning": 1})
    enable_tag_override: bool = False
    checks: list[CheckDefinition] = field(default_factory=list)


def json_object(body: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise bad_request(f"Request decode failed: {what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise bad_request(
            f"Request decode failed: {what} must be a JSON object, got {type(doc).__name__}"
        )
    return doc


def _fold(key: str) -> str:
    """Consul matches JSON keys without regard to case, and its translation of snake_case
    keys (DeregisterCriticalServiceAfter or deregister_critical_service_after) is folded in."""
    return key.replace("_", "").lower()


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"Request decode failed: {where} must be a string, got {value!r}")
    return value


def _strings(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(
            f"Request decode failed: {where} must be a list of strings, got {value!r}"
        )
    return list(value)


def _duration_ns(value: Any, where: str) -> int:
    """A Go duration: a string ("10s") or a number of nanoseconds."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise bad_request(f'Request decode failed: {where} must be a duration such as "10s"')
    if isinstance(value, str):
        try:
            return parse_go_duration(value)
        except DurationError as exc:
            raise bad_request(f"Request decode failed: {where}: {exc}") from None
    return int(value)


_SESSION_FIELDS = "Name, Node, LockDelay, Behavior, TTL, Checks, NodeChecks, ServiceChecks"
_SESSION_IGNORED = {"id", "createindex", "modifyindex", "namespace", "partition"}


def session_spec(body: bytes) -> SessionSpec:
    """The body of PUT /v1/session/create (empty: every default)."""
    spec = SessionSpec()
    doc = json_object(body, "the session") if body.strip() else {}
    for key, value in doc.items():
        match key.lower():
            case "name":
                spec.name = _string(value, "Name")
            case "node":
                spec.node = _string(value, "Node")
            case "behavior":
                spec.behavior = _string(value, "Behavior")
            case "ttl":
                spec.ttl = "" if value is None else _string(value, "TTL")
            case "lockdelay":
                # Consul's lockDelayMinThreshold: 15 or "15ns" mean 15 s, as users mean them.
                delay = _duration_ns(value, "LockDelay")
                spec.lock_delay_ns = delay * NS if delay < LOCK_DELAY_SECONDS_BELOW_NS else delay
            case "checks":
                spec.checks = _strings(value, "Checks")
            case "nodechecks":
                spec.node_checks = _strings(value, "NodeChecks")
            case "servicechecks":
                spec.service_checks = _service_checks(value)
            case other if other in _SESSION_IGNORED:
                pass
            case _:
                raise bad_request(
                    f'Request decode failed: unknown field "{key}" (a session takes '
                    f"{_SESSION_FIELDS})"
                )
    _fixup_empty_session_checks(spec)
    return spec


def _service_checks(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(
            f"Request decode failed: ServiceChecks must be a list of {{ID}}, got {value!r}"
        )
    ids = []
    for item in value:
        folded = {k.lower(): v for k, v in item.items()} if isinstance(item, dict) else {}
        if "id" not in folded:
            raise bad_request(
                f"Request decode failed: each ServiceChecks entry needs an ID, got {item!r}"
            )
        ids.append(_string(folded["id"], "ServiceChecks ID"))
    return ids


def _fixup_empty_session_checks(spec: SessionSpec) -> None:
    """Consul's fixupEmptySessionChecks (agent/session_endpoint.go). Since Consul 1.7 a Checks
    list does not replace the default NodeChecks ["serfHealth"]; both apply. An empty Checks
    list (or null) takes every default check out."""
    if not spec.checks:
        spec.node_checks = []
    elif spec.checks == [SERF_CHECK_ID] or not spec.node_checks:
        spec.checks = None


_SERVICE_FIELDS = "ID, Name, Tags, Address, Port, Meta, Weights, EnableTagOverride, Check, Checks"


def service_definition(body: bytes) -> ServiceDefinition:
    doc = json_object(body, "the service registration")
    fields = {_fold(k): (k, v) for k, v in doc.items()}
    unknown = [k for folded, (k, _) in fields.items() if folded not in _SERVICE_KEYS]
    if unknown:
        raise bad_request(
            f"Request decode failed: hexmq consul-dev does not take {', '.join(unknown)} in a "
            f"service registration (it takes {_SERVICE_FIELDS})"
        )
    name = fields.get("name", ("", ""))[1]
    if not isinstance(name, str) or not name:
        raise bad_request("Missing service name")
    svc = ServiceDefinition(name=name)
    for folded, (key, value) in fields.items():
        match folded:
            case "id":
                svc.id = _string(value, key)
            case "tags":
                svc.tags = _strings(value, key) or []
            case "address":
                svc.address = _string(value, key)
            case "port":
                if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 65536:
                    raise bad_request(
                        f"Request decode failed: {key} must be 0-65535, got {value!r}"
                    )
                svc.port = value
            case "meta":
                svc.meta = _meta(value, key)
            case "weights":
                svc.weights = _weights(value, key)
            case "enabletagoverride":
                if not isinstance(value, bool):
                    raise bad_request(f"Request decode failed: {key} must be true or false")
                svc.enable_tag_override = value
            case "check":
                if value is not None:
                    svc.checks.insert(0, check_definition(value, key))
            case "checks":
                if value is not None:
                    if not isinstance(value, list):
                        raise bad_request(f"Request decode failed: {key} must be a list")
                    svc.checks.extend(
                        check_definition(c, f"{key}[{i}]") for i, c in enumerate(value)
                    )
    return svc


_SERVICE_KEYS = {
    "id",
    "name",
    "tags",
    "address",
    "port",
    "meta",
    "weights",
    "enabletagoverride",
    "check",
    "checks",
}


def _meta(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise bad_request(f"Request decode failed: {where} must map strings to strings")
    for key in value:
        if key.startswith("consul-"):
            raise bad_request(f"Invalid Service Meta: reserved prefix 'consul-' in key {key!r}")
    return dict(value)


def _weights(value: Any, where: str) -> dict[str, int]:
    weights = {"Passing": 1, "Warning": 1}
    if value is None:
        return weights
    if not isinstance(value, dict):
        raise bad_request(f"Request decode failed: {where} must be {{Passing, Warning}}")
    for key, weight in value.items():
        canonical = {"passing": "Passing", "warning": "Warning"}.get(key.lower())
        if canonical is None or isinstance(weight, bool) or not isinstance(weight, int):
            raise bad_request(f"Request decode failed: {where} takes Passing and Warning numbers")
        weights[canonical] = weight
    return weights


_CHECK_KEYS = {"checkid", "id", "name", "notes", "ttl", "status", "deregistercriticalserviceafter"}


def check_definition(value: Any, where: str) -> CheckDefinition:
    if not isinstance(value, dict):
        raise bad_request(f"Request decode failed: {where} must be a JSON object")
    fields = {_fold(k): (k, v) for k, v in value.items()}
    others = [k for folded, (k, _) in fields.items() if folded not in _CHECK_KEYS]
    if others:
        raise bad_request(
            f"Invalid check: hexmq consul-dev runs TTL checks only; {where} has "
            f"{', '.join(others)} (a check takes CheckID, Name, Notes, TTL, Status, "
            "DeregisterCriticalServiceAfter)"
        )
    check = CheckDefinition()
    for folded, (key, item) in fields.items():
        match folded:
            case "checkid" | "id":
                check.check_id = _string(item, key)
            case "name":
                check.name = _string(item, key)
            case "notes":
                check.notes = _string(item, key)
            case "ttl":
                check.ttl_ns = _duration_ns(item, key)
            case "status":
                check.status = _string(item, key)
            case "deregistercriticalserviceafter":
                check.deregister_after_ns = _duration_ns(item, key)
    if check.ttl_ns <= 0:
        raise bad_request("Invalid check: TTL must be > 0 for TTL checks")
    if check.status and check.status not in HEALTH_STATUSES:
        raise bad_request("Status for checks must 'passing', 'warning', 'critical'")
    return check


# Extensions Consul refuses at the end of a key (proxies might cache such URLs).
_SUSPICIOUS_EXTENSIONS = (
    *("js", "css", "html", "htm", "xml", "json", "txt", "log", "php", "asp", "jsp", "cgi"),
    *("pl", "py", "rb", "sh", "exe", "dll", "bat", "cmd", "com", "scr", "vbs", "pdf", "doc"),
    *("docx", "xls", "xlsx", "ppt", "pptx", "zip", "rar", "tar", "gz", "7z", "bz2", "jpg"),
    *("jpeg", "png", "gif", "svg", "ico", "bmp", "mp3", "mp4", "avi", "mov", "wmv", "flv"),
    *("swf", "woff", "woff2", "ttf", "eot", "otf"),
)
_KEY_CHAR = re.compile(r"[A-Za-z0-9,\-_./]")


def validate_kv_key(key: str) -> None:
    """Consul's validateKVKey (agent/kvs_endpoint.go): the keys current Consul accepts."""
    if key.startswith("/"):
        raise bad_request("key must not begin with a '/'")
    for i, ch in enumerate(key):
        if not _KEY_CHAR.fullmatch(ch):
            raise bad_request(
                f"key contains invalid character '{ch}' at position {len(key[:i].encode())}. "
                "Only alphanumeric characters and ,-_./ are allowed"
            )
    if "../" in key:
        raise bad_request("key contains path traversal sequence")
    for ext in (f".{e}" for e in _SUSPICIOUS_EXTENSIONS):
        if key.lower().endswith(ext):
            raise bad_request(
                f"key contains suspicious file extension '{ext}' that may be cached by proxies"
            )


def query_uint(query: Mapping[str, str], name: str) -> int:
    """?cas=, ?flags=: unsigned 64-bit numbers (Consul answers 500 with Go's parse error)."""
    text = query[name]
    if not text.isdigit() or int(text) >= 2**64:
        raise bad_request(f"Invalid {name}: expected a whole number 0-18446744073709551615")
    return int(text)


def query_bool(query: Mapping[str, str], name: str) -> bool:
    """getBoolQueryParam: present and empty means true."""
    if name not in query:
        return False
    text = query[name]
    if text == "":
        return True
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise bad_request(f"Invalid value for ?{name}")


def refuse_conflicting(query: Mapping[str, str], *flags: str) -> None:
    """conflictingFlags: at most one of `flags`, else Consul's 400 listing the parameters."""
    if sum(f in query for f in flags) > 1:
        encoded = urlencode(sorted(query.items(), key=lambda item: item[0]))
        raise bad_request(f"Conflicting flags: {encoded}\n")
