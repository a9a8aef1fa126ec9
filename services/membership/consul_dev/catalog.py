"""The catalog of a one-node Consul: this server's node, its agent's services and TTL checks,
and the indexes health and catalog queries answer (agent/consul/state/catalog.go).

The agent and the catalog are one here: a check's status reaches the catalog at once, as the
agent's anti-entropy sync does for status changes. An update that changes only a check's
output is kept without a new index, as Consul's agent defers output-only syncs
(check_update_interval): watchers are not woken by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.membership.consul_dev.decode import CheckDefinition, ServiceDefinition
from services.membership.consul_dev.model import (
    CHECK_DEREGISTER_MIN_NS,
    CHECK_OUTPUT_MAX,
    CRITICAL,
    DATACENTER,
    NS,
    PASSING,
    SERF_CHECK_ID,
    Check,
    Service,
    bad_request,
    not_found,
    server_error,
)


def truncate_output(output: str) -> str:
    """Consul keeps at most 4 KiB of a check's output, saying how much it cut."""
    raw = output.encode()
    if len(raw) <= CHECK_OUTPUT_MAX:
        return output
    kept = raw[:CHECK_OUTPUT_MAX].decode(errors="ignore")
    return f"{kept} ... (captured {CHECK_OUTPUT_MAX} of {len(raw)} bytes)"


@dataclass(slots=True)
class CheckOutcome:
    """What a check update did: catalog `changed` (a new index), `went_critical`."""

    changed: bool = False
    went_critical: bool = False


@dataclass(slots=True)
class RegisterOutcome:
    changed: bool = False
    removed_checks: list[str] = field(default_factory=list)


