"""The edge's connection timers on one heap (services/edge/deadlines.py): owners ticked at their
deadlines in order, a replaced or cancelled deadline never ticks, closed connections are not
held until their deadline, and, through real connections on the loop, the CONNECT timeout and
the keepalive still end quiet clients while talking ones stay."""

from __future__ import annotations

import asyncio
import random

import pytest

from hexmq.mqtt import Connect, PingReq
from services.edge.deadlines import Deadline, Deadlines, LoopDeadlines
from services.edge.server import Edge
from tests.support.edge_harness import Client, Clock, client_id_in, make_edge, ok, taken, up


def test_owners_come_due_in_deadline_order_and_only_once() -> None:
    d: Deadlines[str] = Deadlines()
    d.set("b", 2.0, None)
    d.set("a", 1.0, None)
    d.set("c", 3.0, None)
    assert d.next_at() == 1.0
    assert d.pop_due(0.5) == []
    assert d.pop_due(2.0) == ["a", "b"]
    assert d.pop_due(2.5) == []
    assert d.pop_due(10.0) == ["c"]
    assert len(d) == 0
    assert d.next_at() is None


def test_a_replaced_or_cancelled_deadline_never_comes_due() -> None:
    d: Deadlines[str] = Deadlines()
    first = d.set("a", 1.0, None)
    d.set("a", 5.0, first)  # replaced: due at 5, not 1
    gone = d.set("b", 2.0, None)
    d.cancel(gone)
    d.cancel(gone)  # (twice is harmless)
    assert len(d) == 1
    assert d.pop_due(4.9) == []
    assert d.next_at() == 5.0
    assert d.pop_due(5.0) == ["a"]


def test_a_later_deadline_reuses_the_entry_and_comes_due_only_then() -> None:
    d: Deadlines[str] = Deadlines()
    entry = d.set("a", 10.0, None)  # the CONNECT timeout
    assert d.set("a", 90.0, entry) is entry  # then the keepalive
    assert len(d._heap) == 1
    assert d.pop_due(10.0) == []  # comes to the top, goes back for 90
    assert d.next_at() == 90.0
    assert d.pop_due(89.0) == []
    assert d.pop_due(90.0) == ["a"]
    assert len(d._heap) == 0


def test_equal_deadlines_need_no_comparable_owners() -> None:
    d: Deadlines[object] = Deadlines()
    owners = [object() for _ in range(5)]
    for o in owners:
        d.set(o, 1.0, None)
    assert d.pop_due(1.0) == owners


def test_closed_connections_are_not_held_until_their_deadline() -> None:
    # Connections with a 15-minute keepalive that open and close: the heap keeps about as many
    # removed entries as live ones, not every connection closed in the last 15 minutes.
    d: Deadlines[int] = Deadlines()
    live = {i: d.set(i, 900.0 + i, None) for i in range(100)}
    for i in range(100, 10_100):
        d.cancel(live.pop(i - 100))
        live[i] = d.set(i, 900.0 + i, None)
    assert len(d) == 100
    assert len(d._heap) <= 2 * 100 + 64 + 1
    assert d.pop_due(1e9) == sorted(live)


@pytest.mark.parametrize("seed", range(40))
def test_against_a_model_over_random_operations(seed: int) -> None:
    rng = random.Random(seed)
    d: Deadlines[int] = Deadlines()
    entries: dict[int, Deadline] = {}
    model: dict[int, float] = {}
    now = 0.0
    for _ in range(600):
        owner = rng.randrange(30)
        op = rng.random()
        if op < 0.5:
            at = now + rng.choice([0.0, rng.random() * 5])
            entries[owner] = d.set(owner, at, entries.get(owner))
            model[owner] = at
        elif op < 0.7:
            d.cancel(entries.pop(owner, None))
            model.pop(owner, None)
        else:
            now += rng.random() * 2
            due = d.pop_due(now)
            expected = sorted((at, o) for o, at in model.items() if at <= now)
            # Equal deadlines come in the order they were set; the model sorts by owner there.
            assert sorted((model[o], o) for o in due) == expected
            assert [model[o] for o in due] == sorted(model[o] for o in due)
            for o in due:
                del model[o]
                del entries[o]
        assert len(d) == len(model)
        look = d.next_at()
        if model:
            assert look is not None
            assert look <= min(model.values())
        else:
            assert look is None or d.pop_due(look) == []


async def test_the_loop_timer_ticks_each_owner_at_its_deadline() -> None:
    loop = asyncio.get_running_loop()
    ticked: list[tuple[str, float]] = []
    d: LoopDeadlines[str] = LoopDeadlines(lambda o: ticked.append((o, loop.time())))
    start = loop.time()
    d.set("late", start + 0.12, None)
    d.set("early", start + 0.04, None)
    gone = d.set("cancelled", start + 0.02, None)
    d.cancel(gone)
    await asyncio.sleep(0.2)
    assert [o for o, _ in ticked] == ["early", "late"]
    assert ticked[0][1] >= start + 0.04
    assert ticked[1][1] >= start + 0.12
    d.close()


async def test_a_tick_may_set_the_next_deadline() -> None:
    loop = asyncio.get_running_loop()
    ticks: list[float] = []

    def again(owner: str) -> None:
        ticks.append(loop.time())
        if len(ticks) < 3:
            d.set(owner, loop.time() + 0.02, None)

    d: LoopDeadlines[str] = LoopDeadlines(again)
    d.set("x", loop.time() + 0.02, None)
    await asyncio.sleep(0.15)
    assert len(ticks) == 3
    d.close()


# --- through real connections ----------------------------------------------------------------


@pytest.fixture
def edge() -> Edge:
    edge = make_edge(Clock(), connect_timeout=0.2)
    for link in edge.router.links.values():
        up(link)
    return edge


async def keepalive_client(edge: Edge, name: str, keepalive: int) -> Client:
    client = Client(edge, 4)
    client_id = client_id_in(1, name)
    client.send(Connect(client_id, protocol_version=4, keepalive=keepalive))
    link = edge.router.links[edge.router.master(edge.router.session_partition(client_id))]
    (open_session,) = taken(link)
    ok(link, open_session)
    await client.received()
    return client


async def test_a_socket_that_sends_no_connect_is_closed_at_the_connect_timeout(
    edge: Edge,
) -> None:
    silent = Client(edge, 4)
    await asyncio.sleep(0.1)
    assert not silent.transport.closed
    await asyncio.sleep(0.3)
    assert silent.transport.closed
    assert len(edge.deadlines.deadlines) == 0


async def test_keepalive_ends_the_quiet_client_and_keeps_the_talking_one(edge: Edge) -> None:
    quiet = await keepalive_client(edge, "quiet", 1)
    talking = await keepalive_client(edge, "talking", 1)
    assert len(edge.deadlines.deadlines) == 2
    for _ in range(5):  # 2 s: past 1.5 x the keepalive
        await asyncio.sleep(0.4)
        talking.send(PingReq())
    assert quiet.transport.closed
    assert not talking.transport.closed
    assert len(edge.deadlines.deadlines) == 1
