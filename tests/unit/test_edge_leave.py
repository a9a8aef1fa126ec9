"""An edge told to stop (SIGTERM) follows its node's leave and never starts one
(services/edge/server.py, Edge.follow_leave; docs/operations.md, "Leaving")."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from hexmq.api.membership.v1 import membership_pb2 as pb
from services.edge.server import Edge


def view(epoch: int, *, members: tuple[str, ...], leaving: tuple[str, ...] = ()) -> pb.View:
    return pb.View(
        epoch=epoch,
        partition_count=1,
        replication_factor=1,
        members=[pb.Member(node_id=m, incarnation=1) for m in members],
        target_members=[m for m in members if m not in leaving],
        leaving=list(leaving),
        partitions=[pb.PartitionAssignment(partition=0, epoch=1, replicas=[members[0]])],
    )


def edge(first: pb.View) -> Any:
    return SimpleNamespace(router=SimpleNamespace(view=first), config=SimpleNamespace(node_id="n2"))


async def follow(fake: Any, timeout_s: float, notice_s: float, later: list[pb.View]) -> bool | None:
    async def change_views() -> None:
        for v in later:
            await asyncio.sleep(0.25)
            fake.router.view = v

    changer = asyncio.create_task(change_views())
    try:
        return await Edge.follow_leave(cast(Edge, fake), timeout_s, asyncio.Event(), notice_s)
    finally:
        changer.cancel()


async def test_an_edge_whose_node_is_not_leaving_stops_after_the_notice() -> None:
    fake = edge(view(1, members=("n1", "n2")))
    assert await follow(fake, timeout_s=5, notice_s=0.3, later=[]) is None


async def test_an_edge_waits_until_its_leaving_node_has_left() -> None:
    fake = edge(view(1, members=("n1", "n2")))
    later = [view(2, members=("n1", "n2"), leaving=("n2",)), view(3, members=("n1",))]
    assert await follow(fake, timeout_s=5, notice_s=0.4, later=later) is True
    assert fake.router.view.epoch == 3


async def test_a_leave_that_does_not_finish_in_time_is_reported() -> None:
    fake = edge(view(1, members=("n1", "n2"), leaving=("n2",)))
    assert await follow(fake, timeout_s=0.3, notice_s=0.1, later=[]) is False


async def test_a_node_that_left_already_stops_at_once() -> None:
    fake = edge(view(5, members=("n1",)))
    assert await follow(fake, timeout_s=5, notice_s=5, later=[]) is True
