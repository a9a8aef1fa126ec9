"""The asyncio adapter around the session core (services/edge/connection.py) and the edge's
staged stop (services/edge/server.py), over fake sockets with the edge's real links and
dispatcher, the partition played by hand (tests/support/edge_harness.py): writes coalesced
without a timer, backpressure both ways, and a stop that waits for its clients and answers
within its grace period."""

from __future__ import annotations

import asyncio

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import Disconnect, PingReq, PubAck, Publish
from hexmq.mqtt.reason_codes import ReasonCode
from services.edge.links import HIGH_WATER, LOW_WATER
from services.edge.server import Edge
from tests.support.edge_harness import Clock, client_id_in, connected, make_edge, ok, taken, up


@pytest.fixture
def edge() -> Edge:
    edge = make_edge(Clock(), shutdown_grace=5.0)
    for link in edge.router.links.values():
        up(link)
    return edge


def frame_of_answers(*cmds: pb.EdgeCommand) -> pb.PartitionFrame:
    return pb.PartitionFrame(ok_request_ids=[c.request_id for c in cmds])


async def test_a_lone_packet_leaves_at_once_without_waiting_for_the_loop(edge: Edge) -> None:
    client = await connected(edge, client_id_in(1, "pinger"))
    writes = client.transport.writes
    client.send(PingReq())
    assert client.transport.writes == writes + 1  # no loop turn in between


async def test_the_answers_of_one_link_frame_leave_in_one_write(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    client = await connected(edge, client_id_in(1, "burst"))
    for pid in range(1, 51):
        client.send(Publish("t/x", b"m", qos=1, packet_id=pid))
    publishes = taken(n1)
    assert len(publishes) == 50
    writes = client.transport.writes
    edge.batched(n1._dispatch, frame_of_answers(*publishes))  # as the link's stream does
    assert client.transport.writes == writes + 1
    acks = await client.received()
    assert [(type(p), p.packet_id) for p in acks] == [(PubAck, pid) for pid in range(1, 51)]


async def test_a_congested_link_and_a_full_socket_pause_reading(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    client = await connected(edge, client_id_in(1, "pushy"))
    conn, transport = client.conn, client.transport
    conn.pause_writing()  # the socket's buffer is over its high-water mark
    assert not transport.reading
    conn.resume_writing()
    assert transport.reading
    n1._outgoing.extend(pb.EdgeCommand() for _ in range(HIGH_WATER))  # a backlog
    client.send(Publish("t/x", b"m", qos=1, packet_id=1))
    assert not transport.reading
    conn.pause_writing()
    del n1._outgoing[LOW_WATER:]
    n1._release_waiters()  # (what the stream does once it sent down to LOW_WATER)
    assert not transport.reading  # the socket is still full
    conn.resume_writing()
    assert transport.reading


async def test_a_stop_waits_for_its_clients_and_their_answers(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    client = await connected(edge, client_id_in(1, "stays"))
    client.send(Publish("t/x", b"m", qos=1, packet_id=1))
    (publish,) = taken(n1)
    stopping = asyncio.create_task(edge.stop())
    await asyncio.sleep(0.05)
    (disconnect,) = await client.received()
    assert isinstance(disconnect, Disconnect)
    assert disconnect.reason_code == ReasonCode.SERVER_SHUTTING_DOWN
    assert client.transport.closed
    client.conn.connection_lost(None)  # the socket closes once its writes are out
    (close,) = taken(n1)
    assert close.HasField("close_session")
    await asyncio.sleep(0.05)
    assert not stopping.done()  # the publish and the session's close are still unanswered
    ok(n1, publish, close)
    await asyncio.wait_for(stopping, 1.0)
    assert edge.answers_due == 0


async def test_a_stop_gives_up_after_its_grace_period() -> None:
    edge = make_edge(Clock(), shutdown_grace=0.2)
    for link in edge.router.links.values():
        up(link)
    client = await connected(edge, client_id_in(1, "stuck"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await edge.stop()  # its socket never closes: aborted after 0.2 s
    assert 0.2 <= loop.time() - started < 1.0
    assert client.transport.closed
