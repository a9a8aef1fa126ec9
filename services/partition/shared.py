"""Shared subscriptions at the partition master: each group's members per partition, and which
member gets a message.

A group is everything subscribed with one "$share/{ShareName}/{filter}" text. Its members are
sessions, spread over partitions (a session lives in partition(client id)). The edges learn
from the subscription index which partitions hold members of a group and whether any of those
members is online; per message an edge picks one such partition and names the group in that
partition's PartitionTarget. The partition then picks one of its members: the next connected
one in turn or, when every member here is offline, the next one in turn, whose persistent
session queues the message.
"""

from __future__ import annotations

from collections.abc import Container

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.sessions import Session


class SharedGroup:
    """The members of one group in one partition, in the order they joined."""

    __slots__ = ("members", "online", "turn")

    def __init__(self) -> None:
        self.members: list[Session] = []
        # Client ids of the members with a live connection.
        self.online: set[str] = set()
        # Where the next turn starts in `members`.
        self.turn = 0

    def pick(self) -> Session:
        """The member that gets the next message: round robin over the connected members,
        else over all of them."""
        members = self.members
        n = len(members)
        start = self.turn % n
        for k in range(n):
            i = (start + k) % n
            if members[i].connection is not None:
                self.turn = i + 1
                return members[i]
        self.turn = start + 1
        return members[start]


def _entry(p: int, filt: str, group: SharedGroup | None) -> pb.IndexEntry:
    if group is None:
        return pb.IndexEntry(partition=p, filter=filt, present=False)
    return pb.IndexEntry(partition=p, filter=filt, present=True, online=bool(group.online))


class SharedGroups:
    """Every group of the partitions mastered here, by (partition, shared filter). Changes
    return the subscription-index entries that every edge must hear (none when the index, i.e.
    presence and online state per partition, did not change)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[int, str], SharedGroup] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def group(self, p: int, filt: str) -> SharedGroup | None:
        return self._groups.get((p, filt))

    def join(self, session: Session, filt: str) -> pb.IndexEntry | None:
        key = (session.partition, filt)
        group = self._groups.get(key)
        created = group is None
        if group is None:
            group = self._groups[key] = SharedGroup()
        was_online = bool(group.online)
        if filt not in session.shared:
            session.shared.add(filt)
            group.members.append(session)
        if session.connection is not None:
            group.online.add(session.client_id)
        if created or bool(group.online) != was_online:
            return _entry(session.partition, filt, group)
        return None

    def leave(self, session: Session, filt: str) -> pb.IndexEntry | None:
        key = (session.partition, filt)
        group = self._groups.get(key)
        if filt not in session.shared or group is None:
            return None
        session.shared.discard(filt)
        # By identity: sessions are dataclasses whose == compares every field.
        for i, member in enumerate(group.members):
            if member is session:
                del group.members[i]
                if i < group.turn:
                    group.turn -= 1
                break
        was_online = bool(group.online)
        group.online.discard(session.client_id)
        if not group.members:
            del self._groups[key]
            return _entry(session.partition, filt, None)
        if bool(group.online) != was_online:
            return _entry(session.partition, filt, group)
        return None

    def presence(self, session: Session) -> list[pb.IndexEntry]:
        """The session's connection came or went: the groups whose online state changed."""
        out: list[pb.IndexEntry] = []
        if not session.shared:
            return out
        online = session.connection is not None
        for filt in session.shared:
            group = self._groups.get((session.partition, filt))
            if group is None:
                continue
            was_online = bool(group.online)
            if online:
                group.online.add(session.client_id)
            else:
                group.online.discard(session.client_id)
            if bool(group.online) != was_online:
                out.append(_entry(session.partition, filt, group))
        return out

    def pick(self, p: int, filt: str) -> Session | None:
        """The member of group `filt` in partition `p` that gets a message (None: no member
        here any more, e.g. the last one left after the edge routed the message)."""
        group = self._groups.get((p, filt))
        return group.pick() if group is not None else None

    def entries(self, partitions: Container[int] | None = None) -> list[pb.IndexEntry]:
        """The index of the groups here (of these partitions only, if given)."""
        return [
            _entry(p, filt, group)
            for (p, filt), group in self._groups.items()
            if partitions is None or p in partitions
        ]

    def unload(self, p: int) -> None:
        """Partition p is no longer mastered here: its groups go (the members' sessions are
        dropped by the caller)."""
        for key in [key for key in self._groups if key[0] == p]:
            del self._groups[key]
