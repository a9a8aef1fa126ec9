"""Inbound QoS 2 at the edge: the claim's origin id on the routed publish, and the forgets.

The publisher's session partition gives every QoS 2 claim an origin id (Result.qos2_origin);
each routing attempt of that claim carries it in its Publish commands, so that a target
partition that stored the message already (an earlier attempt, whose edge died mid-routing)
does not store it again (services/partition/qos2_seen.py). Once the claim is settled (routed,
or dropped before a PUBREC with a failure code) no attempt can be retried, and the targets are
told to forget the origin: fire and forget, gathered per partition node and sent as one
Qos2Forget per node per event-loop turn, so a burst of QoS 2 publishes costs a few commands,
not one per message, and nothing waits for them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import Publish

if TYPE_CHECKING:
    from services.edge.links import PartitionLink

log = logging.getLogger("hexmq.edge.qos2")

# Origins per Qos2Forget command (a frame holds many commands; this keeps each one small).
MAX_FORGETS_PER_COMMAND = 2048

Commands = Sequence[tuple["PartitionLink", pb.EdgeCommand]]


@dataclass(frozen=True, slots=True)
class RoutedOrigin:
    """A routing attempt's origin id and the Publish commands that carried it."""

    origin: bytes
    commands: Commands


def carry_origin(origin: bytes, commands: Commands) -> RoutedOrigin:
    """Stamp every Publish command of one routing with the claim's origin id."""
    for _link, cmd in commands:
        cmd.publish.qos2_origin = origin
    return RoutedOrigin(origin, commands)


class OriginForgets:
    """Qos2Forget commands, gathered per partition link."""

    def __init__(self) -> None:
        self._pending: dict[PartitionLink, list[pb.SeenOrigin]] = {}
        self._scheduled = False
        self.sent = 0

    def forget(self, routed: RoutedOrigin) -> None:
        """The claim of `routed.origin` is settled: its targets may let it go."""
        origin = routed.origin
        if not origin:
            return  # a session partition that gives no origin ids: nothing was remembered
        for link, cmd in routed.commands:
            pending = self._pending.setdefault(link, [])
            publish = cmd.publish
            for target in publish.targets:
                pending.append(
                    pb.SeenOrigin(partition=target.partition, epoch=target.epoch, origin=origin)
                )
            retained = publish.retained
            if publish.HasField("retained") and all(
                t.partition != retained.partition for t in publish.targets
            ):
                pending.append(
                    pb.SeenOrigin(partition=retained.partition, epoch=retained.epoch, origin=origin)
                )
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for link, entries in pending.items():
            for i in range(0, len(entries), MAX_FORGETS_PER_COMMAND):
                chunk = entries[i : i + MAX_FORGETS_PER_COMMAND]
                # A link that is down drops them: those origins wait for the age sweep.
                if link.send(pb.EdgeCommand(qos2_forget=pb.Qos2Forget(origins=chunk))):
                    self.sent += len(chunk)


def fault_stall(prefix: str, packet: Publish, commands: Commands) -> Commands:
    """Fault injection (`hexmq edge --fault-stall-qos2-routing PREFIX`, for tests only): a QoS 2
    PUBLISH without DUP whose topic starts with PREFIX is sent to its first target node only,
    and its routing never ends (never reported, no PUBREC), as if the edge died right after
    that node stored it. The client's resend (DUP set) is routed normally."""
    if not prefix or packet.dup or not packet.topic.startswith(prefix) or len(commands) < 2:
        return commands
    log.warning(
        "fault injection: QoS 2 PUBLISH %s on %r stalled after its first target node (%s)",
        packet.packet_id,
        packet.topic,
        commands[0][0].node_id,
    )
    return commands[:1]
