"""The commands the edge sends to partition masters, as data: tickets (a command on its way,
and who hears its answer), routes, the effects services/edge/hold.py returns, and how a command
is addressed to a partition's epoch or split per partition. No asyncio, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hexmq.api.partition.v1 import partition_pb2 as pb

SC = pb.StatusCode
# (Module constants: a protobuf enum's attributes are a Python-level lookup each time.)
OK = SC.STATUS_CODE_OK
UNAVAILABLE = SC.STATUS_CODE_UNAVAILABLE
OK_RESULT = pb.Result(status=OK)
ResultCallback = Callable[[pb.Result], None]


def when_all_answered(count: int, done: Callable[[list[pb.Result]], None]) -> Callable[..., None]:
    """One callback for the answers of `count` commands: once all have come, `done(answers)`,
    in the order they came. Extra arguments (the route an answer came by) are ignored."""
    answers: list[pb.Result] = []

    def answered(result: pb.Result, *_: object) -> None:
        answers.append(result)
        if len(answers) == count:
            done(answers)

    return answered


def fan_in(parts: int, done: Callable[[pb.Result | None], None]) -> Callable[..., None]:
    """One callback for the answers of `parts` commands (a publish split per master node):
    once all have come, `done(the first failure, or None)`. Extra arguments (the route an
    answer came by) are ignored."""
    if parts == 1:  # (the common case: one master node)

        def only(result: pb.Result, *_: object) -> None:
            done(None if result.status == OK else result)

        return only

    def all_answered(answers: list[pb.Result]) -> None:
        done(next((result for result in answers if result.status != OK), None))

    return when_all_answered(parts, all_answered)


def refused_by_hold(result: pb.Result) -> bool:
    """The answer is the refusal of a command held past the failover bound (services/edge/
    hold.py). A partition's own UNAVAILABLE answer never reaches a caller: the command is held
    and sent again."""
    return result.status == UNAVAILABLE


class Kind(enum.Enum):
    # Wants a Result: tracked in flight, held again when lost or moved.
    REQUEST = 1
    # No Result (WillPublished, SharedHandoffDone, Qos2Forget, a QoS 0 publish): held while its
    # partition is closed, then sent and forgotten.
    ONEWAY = 2
    # No command: answered OK once it is first in its partition and the partition is open (a
    # CONNECT waits so until its session's partition can take its OpenSession).
    GATE = 3
    # AttachSession: a request ahead of every held command of its partition, which the
    # partition's other commands wait behind until it is answered.
    ATTACH = 4


@dataclass(frozen=True, slots=True)
class Route:
    """Where a partition's commands go: its master, the partition's epoch, and the session of
    the link to that master (bumped each time the link comes back)."""

    node: str
    epoch: int
    link_session: int


@dataclass(eq=False, slots=True)
class Ticket:
    """One command on its way to a partition master (or a gate), as the caller submitted it."""

    kind: Kind
    partitions: tuple[int, ...]
    command: pb.EdgeCommand | None
    on_result: ResultCallback | None
    submitted: float = 0.0
    command_id: int = 0
    serial: int = 0
    # Bumped on every send: an answer to an earlier send is ignored.
    attempt: int = 0
    # The routes of its last send, one per partition (one node): where its answer comes from.
    routes: tuple[Route, ...] = ()
    in_flight: bool = False
    # The command already carries the epochs of the edge's current view (a publish the router
    # has just built): no need to stamp it again when it goes at once. Cleared when held.
    addressed: bool = False
    # A part of a split publish, and on the whole: its parts still unanswered and the first
    # failure among them.
    parent: Ticket | None = None
    parts_left: int = 0
    failure: pb.Result | None = None
    # The caller gave up on it (PartitionCommands.withdraw): never sent again.
    withdrawn: bool = False

    @property
    def sent_to(self) -> Route | None:
        """The route of its last send (of its first partition)."""
        return self.routes[0] if self.routes else None


@dataclass(frozen=True, slots=True)
class Send:
    ticket: Ticket
    route: Route
    attempt: int


@dataclass(frozen=True, slots=True)
class Answer:
    ticket: Ticket
    result: pb.Result


@dataclass(frozen=True, slots=True)
class Log:
    level: int
    message: str


Effect = Send | Answer | Log


def publish_partitions(cmd: pb.EdgeCommand) -> tuple[int, ...]:
    """The partitions a Publish command addresses: its targets and its retained target."""
    publish = cmd.publish
    targets = publish.targets
    has_retained = publish.HasField("retained")
    if len(targets) == 1 and not has_retained:
        return (targets[0].partition,)
    parts = {t.partition for t in targets}
    if has_retained:
        parts.add(publish.retained.partition)
    return tuple(sorted(parts))


def address(cmd: pb.EdgeCommand, partition: int, epoch: int) -> None:
    """Stamp `cmd` with the epoch it is sent under for `partition` (fencing at the master)."""
    kind = cmd.WhichOneof("command")
    if kind == "publish":
        publish = cmd.publish
        for target in publish.targets:
            if target.partition == partition:
                target.epoch = epoch
        if publish.HasField("retained") and publish.retained.partition == partition:
            publish.retained.epoch = epoch
    elif kind == "qos2_forget":
        for origin in cmd.qos2_forget.origins:
            origin.epoch = epoch
    else:
        cmd.partition = partition
        cmd.partition_epoch = epoch


def publish_part(cmd: pb.EdgeCommand, partition: int) -> pb.EdgeCommand:
    """The part of a Publish command for one of its partitions (same message, command id)."""
    part = pb.EdgeCommand()
    part.CopyFrom(cmd)
    publish = part.publish
    mine = [
        pb.PartitionTarget(partition=t.partition, epoch=t.epoch, shared=t.shared)
        for t in cmd.publish.targets
        if t.partition == partition
    ]
    del publish.targets[:]
    publish.targets.extend(mine)
    if publish.HasField("retained") and publish.retained.partition != partition:
        publish.ClearField("retained")
    return part


def split_publish(ticket: Ticket, serials: Iterator[int]) -> list[Ticket]:
    """One part per partition of a publish (each with a serial from `serials`); the whole is
    answered when all parts are (`answer`)."""
    assert ticket.command is not None
    parts = []
    for p in ticket.partitions:
        part = Ticket(
            ticket.kind,
            (p,),
            publish_part(ticket.command, p),
            None,
            submitted=ticket.submitted,
            command_id=ticket.command_id,
            serial=next(serials),
            parent=ticket,
            addressed=ticket.addressed,
        )
        parts.append(part)
    ticket.parts_left = len(parts)
    return parts


def answer(ticket: Ticket, result: pb.Result, effects: list[Effect]) -> None:
    """Answer `ticket`; a part of a split publish counts towards its whole, which is answered
    (the first failure, else OK) once every part is."""
    parent = ticket.parent
    if parent is None:
        effects.append(Answer(ticket, result))
        return
    parent.parts_left -= 1
    if result.status != SC.STATUS_CODE_OK and parent.failure is None:
        parent.failure = result
    if not parent.parts_left:
        answer(parent, parent.failure or result, effects)
