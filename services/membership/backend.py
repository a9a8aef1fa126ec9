"""Membership backends: where the member list comes from.

A backend reports members joining and leaving; `ViewBuilder` turns that into views with the pure
placement function (`hexmq.hashring.assign`), so the Consul-backed agreement of a later issue
plugs in here without touching the gRPC surface or the services that watch it.

`StaticMembership` is the embedded default for now: the members file, read once. It has no
failure detection; a node that dies stays a member (its partitions are unavailable until it is
back), which is what RF 1 without failover means.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from hexmq.api.membership.v1 import membership_pb2 as pb
from services.membership.view import MemberInfo, build_view


@dataclass(frozen=True, slots=True)
class Joined:
    member: MemberInfo


@dataclass(frozen=True, slots=True)
class Left:
    node_id: str


MembershipEvent = Joined | Left


class MembershipBackend(Protocol):
    def events(self) -> AsyncIterator[list[MembershipEvent]]:
        """Batches of membership changes, the current members first; ends when the backend
        stops."""
        ...


class StaticMembership:
    """Every member of the members file joins at once; nothing changes afterwards."""

    def __init__(self, members: Sequence[MemberInfo]) -> None:
        self._members = list(members)

    async def events(self) -> AsyncIterator[list[MembershipEvent]]:
        yield [Joined(m) for m in self._members]


class ViewBuilder:
    """Folds membership events into views; each change makes a view with the next epoch."""

    def __init__(self, *, partitions: int, rf: int) -> None:
        self._partitions = partitions
        self._rf = rf
        self._members: dict[str, MemberInfo] = {}
        self._epoch = 0

    def apply(self, events: Sequence[MembershipEvent]) -> pb.View | None:
        """The new view, or None if the events changed nothing (or left no member)."""
        before = dict(self._members)
        for event in events:
            if isinstance(event, Joined):
                self._members[event.member.node_id] = event.member
            else:
                self._members.pop(event.node_id, None)
        if self._members == before or not self._members:
            return None
        self._epoch += 1
        return build_view(
            list(self._members.values()),
            partitions=self._partitions,
            rf=self._rf,
            epoch=self._epoch,
        )
