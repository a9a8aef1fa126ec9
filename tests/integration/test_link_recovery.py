"""Every cluster link recovers within a bound once a silent cut heals (issue 30), with the
channel options the services use (hexmq/grpc_options.py), against real gRPC servers through a
proxy that goes silent (tests/support/tcpproxy.py: a cut drops every byte, and a connection
open across it stays silent for good, as one whose peer gave up on it).

Before issue 30 the view watch (an edge's or a partition service's, to the node's own agent)
had no keepalive: it only receives, so it never noticed that its connection had died in a cut
and kept its view for ever, also after the heal (the edge then routed by a view in which its
node still mastered partitions the cluster had failed over). And a connection attempt made
during a cut had gRPC's default 20 s to complete, so links came back up to ~15 s after the
heal. Both now: a dead connection is noticed within keepalive (10 s + 5 s), and once the peer
answers again the link is back within RECONNECT_BOUND_S.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.membership.v1 import membership_pb2_grpc as mpb_grpc
from hexmq.grpc_options import CLUSTER_CHANNEL_OPTIONS, LINK_OPTIONS, PING_POLICY, RECONNECT_BOUND_S
from hexmq.health import add_health
from hexmq.membership.client import ViewWatcher
from hexmq.streams import Backoff, keep_streaming
from services.edge.links import GRPC_OPTIONS
from tests.support.tcpproxy import FreezableProxy

# Long enough for the keepalive to find the old connection dead (10 s + 5 s) and for the
# attempts after it to meet the cut, as in the 20 s cut.
CUT_S = 20.0
# Once the peer answers again: the bound, and room for a loaded machine.
AFTER_HEAL_S = RECONNECT_BOUND_S + 3.0


class Views(mpb_grpc.MembershipServiceServicer):
    """A membership agent's Watch, alone: every view newer than the caller's."""

    def __init__(self) -> None:
        self.view = mpb.View(epoch=1)
        self.changed = asyncio.Condition()

    async def publish(self, epoch: int) -> None:
        async with self.changed:
            self.view = mpb.View(epoch=epoch)
            self.changed.notify_all()

    async def Watch(
        self, request: mpb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[mpb.View]:
        sent = request.after_epoch
        while True:
            async with self.changed:
                while self.view.epoch <= sent:
                    await self.changed.wait()
                view = self.view
            sent = view.epoch
            yield view


async def test_the_view_watch_and_a_link_come_back_within_the_bound_after_a_cut() -> None:
    views = Views()
    server = grpc.aio.server(options=[*LINK_OPTIONS, *PING_POLICY])
    mpb_grpc.add_MembershipServiceServicer_to_server(views, server)
    add_health(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    proxy = FreezableProxy(("127.0.0.1", port))

    seen: list[tuple[int, float]] = []
    have: dict[int, asyncio.Event] = {1: asyncio.Event(), 2: asyncio.Event()}

    async def on_view(view: mpb.View) -> None:
        seen.append((view.epoch, time.monotonic()))
        have[view.epoch].set()

    # The view watch as the edge and the partition service make it (services/edge/server.py).
    watcher = ViewWatcher(
        proxy.addr,
        on_view,
        dial=lambda: grpc.aio.insecure_channel(proxy.addr, options=CLUSTER_CHANNEL_OPTIONS),
    )
    # An edge link's reconnecting stream (services/edge/links.py), here a health Watch.
    opened: list[float] = []
    link_up = asyncio.Event()

    async def stream(channel: grpc.aio.Channel, backoff: Backoff) -> str:
        call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        async for _ in call:
            if not link_up.is_set():
                opened.append(time.monotonic())
                link_up.set()
                backoff.reset()
        return "stream ended"

    def closed(why: str) -> None:
        link_up.clear()

    link = asyncio.create_task(
        keep_streaming(
            lambda: grpc.aio.insecure_channel(proxy.addr, options=GRPC_OPTIONS),
            stream,
            refused=lambda why, details: None,
            closed=closed,
        )
    )
    watcher.start()
    try:
        await asyncio.wait_for(have[1].wait(), 10)
        await asyncio.wait_for(link_up.wait(), 10)
        proxy.freeze()
        cut_at = time.monotonic()
        await views.publish(2)  # into the cut: lost with the connection it was sent on
        await asyncio.sleep(CUT_S)
        assert not have[2].is_set(), "the view crossed the cut"
        assert not link_up.is_set(), f"the link's stream was not found dead in {CUT_S:g} s"
        proxy.thaw()
        healed = time.monotonic()
        await asyncio.wait_for(asyncio.gather(have[2].wait(), link_up.wait()), AFTER_HEAL_S + 30)
        view_after = seen[-1][1] - healed
        link_after = opened[-1] - healed
        back = f"the view watch was back {view_after:.1f} s and the link {link_after:.1f} s"
        assert view_after <= AFTER_HEAL_S, f"{back} after the heal ({healed - cut_at:.0f} s cut)"
        assert link_after <= AFTER_HEAL_S, f"{back} after the heal ({healed - cut_at:.0f} s cut)"
    finally:
        link.cancel()
        await watcher.stop()
        await asyncio.gather(link, return_exceptions=True)
        proxy.close()
        await server.stop(None)
