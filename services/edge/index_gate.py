"""IndexGate: publishes that wait until every partition's subscription index has arrived (GATE
tickets of the PartitionCommands core, services/edge/hold.py): answered OK once it has (at
once if it has), refused past the failover hold. Pure: no asyncio, no I/O."""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.tickets import OK_RESULT, SC, Answer, Effect, Ticket


class IndexGate:
    def __init__(self) -> None:
        self.waiters: list[Ticket] = []
        # Every partition's index has arrived (for good: it stays complete).
        self.complete = False

    def wait(self, ticket: Ticket) -> list[Effect]:
        if self.complete:
            return [Answer(ticket, OK_RESULT)]
        self.waiters.append(ticket)
        return []

    def completed(self) -> list[Effect]:
        self.complete = True
        waiters, self.waiters = self.waiters, []
        return [Answer(t, OK_RESULT) for t in waiters]

    def refuse_held_since(self, deadline: float, hold: float) -> list[Effect]:
        """Refuse the waiters submitted at or before `deadline` (held `hold` seconds)."""
        expired = [t for t in self.waiters if t.submitted <= deadline]
        if not expired:
            return []
        self.waiters = [t for t in self.waiters if t.submitted > deadline]
        refusal = pb.Result(
            status=SC.STATUS_CODE_UNAVAILABLE,
            message="some partition has no master: its subscription index has not "
            f"arrived (held {hold:g} s)",
        )
        return [Answer(t, refusal) for t in expired]
