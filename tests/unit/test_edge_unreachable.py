"""A live connection whose session cannot reach its master is not left waiting silently (issue
30, DESIGN.md G9): services/edge/unreachable.py decides which connections waited too long (a
fake clock), PartitionCommands.unsettled names the partitions worth looking at, the session
core ends the connection with a reason, and the edge carries it out on its sweep and shows the
waits and the links in its metrics. Without processes (tests/support/edge_harness.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import Disconnect, PubAck, Publish
from hexmq.mqtt.reason_codes import ReasonCode
from services.edge.hold import PartitionCommands
from services.edge.server import Edge
from services.edge.session import actions as act
from services.edge.tickets import Kind, Route, Ticket
from services.edge.unreachable import UnreachableMasters, check_bound, default_bound
from tests.support.edge_harness import (
    HOLD,
    Clock,
    Driver,
    SessionEdge,
    client_id_in,
    connected,
    make_edge,
    ok,
    taken,
    up,
    view,
)

RC = ReasonCode
SC = pb.StatusCode
BOUND = 3 * HOLD
# The session of "c1" lives in partition 6 (tests/support/edge_harness.py: 8 partitions).
P = 6


# ----- which connections waited too long (pure) ---------------------------------------------


def test_a_wait_counts_from_the_first_sweep_that_saw_it_and_ends_at_the_bound() -> None:
    waits: UnreachableMasters[str] = UnreachableMasters(30.0)
    assert waits.sweep(100.0, {"a": 1}) == []
    assert waits.sweep(110.0, {"a": 1, "b": 2}) == []
    assert len(waits) == 2
    assert waits.longest(110.0) == 10.0
    assert waits.sweep(129.9, {"a": 1, "b": 2}) == []
    assert waits.sweep(130.0, {"a": 1, "b": 2}) == [("a", 1, 30.0)]
    assert len(waits) == 1  # ended ones are forgotten
    assert waits.sweep(145.0, {"b": 2}) == [("b", 2, 35.0)]
    assert len(waits) == 0


def test_a_connection_that_stopped_waiting_starts_afresh_next_time() -> None:
    waits: UnreachableMasters[str] = UnreachableMasters(30.0)
    waits.sweep(0.0, {"a": 1})
    waits.sweep(29.0, {})  # re-attached in time
    assert len(waits) == 0
    assert waits.sweep(31.0, {"a": 1}) == []  # a new wait, from now
    assert waits.sweep(60.9, {"a": 1}) == []
    assert waits.sweep(61.0, {"a": 1}) == [("a", 1, 30.0)]


def test_the_oldest_waits_end_first_and_a_bound_of_0_ends_none() -> None:
    waits: UnreachableMasters[str] = UnreachableMasters(10.0)
    waits.sweep(5.0, {"z": 3})
    waits.sweep(6.0, {"z": 3, "a": 4})
    assert [k for k, _, _ in waits.sweep(20.0, {"z": 3, "a": 4})] == ["z", "a"]
    never: UnreachableMasters[str] = UnreachableMasters(0.0)
    never.sweep(0.0, {"a": 1})
    assert never.sweep(1e6, {"a": 1}) == []
    assert len(never) == 1  # still counted (the metric shows it)


def test_the_bound_is_0_or_at_least_the_failover_hold() -> None:
    assert default_bound(10.0) == 30.0
    assert default_bound(20.0) == 60.0
    assert default_bound(1.0) == 30.0  # a short hold refuses publishes soon, no more
    check_bound(0.0, 10.0)
    check_bound(10.0, 10.0)
    with pytest.raises(ValueError, match=r"at least --failover-hold \(10 s\), not 5"):
        check_bound(5.0, 10.0)
    with pytest.raises(ValueError, match="0 \\(never\\) or more"):
        UnreachableMasters(-1.0)


@pytest.mark.parametrize(
    ("args", "env"),
    [(["--unreachable-disconnect=5"], {}), ([], {"HEXMQ_UNREACHABLE_DISCONNECT": "-1"})],
)
def test_the_edge_refuses_a_bound_under_the_hold_naming_it(
    args: list[str], env: dict[str, str]
) -> None:
    hexmq = Path(sys.executable).with_name("hexmq")
    argv = [str(hexmq), "edge", "--node-id", "n1", "--listen", "127.0.0.1:1"]
    argv += ["--membership", "127.0.0.1:2", *args]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=os.environ | env
    )
    assert done.returncode == 2
    assert "--unreachable-disconnect must be 0 (never) or at least --failover-hold" in done.stderr


# ----- which partitions to look at (pure) ---------------------------------------------------


def test_unsettled_partitions_are_those_without_a_route_holding_or_re_attaching() -> None:
    core = PartitionCommands(HOLD)
    core.set_view(view(1, {3: ("n2", 1)}))  # 8 partitions, 3 on n2, the rest on n1
    assert core.unsettled() == set(range(8))  # no link up yet
    core.link_up("n1", 1)
    assert core.unsettled() == {3}
    attach = Ticket(Kind.ATTACH, (5,), pb.EdgeCommand(attach_session=pb.AttachSession()), None)
    core.submit(attach, 0.0)  # in flight to n1
    assert core.unsettled() == {3, 5}
    core.answered(attach, attach.attempt, pb.Result(), 0.0)
    assert core.unsettled() == {3}
    core.link_up("n2", 1)
    assert core.unsettled() == set()
    core.saw_epoch(2, 5)  # an index update showed partition 2 moving on
    assert core.unsettled() == {2}
    assert "moving to a new master" in core.why(2, 0.0)


# ----- the session core ---------------------------------------------------------------------


def test_a_session_waits_while_not_attached_at_its_partitions_route() -> None:
    edge = SessionEdge.make()
    client = Driver(edge)
    assert not client.session.waits_for_master()  # not connected
    client.connect("c1")
    assert not client.session.waits_for_master()
    edge.routes[P] = Route("n2", 2, 1)  # moved: its re-attach is owed
    assert client.session.waits_for_master()
    _, sent = client.session.reattach()
    assert client.session.waits_for_master()  # until answered
    client.answer(sent, route=Route("n2", 2, 1))
    assert not client.session.waits_for_master()


def test_a_session_past_the_bound_gets_disconnect_0x89_with_why_and_3_1_1_a_close() -> None:
    why = "partition 6 of this session had no reachable master for 31 s: the link is down"
    for version in (5, 4):
        edge = SessionEdge.make()
        client = Driver(edge)
        client.connect("c1", version)
        ended = client.session.master_unreachable(why)
        close = ended[-1]
        assert isinstance(close, act.Close)
        assert close.reason_code == RC.SERVER_BUSY
        ((_, command),) = _commands(ended)
        assert command.close_session.graceful is False  # a lost connection to its session
        packets = client.packets(ended)
        if version == 5:
            assert packets == [Disconnect(RC.SERVER_BUSY, packets[0].properties)]
            assert packets[0].properties.reason_string == why
        else:
            assert packets == []
        assert client.session.master_unreachable(why) == []  # once


def _commands(actions: list[act.Action]) -> list[tuple[int, pb.EdgeCommand]]:
    return [(a.partition, a.command) for a in actions if isinstance(a, act.Request)]


# ----- the edge: its sweep and metrics ------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _edge(clock: Clock, **overrides: object) -> Edge:
    edge = make_edge(clock, **({"unreachable_disconnect": BOUND} | overrides))
    for link in edge.router.links.values():
        up(link)
    return edge


def _sample(name: str, **labels: str) -> float | None:
    return telemetry.METRICS.registry.get_sample_value(name, labels or None)


async def test_a_connection_whose_master_stays_unreachable_is_ended_past_the_bound(
    clock: Clock,
) -> None:
    edge = _edge(clock)
    n1 = edge.router.links["n1"]
    waiting = await connected(edge, client_id_in(1, "waits"))
    other = await connected(edge, client_id_in(2, "waits-too"), version=4)
    fine = await connected(edge, client_id_in(5, "fine"))
    edge.apply_view(view(2, {5: ("n2", 2)}))  # partition 5 moves to n2: re-attached there
    (attach,) = taken(edge.router.links["n2"])
    ok(edge.router.links["n2"], attach)
    before = _sample("hexmq_unreachable_disconnects_total") or 0.0
    n1._fail("Connection timed out")  # the link to n1 is gone: partitions 1 and 2 wait
    edge.sweep()
    assert _sample("hexmq_sessions_waiting_for_master") == 2
    assert _sample("hexmq_links_down", link="edge", peer="n1") == 1
    assert _sample("hexmq_links_down", link="edge", peer="n2") == 0
    clock.now += BOUND - 0.5
    edge.sweep()
    assert not waiting.transport.closed
    clock.now += 0.5
    edge.sweep()
    (disconnect,) = await waiting.received()
    assert isinstance(disconnect, Disconnect)
    assert disconnect.reason_code == RC.SERVER_BUSY
    why = disconnect.properties.reason_string
    assert why is not None
    assert why.startswith(f"partition 1 of this session had no reachable master for {BOUND:.0f}")
    assert "the link to its master n1 is down" in why
    assert waiting.transport.closed
    assert other.transport.closed  # 3.1.1: a close
    assert not fine.transport.closed
    assert _sample("hexmq_unreachable_disconnects_total") == before + 2
    assert _sample("hexmq_sessions_waiting_for_master") == 0


async def test_a_connection_re_attached_within_the_bound_stays(clock: Clock) -> None:
    edge = _edge(clock)
    n1 = edge.router.links["n1"]
    pub = await connected(edge, client_id_in(1, "stays"))
    n1._fail("Connection timed out")
    edge.sweep()
    clock.now += BOUND - 1
    edge.sweep()
    up(n1)  # back: the re-attach goes, and is answered
    (attach,) = taken(n1)
    assert attach.HasField("attach_session")
    ok(n1, attach)
    edge.sweep()
    assert _sample("hexmq_sessions_waiting_for_master") == 0
    assert _sample("hexmq_links_down", link="edge", peer="n1") == 0
    clock.now += BOUND
    edge.sweep()
    assert not pub.transport.closed
    pub.send(Publish("t/x", b"m", qos=1, packet_id=1))
    ok(n1, *taken(n1))
    assert [(type(p), p.reason_code) for p in await pub.received()] == [(PubAck, 0)]


async def test_a_re_attach_its_master_never_takes_ends_the_connection_too(clock: Clock) -> None:
    """The edge of the issue: its view behind, its link up again, but the partition moving to
    an epoch the view does not have: the re-attach is held, refused at the failover hold,
    held again, and the client would have waited for ever."""
    edge = _edge(clock)
    n1 = edge.router.links["n1"]
    sub = await connected(edge, client_id_in(1, "behind"))
    n1._fail("Connection timed out")
    up(n1)  # back, but the view stays at epoch 1
    (attach,) = taken(n1)
    ok(n1, attach, status=SC.STATUS_CODE_STALE_EPOCH, current_epoch=2)
    for _ in range(int(BOUND / HOLD) + 1):
        clock.now += HOLD
        edge.dispatcher._tick()
        edge.sweep()
    (disconnect,) = await sub.received()
    assert isinstance(disconnect, Disconnect)
    assert disconnect.reason_code == RC.SERVER_BUSY
    assert "moving to a new master" in (disconnect.properties.reason_string or "")


async def test_with_a_bound_of_0_connections_wait_as_long_as_it_takes(clock: Clock) -> None:
    edge = _edge(clock, unreachable_disconnect=0.0)
    sub = await connected(edge, client_id_in(1, "patient"))
    edge.router.links["n1"]._fail("Connection timed out")
    edge.sweep()
    clock.now += 3600
    edge.sweep()
    assert not sub.transport.closed
    assert _sample("hexmq_sessions_waiting_for_master") == 1
