"""The inter-node protocol: its versions and feature flags (docs/releases.md, "Protocol
versions").

Every process that talks to another node says what it speaks, a `Support`: the lowest and the
highest protocol version, and the optional features it can use. It travels in every hello
between nodes (the edge's `Hello` to partition services, the replication `FollowerHello`), in
the partition service's watch of its membership agent, and in the node's registration in Consul
(hexmq/<cluster>/members/<node>).

A cluster speaks the highest version that every member supports (the newest its oldest member
knows), and a feature is on only while every member supports it (`cluster_protocol`). The
membership planner writes both into the view, so every service of every node switches at the
same view; a node too old or too new for the members is not admitted (`admission_refusal`),
and a peer that shares no version with a process is refused on its link (`link_refusal`).

A message from a release before protocol versions (v0.2.0) carries none of this: it speaks
version 1 with no features (`LEGACY`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from hexmq.api.common.v1 import common_pb2
from hexmq.api.membership.v1 import membership_pb2

# The protocol versions this release speaks. Version 1 is v0.2.0's (the first tagged release);
# version 2 adds the features below marked 2. A release keeps speaking the previous release's
# versions, so that a cluster can be upgraded (and rolled back) one node at a time.
MIN_VERSION: Final = 1
MAX_VERSION: Final = 2

# Snapshot chunks (the bulk transfer of a partition to a follower) carry their writes
# compressed with zlib (SnapshotChunk.packed_ops). A v0.2.0 follower ignores that field and
# would take such a chunk as empty, so a master sends it only while every member supports it.
ZLIB_SNAPSHOTS: Final = "zlib-snapshots"

# An edge confirms each Kick once it has closed the connection (EdgeCommand.kicked), and a
# partition master holds the answer to the OpenSession that took a session over until then (G5:
# the new connection gets its CONNACK only once the old one is closed). Per link: a master
# waits only for an edge whose hello offers it (an older edge never confirms).
KICK_ACKS: Final = "kick-acks"

# Every feature this release knows, with the protocol version that introduced it: a process
# that supports a feature speaks at least that version.
FEATURES: Final[Mapping[str, int]] = {ZLIB_SNAPSHOTS: 2, KICK_ACKS: 2}

_FEATURE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{0,62}")


class ProtocolError(ValueError):
    """A protocol support that cannot be (versions out of order, a bad feature name ...)."""


@dataclass(frozen=True, slots=True)
class Support:
    """What one process speaks: versions min_version..max_version and these features."""

    min_version: int
    max_version: int
    features: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not 1 <= self.min_version <= self.max_version:
            raise ProtocolError(
                f"protocol versions {self.min_version}..{self.max_version}: need "
                "1 <= lowest <= highest"
            )
        for name in sorted(self.features):
            if not _FEATURE_NAME.fullmatch(name):
                raise ProtocolError(
                    f"feature name {name!r}: 1-63 lowercase letters, digits, '.' or '-'"
                )
            since = FEATURES.get(name)
            if since is not None and self.max_version < since:
                raise ProtocolError(
                    f"feature {name} needs protocol version {since}, but the highest version "
                    f"spoken is {self.max_version}"
                )

    @property
    def versions(self) -> str:
        """'1..2', or '1' for a single version."""
        if self.min_version == self.max_version:
            return str(self.min_version)
        return f"{self.min_version}..{self.max_version}"

    def describe(self) -> str:
        """'1..2 +zlib-snapshots': versions, then each feature."""
        return " ".join([self.versions, *(f"+{f}" for f in sorted(self.features))])

    def meet(self, other: Support) -> Support | None:
        """What both speak (None: no version in common). Both offering a feature means both
        reach the version that introduced it, so the common versions do too."""
        low = max(self.min_version, other.min_version)
        high = min(self.max_version, other.max_version)
        if low > high:
            return None
        return Support(low, high, self.features & other.features)

    def to_proto(self) -> common_pb2.ProtocolSupport:
        return common_pb2.ProtocolSupport(
            min_version=self.min_version,
            max_version=self.max_version,
            features=sorted(self.features),
        )

    @classmethod
    def from_proto(cls, message: common_pb2.ProtocolSupport) -> Support:
        """A hello's or registration's support; an unset one (all zero: a release before
        protocol versions) is LEGACY. Raises ProtocolError for an inconsistent one."""
        if message.min_version == 0 and message.max_version == 0:
            if message.features:
                raise ProtocolError(f"features {list(message.features)} without versions")
            return LEGACY
        return cls(message.min_version, message.max_version, frozenset(message.features))


# v0.2.0, and anything that does not say what it speaks.
LEGACY: Final = Support(1, 1)
# What this release's processes speak.
THIS_RELEASE: Final = Support(MIN_VERSION, MAX_VERSION, frozenset(FEATURES))


@dataclass(frozen=True, slots=True)
class ClusterProtocol:
    """What a cluster speaks: one version, and the features that are on."""

    version: int
    features: frozenset[str] = frozenset()

    def uses(self, feature: str) -> bool:
        return feature in self.features

    def describe(self) -> str:
        on = ", ".join(sorted(self.features)) or "none"
        return f"version {self.version}, features: {on}"

    @classmethod
    def of_view(cls, view: membership_pb2.View) -> ClusterProtocol:
        """What a view says the cluster speaks (a view from v0.2.0 says nothing: BASELINE)."""
        return cls(view.protocol_version or 1, frozenset(view.features))


# Version 1 with no feature: what every release speaks.
BASELINE: Final = ClusterProtocol(1)


def common_support(supports: Iterable[Support]) -> Support | None:
    """What every one of `supports` speaks (None: no version in common, or none given)."""
    shared: Support | None = None
    first = True
    for support in supports:
        if first:
            shared, first = support, False
        elif shared is not None:
            shared = shared.meet(support)
    return shared


def cluster_protocol(supports: Iterable[Support]) -> ClusterProtocol:
    """What members that speak `supports` speak together: the highest version all of them
    support, and the features all of them support. Members that share no version (admission
    keeps them apart, so only a view made by hand has them) get no feature at all."""
    supports = list(supports)
    if not supports:
        return BASELINE
    shared = common_support(supports)
    if shared is None:
        return ClusterProtocol(min(s.max_version for s in supports))
    return ClusterProtocol(shared.max_version, shared.features)


def admission_refusal(joiner: Support, members: Mapping[str, Support]) -> str | None:
    """Why a node that speaks `joiner` cannot join nodes that speak `members` (node id ->
    support), or None if it can: it must share a version with all of them."""
    if not members:
        return None
    shared = common_support(members.values())
    if shared is None:
        return (
            f"it speaks protocol versions {joiner.versions} and the members share no version: "
            + _listing(members)
        )
    if joiner.max_version < shared.min_version:
        newer = {n: s for n, s in members.items() if s.min_version > joiner.max_version}
        return (
            f"too old: it speaks protocol versions up to {joiner.max_version}, and "
            f"{_listing(newer)} speak(s) nothing older than {shared.min_version}; upgrade it"
        )
    if joiner.min_version > shared.max_version:
        older = {n: s for n, s in members.items() if s.max_version < joiner.min_version}
        return (
            f"too new: it speaks protocol versions from {joiner.min_version} on, and "
            f"{_listing(older)} speak(s) nothing newer than {shared.max_version}; upgrade "
            "those first, or run a release that still speaks their version"
        )
    return None


def link_refusal(peer: str, theirs: Support, ours: Support) -> str | None:
    """Why a link from `peer` (speaking `theirs`) to a process speaking `ours` is refused, or
    None if they share a version."""
    if theirs.meet(ours) is not None:
        return None
    return (
        f"{peer} speaks protocol versions {theirs.versions}, this process speaks "
        f"{ours.versions}: no version in common"
    )


def _listing(supports: Mapping[str, Support]) -> str:
    return ", ".join(f"{node} ({s.versions})" for node, s in sorted(supports.items()))
