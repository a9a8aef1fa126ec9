"""The partition node's side of an edge link: an outgoing queue drained in batched frames."""

from __future__ import annotations

import asyncio

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.pacing import FlushPacer

# A frame carries at most this many events; the rest wait for the next frame.
MAX_EVENTS_PER_FRAME = 2048


class EdgeLink:
    def __init__(
        self,
        edge_id: str,
        incarnation: int,
        *,
        kick_acks: bool = False,
        pacer: FlushPacer | None = None,
    ) -> None:
        self.edge_id = edge_id
        self.incarnation = incarnation
        # The edge confirms each Kick once the connection is closed (the kick-acks feature).
        self.kick_acks = kick_acks
        self._events: list[pb.PartitionEvent] = []
        self._ok_ids: list[int] = []
        self._wake = asyncio.Event()
        # When frames may go (default: the process's pacing interval), and what it cost.
        self._pacer = pacer if pacer is not None else FlushPacer(full=MAX_EVENTS_PER_FRAME)
        self.linger = telemetry.METRICS.linger("partition_link")
        self.closed = False
        # The highest index update seq this edge has applied (IndexAck).
        self.index_acked = 0

    def __repr__(self) -> str:
        return f"EdgeLink({self.edge_id}#{self.incarnation})"

    def send(self, event: pb.PartitionEvent) -> None:
        if not self.closed:
            self._events.append(event)
            self._wake.set()

    def ok(self, request_id: int) -> None:
        """Answer a request with a plain OK (sent as an id in the next frame)."""
        if not self.closed:
            self._ok_ids.append(request_id)
            self._wake.set()

    def close(self) -> None:
        self.closed = True
        self._wake.set()

    def take(self) -> tuple[list[pb.PartitionEvent], list[int]]:
        """What waits to go out: the events, and the request ids answered a plain OK."""
        events, self._events = self._events, []
        ok_ids, self._ok_ids = self._ok_ids, []
        return events, ok_ids

    async def frames(self) -> list[pb.PartitionFrame]:
        """Wait for events, then hand them out as frames (empty list: the link is closed), at
        most one batch per pacing interval (hexmq/pacing.py): results and deliveries made
        meanwhile join it."""
        while not self._events and not self._ok_ids:
            if self.closed:
                return []
            await self._wake.wait()
            self._wake.clear()
        loop = asyncio.get_running_loop()
        delay = self._pacer.delay(loop.time(), len(self._events) + len(self._ok_ids))
        if delay:
            await asyncio.sleep(delay)
            if self.closed:
                return []
        self._pacer.sent(loop.time())
        self.linger.record(len(self._events) + len(self._ok_ids), delay)
        events, ok_ids = self.take()
        frames = [
            pb.PartitionFrame(events=events[i : i + MAX_EVENTS_PER_FRAME])
            for i in range(0, len(events), MAX_EVENTS_PER_FRAME)
        ] or [pb.PartitionFrame()]
        frames[-1].ok_request_ids.extend(ok_ids)
        return frames
