"""ViewWatcher: how edge and partition follow the cluster view of their local membership agent.

Keeps the newest view, reconnects with backoff when the agent is away (a dead agent never makes
a service hang: the last view stays in force), and calls a listener on every newer view.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import grpc

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.service import cancel_and_wait

log = logging.getLogger(__name__)

ViewListener = Callable[[pb.View], Awaitable[None]]


class ViewWatcher:
    def __init__(self, target: str, listener: ViewListener) -> None:
        self._target = target
        self._listener = listener
        self.view: pb.View | None = None
        self._have_view = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="view-watcher")

    async def wait_ready(self) -> pb.View:
        """The first view (callers bound the wait with asyncio.timeout)."""
        await self._have_view.wait()
        assert self.view is not None
        return self.view

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            try:
                async with grpc.aio.insecure_channel(self._target) as channel:
                    stub = pb_grpc.MembershipServiceStub(channel)
                    after = self.view.epoch if self.view is not None else 0
                    async for view in stub.Watch(pb.WatchRequest(after_epoch=after)):
                        backoff = 0.05
                        if self.view is None or view.epoch > self.view.epoch:
                            self.view = view
                            await self._listener(view)
                            self._have_view.set()
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "membership %s unreachable (%s); keeping view epoch %s",
                    self._target,
                    exc.code().name,
                    self.view.epoch if self.view else None,
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
