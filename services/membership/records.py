"""What a membership agent keeps in Consul, as data: key names, the JSON of its records, and
the service registration (docs/failover.md, "Who changes the view").

Pure: no I/O. The agent (services/membership/agent.py) writes and reads these; a peer's
malformed record is reported by `RecordError` naming the key and what is wrong, and ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeGuard

from hexmq.netaddr import parse_hostport
from hexmq.node_protocol import THIS_RELEASE, ProtocolError, Support
from hexmq.trust.identity import NODE_ID
from services.membership.plan import Registration

SERVICE_NAME: Final = "hexmq"
SUSPICION_KINDS: Final = frozenset({"refused", "silent"})
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


class RecordError(ValueError):
    """A record in Consul that this agent cannot read; the message names the key."""


def check_cluster_name(name: str) -> str:
    if not _CLUSTER_NAME.fullmatch(name):
        raise ValueError(
            f"--cluster must be 1-63 letters, digits, '_', '.' or '-' (a Consul KV path "
            f"segment), got {name!r}"
        )
    return name


def check_node_id(node_id: str) -> str:
    if not NODE_ID.fullmatch(node_id):
        raise ValueError(
            f"--node-id must be 1-63 letters, digits, '_', '.' or '-', got {node_id!r}"
        )
    return node_id


@dataclass(frozen=True, slots=True)
class ClusterKeys:
    """The KV keys of one cluster, all under hexmq/<cluster>/."""

    cluster: str

    @property
    def prefix(self) -> str:
        return f"hexmq/{self.cluster}/"

    @property
    def view(self) -> str:
        return f"{self.prefix}view"

    @property
    def members(self) -> str:
        return f"{self.prefix}members/"

    @property
    def suspects(self) -> str:
        return f"{self.prefix}suspects/"

    def member(self, node_id: str) -> str:
        return f"{self.members}{node_id}"

    def suspicions_of(self, node_id: str) -> str:
        return f"{self.suspects}{node_id}"

    def node_of(self, key: str, prefix: str) -> str | None:
        """The node id a members/ or suspects/ key names, or None for any other key."""
        if not key.startswith(prefix):
            return None
        node = key[len(prefix) :]
        return node if NODE_ID.fullmatch(node) else None


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """The value of hexmq/<cluster>/members/<node>: the node's addresses, the incarnation of
    its partition service (0 while none is connected to the agent) and what the node speaks of
    the inter-node protocol (hexmq/node_protocol.py).

    The protocol goes in as "protocol" (the lowest version: the only field a v0.2.0 agent
    reads, and it must read 1 there to count the node as registered), "protocol_max" and
    "features"; a record without the last two (v0.2.0's) speaks version 1 only."""

    node_id: str
    partition_addr: str
    mqtt_addr: str
    membership_addr: str
    incarnation: int
    protocol: Support = THIS_RELEASE
    # Asked to leave the cluster (docs/failover.md, "Leave"); written only when true, so the
    # record of a node that is not leaving reads as before.
    leaving: bool = False
    # Its services serve mutual TLS (not --insecure-cluster); written only when true, so a
    # plain-text node's record reads as a previous release's (docs/security.md).
    tls: bool = False

    def to_json(self) -> bytes:
        doc = {
            "node_id": self.node_id,
            "partition_addr": self.partition_addr,
            "mqtt_addr": self.mqtt_addr,
            "membership_addr": self.membership_addr,
            "incarnation": self.incarnation,
            "protocol": self.protocol.min_version,
            "protocol_max": self.protocol.max_version,
            "features": sorted(self.protocol.features),
        }
        if self.leaving:
            doc["leaving"] = True
        if self.tls:
            doc["tls"] = True
        return json.dumps(doc, sort_keys=True).encode()

    def registration(self, since_ms: int) -> Registration:
        return Registration(
            node_id=self.node_id,
            partition_addr=self.partition_addr,
            mqtt_addr=self.mqtt_addr,
            membership_addr=self.membership_addr,
            incarnation=self.incarnation,
            since_ms=since_ms,
            protocol=self.protocol,
            leaving=self.leaving,
            tls=self.tls,
        )


def _json_object(key: str, value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise RecordError(f"{key}: empty value")
    try:
        doc = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"{key}: not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise RecordError(f"{key}: expected a JSON object, got {type(doc).__name__}")
    return doc


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _protocol_of(key: str, doc: Mapping[str, Any]) -> Support:
    """The record's protocol support. One this agent does not speak still parses: the planner
    refuses the node's admission and says why, rather than taking it for unregistered."""
    low = doc.get("protocol")
    high = doc.get("protocol_max", low)
    features = doc.get("features", [])
    if not _whole(low) or low < 1:
        raise RecordError(f"{key}: protocol must be a whole number >= 1, got {low!r}")
    if not _whole(high):
        raise RecordError(f"{key}: protocol_max must be a whole number, got {high!r}")
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise RecordError(f"{key}: features must be a list of names, got {features!r}")
    try:
        return Support(low, high, frozenset(features))
    except ProtocolError as exc:
        raise RecordError(f"{key}: {exc}") from exc


def parse_member_record(key: str, node_id: str, value: bytes | None) -> MemberRecord:
    doc = _json_object(key, value)
    protocol = _protocol_of(key, doc)
    if doc.get("node_id") != node_id:
        raise RecordError(f"{key}: node_id {doc.get('node_id')!r} does not match the key")
    addrs = {}
    for field in ("partition_addr", "mqtt_addr", "membership_addr"):
        addr = doc.get(field)
        if not isinstance(addr, str):
            raise RecordError(f"{key}: {field} must be a HOST:PORT string, got {addr!r}")
        try:
            parse_hostport(addr, what=field)
        except ValueError as exc:
            raise RecordError(f"{key}: {exc}") from exc
        addrs[field] = addr
    incarnation = doc.get("incarnation")
    if not _whole(incarnation) or incarnation < 0:
        raise RecordError(f"{key}: incarnation must be a whole number >= 0, got {incarnation!r}")
    leaving = doc.get("leaving", False)
    if not isinstance(leaving, bool):
        raise RecordError(f"{key}: leaving must be true or false, got {leaving!r}")
    tls = doc.get("tls", False)
    if not isinstance(tls, bool):
        raise RecordError(f"{key}: tls must be true or false, got {tls!r}")
    return MemberRecord(
        node_id=node_id,
        partition_addr=addrs["partition_addr"],
        mqtt_addr=addrs["mqtt_addr"],
        membership_addr=addrs["membership_addr"],
        incarnation=incarnation,
        protocol=protocol,
        leaving=leaving,
        tls=tls,
    )


def encode_suspicions(reports: Mapping[str, str]) -> bytes:
    """The value of hexmq/<cluster>/suspects/<node>: {suspected node: "refused" | "silent"}."""
    for node, kind in reports.items():
        if kind not in SUSPICION_KINDS:
            raise ValueError(f"suspicion of {node} must be refused or silent, got {kind!r}")
    return json.dumps(dict(sorted(reports.items()))).encode()


def parse_suspicions(key: str, value: bytes | None) -> dict[str, str]:
    doc = _json_object(key, value)
    for node, kind in doc.items():
        if kind not in SUSPICION_KINDS:
            raise RecordError(f"{key}: suspicion of {node!r} is {kind!r}, not refused or silent")
    return {str(node): str(kind) for node, kind in doc.items()}


def service_check_id(node_id: str) -> str:
    """Consul's id of the TTL check registered with the node's service (and named by its
    session, so a critical check ends the session too)."""
    return f"service:{node_id}"


def service_registration(
    record: MemberRecord, ttl_s: int, name: str = SERVICE_NAME, tags: Sequence[str] = ()
) -> dict[str, Any]:
    """Keyword arguments of py-consul's agent.service.register for this node. The check starts
    passing: a re-registration (the incarnation changed) must not turn it critical for a
    moment, which would end the session that names it. `name` and `tags` are what Consul
    catalog discovery looks for (docs/discovery.md); Meta node_id names the node to it."""
    host, port = parse_hostport(record.partition_addr, what="--partition-addr")
    return {
        "name": name,
        "service_id": record.node_id,
        "address": host,
        "port": port,
        "tags": list(tags),
        "meta": {
            "node_id": record.node_id,
            "mqtt_addr": record.mqtt_addr,
            "membership_addr": record.membership_addr,
            "incarnation": str(record.incarnation),
        },
        "check": {"ttl": f"{ttl_s}s", "status": "passing"},
    }


class RegistryTracker:
    """Folds the members/ listing into the planner's registrations, remembering since when each
    node's exact record has been seen (`Registration.since_ms`: a rejoin waits for it to
    settle; docs/failover.md). Any doubt unsettles a node: it left the view, a member reports
    it, this agent's own probe of it does not answer, or this agent did not watch (a failed
    watch, a stall). So a removed node rejoins only after --rejoin-settle without doubt, not at
    once with a registration that is merely old."""

    def __init__(self) -> None:
        # node -> (record, the key's CreateIndex, since_ms)
        self._seen: dict[str, tuple[MemberRecord, int, int]] = {}

    def update(self, records: Mapping[str, tuple[MemberRecord, int]], now_ms: int) -> None:
        """The members/ keys now: node -> (record, the key's CreateIndex). A key deleted and
        written again (another CreateIndex) is a new registration even with the same value."""
        seen = {}
        for node, (record, created) in records.items():
            previous = self._seen.get(node)
            if previous is not None and previous[:2] == (record, created):
                seen[node] = previous
            else:
                seen[node] = (record, created, now_ms)
        self._seen = seen

    def unsettle(self, node: str, now_ms: int) -> None:
        """A doubt about the node now: its registration counts from here."""
        entry = self._seen.get(node)
        if entry is not None:
            self._seen[node] = (entry[0], entry[1], max(entry[2], now_ms))

    def unsettle_all(self, now_ms: int) -> None:
        """This agent did not watch for a while (its watch failed, or it stalled): it vouches
        for nothing it did not see."""
        for node in list(self._seen):
            self.unsettle(node, now_ms)

    def registrations(self) -> dict[str, Registration]:
        return {node: record.registration(since) for node, (record, _, since) in self._seen.items()}
