"""The cluster view: members plus the partition table computed from them by the hashring."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.hashring import assign


@dataclass(frozen=True, slots=True)
class MemberInfo:
    node_id: str
    partition_addr: str
    mqtt_addr: str
    membership_addr: str

    def to_proto(self) -> pb.Member:
        return pb.Member(
            node_id=self.node_id,
            partition_addr=self.partition_addr,
            mqtt_addr=self.mqtt_addr,
            membership_addr=self.membership_addr,
        )


class MembersFileError(ValueError):
    """The members file is unreadable or malformed; the message names the file and the entry."""


def load_members(path: Path) -> list[MemberInfo]:
    """Read the static members file written by `hexmq cluster up` (or by an operator)."""
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise MembersFileError(f"{path}: cannot read: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise MembersFileError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
    entries = doc.get("members") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise MembersFileError(f"{path}: needs a non-empty list under 'members'")
    members: list[MemberInfo] = []
    fields = ("node_id", "partition_addr", "mqtt_addr", "membership_addr")
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or any(not isinstance(entry.get(f), str) for f in fields):
            raise MembersFileError(f"{path}: members[{i}] needs string fields {', '.join(fields)}")
        members.append(MemberInfo(*(entry[f] for f in fields)))
    ids = [m.node_id for m in members]
    if len(set(ids)) != len(ids):
        raise MembersFileError(f"{path}: duplicate node_id in {ids}")
    return members


def build_view(members: Sequence[MemberInfo], *, partitions: int, rf: int, epoch: int) -> pb.View:
    """The view for these members. Partition epochs equal the view epoch in which the
    partition's master last changed; with a static membership that is the first view."""
    table = assign((m.node_id for m in members), partitions, rf)
    return pb.View(
        epoch=epoch,
        partition_count=partitions,
        replication_factor=rf,
        members=[m.to_proto() for m in sorted(members, key=lambda m: m.node_id)],
        partitions=[
            pb.PartitionAssignment(
                partition=p, epoch=epoch, replicas=list(replicas), in_sync=list(replicas)
            )
            for p, replicas in enumerate(table)
        ],
    )
