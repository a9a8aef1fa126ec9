"""Inbound QoS 2 at the edge: the claim's origin id on the routed publish, and the forgets.

The publisher's session partition gives every QoS 2 claim an origin id (Result.qos2_origin);
each routing attempt of that claim carries it in its Publish commands, so that a target
partition that stored the message already (an earlier attempt, whose edge died mid-routing)
does not store it again (services/partition/qos2_seen.py). Once the claim is settled (routed,
or dropped before a PUBREC with a failure code) no attempt can be retried, and the targets are
told to forget the origin: fire and forget, gathered per partition and sent as one Qos2Forget
per master node per event-loop turn, so a burst of QoS 2 publishes costs a few commands, not
one per message, and nothing waits for them (a partition without a reachable master gets its
own, held until it has one: services/edge/dispatch.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import Publish

if TYPE_CHECKING:
    from services.edge.dispatch import Dispatcher

log = logging.getLogger("hexmq.edge.qos2")

# Origins per flush and partition node (a frame holds many commands; this keeps each small).
MAX_FORGETS_PER_COMMAND = 2048

# (master node id, Publish command) per target node of one routing.
Commands = Sequence[tuple[str, pb.EdgeCommand]]


@dataclass(frozen=True, slots=True)
class RoutedOrigin:
    """A routing attempt's origin id and the Publish commands that carried it."""

    origin: bytes
    commands: Commands


def carry_origin(origin: bytes, commands: Commands) -> RoutedOrigin:
    """Stamp every Publish command of one routing with the claim's origin id."""
    for _node, cmd in commands:
        cmd.publish.qos2_origin = origin
    return RoutedOrigin(origin, commands)


class OriginForgets:
    """Qos2Forget commands, gathered per target partition. The epoch of each is the one the
    partition has when the forget is sent: any master of the partition may forget a settled
    claim, and one that does not (the forget lost with a link) sweeps it after its
    retention."""

    def __init__(
        self, dispatcher: Dispatcher, call_soon: Callable[[Callable[[], None]], object]
    ) -> None:
        self._dispatcher = dispatcher
        # Runs a callback on the event loop's next turn (loop.call_soon).
        self._call_soon = call_soon
        self._pending: dict[int, list[bytes]] = {}
        self._count = 0
        self._scheduled = False
        self.sent = 0

    def forget(self, routed: RoutedOrigin) -> None:
        """The claim of `routed.origin` is settled: its targets may let it go."""
        origin = routed.origin
        if not origin:
            return  # a session partition that gives no origin ids: nothing was remembered
        pending = self._pending
        for _node, cmd in routed.commands:
            publish = cmd.publish
            partitions = {t.partition for t in publish.targets}
            if publish.HasField("retained"):
                partitions.add(publish.retained.partition)
            for p in partitions:
                pending.setdefault(p, []).append(origin)
            self._count += len(partitions)
        if self._count >= MAX_FORGETS_PER_COMMAND:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, {}
        if pending:
            self._dispatcher.forget_origins(pending)
            self.sent += self._count
        self._count = 0


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
        commands[0][0],
    )
    return commands[:1]
