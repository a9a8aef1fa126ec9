"""What a session core asks its adapter to do, as data (services/edge/session/core.py).

Every input to a `Session` returns a list of these, to be carried out in order (not frozen:
a frozen dataclass costs twice as much to make, and one is made per message; nobody changes
them). Commands for
partitions carry a token (the session's own counter); their answers come back to the session
with it (`Session.answered`, `Session.gathered`). Token 0 means no answer is wanted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.qos2_origins import RoutedOrigin


class Pause(enum.IntEnum):
    """Why reading a client's socket is paused; reading resumes when no reason is left. Bits
    of one int (an IntEnum, not an IntFlag: its operators are int's, no enum per test)."""

    CONNECT = 1  # its CONNECT waits for the session's partition or its OpenSession's answer
    INFLIGHT = 2  # it has as many publishes being stored as we take (inbound window full)
    LINK = 4  # a partition link it published to is congested (the adapter's)
    WRITE = 8  # its socket's write buffer is over the high-water mark (the adapter's)


@dataclass(slots=True)
class Write:
    """Bytes for the client's socket (every packet the input produced, in order)."""

    data: bytes


@dataclass(slots=True)
class Request:
    """A command for the session's partition that wants a Result (held while the partition
    has no master; token 0: the answer is not needed, but the command must not be lost)."""

    token: int
    partition: int
    command: pb.EdgeCommand


@dataclass(slots=True)
class Open:
    """OpenSession: a Request the session may take back (Withdraw) while it is unanswered."""

    token: int
    partition: int
    command: pb.EdgeCommand


@dataclass(slots=True)
class Withdraw:
    """Take the unanswered OpenSession back: never sent again (its CONNECT was refused for
    time, or the client left before CONNACK), so that it cannot open the session after the
    client has connected elsewhere (services/edge/hold.py, PartitionCommands.withdraw)."""


@dataclass(slots=True)
class Attach:
    """AttachSession, ahead of the partition's held commands (services/edge/hold.py)."""

    token: int
    partition: int
    command: pb.EdgeCommand


@dataclass(slots=True)
class Acknowledge:
    """A DeliveryAck, ahead of queued commands; its answer may never come. `lazy`: nothing
    waits on it (QoS 1 acknowledgements, the session's window at most half full): it may wait
    for company on the link (hexmq/pacing.py)."""

    token: int
    partition: int
    command: pb.EdgeCommand
    lazy: bool = False


@dataclass(slots=True)
class PublishCommand:
    """A Publish for one master node's target partitions (token 0: QoS 0, no answer)."""

    token: int
    node: str
    command: pb.EdgeCommand


@dataclass(slots=True)
class Gate:
    """Answer OK once the partition takes commands (in turn with its held ones)."""

    token: int
    partition: int


@dataclass(slots=True)
class AwaitIndex:
    """Answer OK once every partition's subscription index has arrived."""

    token: int


@dataclass(slots=True)
class GatherRetained:
    """Ask every partition node for the retained messages matching `filters`."""

    token: int
    filters: tuple[str, ...]


@dataclass(slots=True)
class ForgetOrigins:
    """A QoS 2 claim is settled: its routing's targets may forget its origin id."""

    routed: RoutedOrigin


@dataclass(slots=True)
class PauseReading:
    reason: Pause


@dataclass(slots=True)
class ResumeReading:
    reason: Pause


@dataclass(slots=True)
class SetTimer:
    """Call `Session.tick` at `at` (monotonic seconds); None: no timer."""

    at: float | None


@dataclass(slots=True)
class Close:
    """Close the socket once what was written before is sent (`reason_code`: the MQTT reason,
    0 for a normal close; `why`: what the log says). `linger`: a DISCONNECT with a reason was
    the last packet written, and must reach a client that may still be sending: the adapter
    half-closes after it, reads and discards what comes for a bounded time, then closes
    (closing with unread input would reset the connection and lose the DISCONNECT)."""

    reason_code: int = 0
    why: str = ""
    linger: bool = False


@dataclass(slots=True)
class ConfirmKick:
    """Tell partition node `node`, whose Kick ended the connection, that it is closed
    (EdgeCommand.kicked): the master holds the answer to the connection taking the session
    over until then (G5). After the Close: carried out once the DISCONNECT is written."""

    node: str
    command: pb.EdgeCommand


Action = (
    Write
    | Request
    | Open
    | Withdraw
    | Attach
    | Acknowledge
    | PublishCommand
    | Gate
    | AwaitIndex
    | GatherRetained
    | ForgetOrigins
    | PauseReading
    | ResumeReading
    | SetTimer
    | Close
    | ConfirmKick
)