class Catalog:
    def __init__(self, node_name: str, node_id: str, address: str) -> None:
        self.node_name = node_name
        self.node_id = node_id
        self.address = address
        self.node_create_index = 0
        self.services: dict[str, Service] = {}
        self.checks: dict[str, Check] = {}
        self.nodes_index = 0
        self.services_index = 0
        self.checks_index = 0
        self.service_indexes: dict[str, int] = {}  # per service name ("service.<name>")
        self.extinction_index = 0  # when the last instance of any service went away
        self.changed_services: set[str] = set()  # names changed since the caller last drained

    def bootstrap(self, idx: int) -> None:
        """What a fresh Consul server has: its node, serfHealth, the "consul" service."""
        self.node_create_index = self.nodes_index = idx
        self.checks[SERF_CHECK_ID] = Check(
            SERF_CHECK_ID,
            "Serf Health Status",
            status=PASSING,
            output="Agent alive and reachable",
            create_index=idx,
            modify_index=idx,
        )
        self.services["consul"] = Service(
            "consul", "consul", port=8300, create_index=idx, modify_index=idx
        )
        self.services["consul"].registered_by_agent = False
        self.services_index = self.checks_index = self.service_indexes["consul"] = idx

    def drain_changed(self) -> set[str]:
        changed, self.changed_services = self.changed_services, set()
        return changed

    # --- reads -------------------------------------------------------------------------------

    def max_index(self) -> int:
        return max(self.nodes_index, self.services_index, self.checks_index)

    def service_index(self, name: str) -> int:
        """maxIndexAndWatchChForService: the service's own index; for a service with no
        instances the index of the last service extinction, else the catalog's."""
        if not any(s.name == name for s in self.services.values()) and self.extinction_index:
            return self.extinction_index
        return self.service_indexes.get(name) or self.max_index()

    def instances(self, name: str, tags: list[str]) -> list[Service]:
        return sorted(
            (s for s in self.services.values() if s.name == name and s.has_tags(tags)),
            key=lambda s: s.id,
        )

    def node_api(self) -> dict[str, Any]:
        return {
            "ID": self.node_id,
            "Node": self.node_name,
            "Address": self.address,
            "Datacenter": DATACENTER,
            "TaggedAddresses": {"lan": self.address, "wan": self.address},
            "Meta": {"consul-network-segment": ""},
            "CreateIndex": self.node_create_index,
            "ModifyIndex": self.node_create_index,
        }

    def health(self, name: str, tags: list[str], passing: bool) -> tuple[int, list[Any]]:
        """GET /v1/health/service/<name>: node and service checks per instance; ?passing keeps
        the instances whose every check passes."""
        entries = []
        for svc in self.instances(name, tags):
            checks = [self.checks[SERF_CHECK_ID], *(self.checks[c] for c in svc.check_ids)]
            if passing and any(c.status != PASSING for c in checks):
                continue
            entries.append(
                {
                    "Node": self.node_api(),
                    "Service": svc.catalog_api(),
                    "Checks": [c.api(self.node_name) for c in checks],
                }
            )
        return self.service_index(name), entries

    def catalog_services(self) -> tuple[int, dict[str, list[str]]]:
        names: dict[str, set[str]] = {}
        for svc in self.services.values():
            names.setdefault(svc.name, set()).update(svc.tags)
        index = max(self.nodes_index, self.services_index)
        return index, {name: sorted(tags) for name, tags in sorted(names.items())}

    def catalog_service(self, name: str, tags: list[str]) -> tuple[int, list[Any]]:
        nodes = [
            {
                "ID": self.node_id,
                "Node": self.node_name,
                "Address": self.address,
                "Datacenter": DATACENTER,
                "TaggedAddresses": {"lan": self.address, "wan": self.address},
                "NodeMeta": {"consul-network-segment": ""},
                "ServiceID": svc.id,
                "ServiceName": svc.name,
                "ServiceTags": list(svc.tags),
                "ServiceAddress": svc.address,
                "ServicePort": svc.port,
                "ServiceMeta": dict(svc.meta),
                "ServiceWeights": dict(svc.weights),
                "ServiceEnableTagOverride": svc.enable_tag_override,
                "CreateIndex": svc.create_index,
                "ModifyIndex": svc.modify_index,
            }
            for svc in self.instances(name, tags)
        ]
        return self.service_index(name), nodes

    def agent_services(self) -> dict[str, Any]:
        return {
            s.id: s.api()
            for s in sorted(self.services.values(), key=lambda s: s.id)
            if s.registered_by_agent
        }

    def agent_checks(self) -> dict[str, Any]:
        return {
            c.check_id: c.api(self.node_name, indexes=False)
            for c in sorted(self.checks.values(), key=lambda c: c.check_id)
            if c.check_id != SERF_CHECK_ID
        }

    # --- writes ------------------------------------------------------------------------------

    def _touch(self, idx: int, name: str) -> None:
        self.service_indexes[name] = idx
        self.changed_services.add(name)

    def register(self, defn: ServiceDefinition, idx: int, now: float) -> RegisterOutcome:
        """Register or replace a service and its TTL checks. A check that already exists keeps
        its status and output (Consul restores them from its snapshot of the checks); every
        TTL timer starts afresh."""
        sid = defn.id or defn.name
        old = self.services.get(sid)
        if old is not None and not old.registered_by_agent:
            raise bad_request(f"service ID {sid!r} is this server's own; choose another ID")
        checks: list[Check] = []
        for i, cdef in enumerate(defn.checks):
            cid = cdef.check_id or f"service:{sid}" + (f":{i + 1}" if len(defn.checks) > 1 else "")
            if any(c.check_id == cid for c in checks):
                raise bad_request(f"Invalid check: check ID {cid!r} is given twice")
            owner = self.checks.get(cid)
            if owner is not None and owner.service_id != sid:
                raise bad_request(
                    f"Invalid check: check ID {cid!r} belongs to "
                    f"{'the node' if not owner.service_id else repr(owner.service_id)}"
                )
            checks.append(self._check_from(cdef, cid, defn, sid, owner))
        svc = Service(
            sid,
            defn.name,
            list(defn.tags),
            defn.address,
            defn.port,
            dict(defn.meta),
            dict(defn.weights),
            defn.enable_tag_override,
            [c.check_id for c in checks],
        )
        outcome = RegisterOutcome()
        old_checks = [self.checks[c] for c in old.check_ids] if old else []
        for check in checks:
            check.ttl_deadline = now + check.ttl_ns / NS
            if check.status == CRITICAL and check.critical_since is None:
                check.critical_since = now
        same_service = old is not None and _same_service(old, svc)
        same_checks = [_definition(c) for c in old_checks] == [_definition(c) for c in checks]
        if same_service and same_checks:
            for check in checks:  # nothing for the catalog; the timers restart all the same
                self.checks[check.check_id].ttl_deadline = check.ttl_deadline
            return outcome
        outcome.changed = True
        svc.create_index = old.create_index if old else idx
        svc.modify_index = old.modify_index if old is not None and same_service else idx
        self.services[sid] = svc
        self.services_index = idx
        new_ids = {c.check_id for c in checks}
        for gone in old_checks:
            if gone.check_id not in new_ids:
                del self.checks[gone.check_id]
                outcome.removed_checks.append(gone.check_id)
        for check in checks:
            prev = self.checks.get(check.check_id)
            check.create_index = prev.create_index if prev else idx
            check.modify_index = idx
            self.checks[check.check_id] = check
        self.checks_index = idx
        if old is not None and old.name != svc.name:
            self._name_left(old.name, idx)
        self._touch(idx, svc.name)
        return outcome

    def _check_from(
        self, cdef: CheckDefinition, cid: str, defn: ServiceDefinition, sid: str, prev: Check | None
    ) -> Check:
        after = cdef.deregister_after_ns
        if 0 < after < CHECK_DEREGISTER_MIN_NS:
            after = CHECK_DEREGISTER_MIN_NS  # Consul raises it to the minimum, with a warning
        check = Check(
            cid,
            cdef.name or f"Service '{defn.name}' check",
            sid,
            defn.name,
            list(defn.tags),
            cdef.notes,
            cdef.ttl_ns,
            cdef.status or CRITICAL,
            "",
            after,
        )
        if prev is not None:
            check.status, check.output = prev.status, prev.output
            check.critical_since = prev.critical_since
        return check

    def _name_left(self, name: str, idx: int) -> None:
        if any(s.name == name for s in self.services.values()):
            self._touch(idx, name)
        else:
            self.service_indexes.pop(name, None)
            self.extinction_index = idx
            self.changed_services.add(name)

    def deregister(self, service_id: str, idx: int) -> list[str]:
        """Remove a service and its checks; the removed check IDs are returned (sessions that
        name them are invalidated by the caller)."""
        svc = self.services.get(service_id)
        if svc is None or not svc.registered_by_agent:
            raise not_found(
                f'Unknown service ID "{service_id}". Ensure that the service ID is passed, not '
                "the service name."
            )
        del self.services[service_id]
        for cid in svc.check_ids:
            del self.checks[cid]
        self.services_index = idx
        if svc.check_ids:
            self.checks_index = idx
        self._name_left(svc.name, idx)
        return list(svc.check_ids)

    def ttl_check(self, check_id: str) -> Check:
        check = self.checks.get(check_id)
        if check is None or not check.ttl_ns:
            raise server_error(f'CheckID "{check_id}" does not have associated TTL')
        return check

    def update_check(
        self, check_id: str, status: str, output: str, idx: int, now: float
    ) -> CheckOutcome:
        """A TTL check's pass/warn/fail: the TTL restarts; the catalog changes only if the
        status does."""
        check = self.ttl_check(check_id)
        check.ttl_deadline = now + check.ttl_ns / NS
        return self._set_status(check, status, truncate_output(output), idx, now)

    def _set_status(
        self, check: Check, status: str, output: str, idx: int, now: float
    ) -> CheckOutcome:
        if check.status == status:
            check.output = output  # an output-only change: no new index (see the module doc)
            return CheckOutcome()
        check.status, check.output, check.modify_index = status, output, idx
        check.critical_since = now if status == CRITICAL else None
        self.checks_index = idx
        self._touch(idx, check.service_name)
        return CheckOutcome(changed=True, went_critical=status == CRITICAL)

    def expire_ttl(self, check: Check, idx: int, now: float) -> CheckOutcome:
        """The TTL passed without an update: critical, "TTL expired" (CheckTTL.run)."""
        check.ttl_deadline = None
        output = "TTL expired"
        if check.output:
            output += f" (last output before timeout follows): {check.output}"
        return self._set_status(check, CRITICAL, output, idx, now)

    def due_ttl_checks(self, now: float) -> list[Check]:
        return sorted(
            (
                c
                for c in self.checks.values()
                if c.ttl_deadline is not None and c.ttl_deadline <= now
            ),
            key=lambda c: c.check_id,
        )

    def due_reaps(self, now: float) -> list[Check]:
        """Checks critical for longer than their DeregisterCriticalServiceAfter."""
        return sorted(
            (c for c in self.checks.values() if (d := _reap_at(c)) is not None and d <= now),
            key=lambda c: c.check_id,
        )

    def next_deadline(self) -> float | None:
        times = [c.ttl_deadline for c in self.checks.values() if c.ttl_deadline is not None]
        times += [d for c in self.checks.values() if (d := _reap_at(c)) is not None]
        return min(times, default=None)


def _reap_at(check: Check) -> float | None:
    if not check.deregister_after_ns or check.critical_since is None:
        return None
    return check.critical_since + check.deregister_after_ns / NS


def _same_service(a: Service, b: Service) -> bool:
    return (a.name, a.tags, a.address, a.port, a.meta, a.weights, a.enable_tag_override) == (
        b.name,
        b.tags,
        b.address,
        b.port,
        b.meta,
        b.weights,
        b.enable_tag_override,
    ) and a.check_ids == b.check_ids


def _definition(c: Check) -> tuple[object, ...]:
    return (c.check_id, c.name, c.notes, c.ttl_ns, c.deregister_after_ns, c.service_tags)
