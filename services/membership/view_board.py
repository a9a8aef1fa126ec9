"""ViewBoard: the latest agreed view this node's agent knows, for whoever waits for a newer one
(the agent's MembershipService Watch streams, services/membership/server.py)."""

from __future__ import annotations

import asyncio

from hexmq.api.membership.v1 import membership_pb2 as pb


class ViewBoard:
    """Holds the latest agreed view (None before the first) and wakes watchers when a newer
    one is published."""

    def __init__(self, view: pb.View | None = None) -> None:
        self._view = view
        self._changed = asyncio.Event()

    @property
    def view(self) -> pb.View | None:
        return self._view

    def publish(self, view: pb.View) -> None:
        if self._view is not None and view.epoch <= self._view.epoch:
            raise ValueError(f"view epoch {view.epoch} is not newer than {self._view.epoch}")
        self._view = view
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def newer_than(self, epoch: int) -> pb.View:
        while self._view is None or self._view.epoch <= epoch:
            await self._changed.wait()
        return self._view
