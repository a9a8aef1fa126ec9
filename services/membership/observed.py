"""What a membership agent observes: the inputs of the agreement planner (plan.py).

Each is checked when built, so bad input is refused with an error naming what is wrong
before it can reach a plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.node_protocol import THIS_RELEASE, Support

# How an agent found a node unreachable: "refused" (the process is gone: connection refused or
# reset, confirmed by a second probe) is strong evidence; "silent" (timeouts) is not.
REFUSED = "refused"
SILENT = "silent"
_KINDS = (REFUSED, SILENT)


@dataclass(frozen=True, slots=True)
class Registration:
    """A live hexmq/<cluster>/members/<node> key."""

    node_id: str
    partition_addr: str
    mqtt_addr: str
    membership_addr: str
    incarnation: int  # 0: its partition service is not serving
    # When the agent first saw this exact value (a re-created key counts as new) or, if later,
    # last doubted the node: a live member reported it, its own probe of it failed, or the
    # agent itself was not watching (paused, restarted). docs/failover.md, "Who changes the
    # view": --rejoin-settle counts from the last doubt.
    since_ms: int
    # What the node speaks of the inter-node protocol, as its record says (a v0.2.0 record:
    # LEGACY). The default is what this release's agents register.
    protocol: Support = THIS_RELEASE
    # Its agent was asked to take the node out of the cluster (`hexmq cluster leave`, SIGTERM):
    # the view drops it from target_members (docs/failover.md, "Leave").
    leaving: bool = False
    # Its services serve mutual TLS: peers dial it with TLS (Member.tls, docs/security.md).
    tls: bool = False

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("a Registration needs a node_id")
        if self.incarnation < 0:
            raise ValueError(
                f"registration of {self.node_id}: incarnation {self.incarnation} is negative"
            )

    def member(self) -> pb.Member:
        return pb.Member(
            node_id=self.node_id,
            partition_addr=self.partition_addr,
            mqtt_addr=self.mqtt_addr,
            membership_addr=self.membership_addr,
            incarnation=self.incarnation,
            tls=self.tls,
        )


@dataclass(frozen=True, slots=True)
class InSyncRequest:
    """From this node's partition service, which masters the partition at `epoch`."""

    partition: int
    epoch: int
    add: frozenset[str] = frozenset()
    remove: frozenset[str] = frozenset()
    # (node, incarnation) of added followers, as their master knows them: a follower is added
    # only while the view has it with that incarnation (0 or absent: any).
    add_incarnations: tuple[tuple[str, int], ...] = ()

    def incarnation_of(self, follower: str) -> int:
        return dict(self.add_incarnations).get(follower, 0)

    def __post_init__(self) -> None:
        _check_request(self.partition, self.epoch, "InSyncRequest")
        both = self.add & self.remove
        if both:
            raise ValueError(
                f"InSyncRequest for partition {self.partition}: {sorted(both)} both added and"
                " removed"
            )
        if "" in self.add or "" in self.remove:
            raise ValueError(f"InSyncRequest for partition {self.partition}: empty node id")


@dataclass(frozen=True, slots=True)
class HandoverRequest:
    """From this node's partition service: make `to` master (it has quiesced the partition)."""

    partition: int
    epoch: int
    to: str

    def __post_init__(self) -> None:
        _check_request(self.partition, self.epoch, "HandoverRequest")
        if not self.to:
            raise ValueError(f"HandoverRequest for partition {self.partition}: no node to")


Request = InSyncRequest | HandoverRequest


def _check_request(partition: int, epoch: int, what: str) -> None:
    if partition < 0:
        raise ValueError(f"{what}: partition {partition} is negative")
    if epoch < 1:
        raise ValueError(f"{what} for partition {partition}: epoch {epoch} is not positive")


@dataclass(frozen=True, slots=True)
class Discovered:
    """What the node discovery of the agent lists now, matched to the registrations
    (services/membership/discovery; docs/discovery.md): discovery is the gate at the door,
    never a reason to remove a member."""

    listed: frozenset[str]  # registered nodes that discovery lists (serving or not)
    # Listed entries that no serving registration answers yet: a first view whose --expect is
    # derived from discovery waits until this is 0.
    missing: int = 0

    def __post_init__(self) -> None:
        if self.missing < 0:
            raise ValueError(f"Discovered.missing is negative: {self.missing}")


@dataclass(frozen=True, slots=True)
class Observed:
    registry: Mapping[str, Registration]  # node -> registration (live sessions only)
    suspicions: Mapping[str, Mapping[str, str]]  # reporter -> {node: "refused" | "silent"}
    requests: Sequence[Request] = field(default_factory=tuple)  # this node's, pending
    # None: no discovery configured, every registered node is a candidate (as before there
    # was discovery).
    discovered: Discovered | None = None

    def admits(self, node: str) -> bool:
        """Whether discovery lets `node` in (always, without discovery)."""
        return self.discovered is None or node in self.discovered.listed

    def __post_init__(self) -> None:
        for node, reg in self.registry.items():
            if node != reg.node_id:
                raise ValueError(f"registry key {node!r} holds the registration of {reg.node_id!r}")
        for reporter, reports in self.suspicions.items():
            for node, kind in reports.items():
                if kind not in _KINDS:
                    raise ValueError(
                        f"{reporter} reports {node} {kind!r}: expected one of {', '.join(_KINDS)}"
                    )


@dataclass(frozen=True, slots=True)
class PlanConfig:
    node_id: str  # the planning agent's node
    partitions: int  # used only to create the first view
    rf: int
    # Registered serving nodes needed to create the first view. None: every node discovery
    # lists (Discovered.missing == 0), or 1 without discovery.
    expect: int | None
    rejoin_settle_ms: int  # a (re)joining node's registration must be this old and unsuspected

    def __post_init__(self) -> None:
        if not self.node_id:
            raise ValueError("PlanConfig needs the planning node's node_id")
        for name in ("partitions", "rf", "expect"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"PlanConfig.{name} must be positive, got {value}")
        if self.rejoin_settle_ms < 0:
            raise ValueError(f"PlanConfig.rejoin_settle_ms is negative: {self.rejoin_settle_ms}")
