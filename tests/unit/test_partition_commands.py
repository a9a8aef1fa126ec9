"""The partition's command handlers, driven directly (tests/support/partition_harness.py): a
command in at a given time, and out of it exactly the writes on the batch and the effects it
leaves for when that batch is durable (services/partition/effects.py), then what each edge
hears once they are carried out. The time is the harness's Clock and the ids are counted, so
every run gives the same effects."""

from __future__ import annotations

import logging

import pytest

from hexmq.api.common.v1.common_pb2 import Message
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import THIS_RELEASE
from services.partition.commit_queue import AwaitCompany, Sealed
from services.partition.effects import (
    AfterIndexed,
    ConnectionReady,
    HandOutWills,
    MessageDurable,
    Pump,
    Send,
)
from services.partition.keys import queue_key, sessions_key
from services.partition.replication import HDEL, HSET
from services.partition.takeover import KICK_ACK_BOUND_MS
from tests.support.partition_harness import (
    EPOCH,
    Clock,
    Edge,
    InstantCommit,
    P,
    connect,
    make_node,
    receive,
)

SC = pb.StatusCode


def clock_of(edge: Edge) -> Clock:
    clock = edge.node.clock
    assert isinstance(clock, Clock)
    return clock


def subscribe(edge: Edge, cid: str, conn: str, topic: str, qos: int = 1) -> int:
    return edge.command(
        cid,
        subscribe=pb.Subscribe(
            client_id=cid,
            connection_id=conn,
            subscriptions=[pb.SubscriptionSpec(filter=topic, qos=qos)],
        ),
    )


def test_open_session_stores_the_record_then_accepts_the_connection_once_durable() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    now = clock_of(edge).now
    rid = connect(edge, "c", "e1.1")
    session = node.sessions["c"]
    assert session.record.created_at_ms == now
    assert session.record.created_by == "e1.1"
    # Nothing is heard before the batch is durable: the record is written; the answer goes
    # out, then the connection may be sent its messages.
    assert edge.heard() == ({}, [])
    answer = pb.PartitionEvent(result=pb.Result(request_id=rid, session_present=False))
    assert commit.queue.pending() == [
        Send(edge.link, answer),
        ConnectionReady(session, session.connection),
    ]
    commit.durable()
    assert [(p, op[0], op[1]) for p, op in commit.written] == [(P, HSET, sessions_key(P))]
    results, _ = edge.heard()
    assert results[rid].status == SC.STATUS_CODE_OK
    assert session.connection is not None
    assert session.connection.ready


def test_a_takeover_from_another_edge_kicks_the_old_connection_with_0x8e() -> None:
    node, commit = make_node()
    old, new = Edge(node, "e1"), Edge(node, "e2")
    connect(old, "c", "e1.1")
    commit.durable()
    old.heard()
    rid = connect(new, "c", "e2.1")
    session = node.sessions["c"]
    kick = pb.PartitionEvent(
        kick=pb.Kick(client_id="c", connection_id="e1.1", reason=pb.KICK_REASON_TAKEN_OVER)
    )
    # The kick goes after the commit, as the old connection's own CONNACK did; then the new
    # connection's answer, then its deliveries may flow.
    answer = pb.PartitionEvent(result=pb.Result(request_id=rid, session_present=True))
    assert commit.queue.pending() == [
        Send(old.link, kick),
        Send(new.link, answer),
        ConnectionReady(session, session.connection),
    ]
    assert (session.record.connection_id, session.record.created_by) == ("e2.1", "e1.1")
    commit.durable()
    assert old.events() == [kick]
    results, _ = new.heard()
    assert results[rid].session_present is True


def test_a_takeover_of_a_session_that_ends_with_its_connection_finds_no_session() -> None:
    # Session Expiry 0 (3.1.1: Clean Session 1): the session ends as the takeover closes its
    # connection, so the new connection has none, even with Clean Start 0 (MQTT-3.2.2-1), and
    # the old will goes out now, not after its delay: the session ended first (5.0 3.1.3.2.2).
    node, commit = make_node()
    old, new = Edge(node, "e1"), Edge(node, "e2")
    will = pb.Will(message=Message(topic="w", payload=b"old"), delay_interval_s=30)
    connect(old, "c", "e1.1", session_expiry_s=0, will=will)
    commit.durable()
    old.heard()
    rid = connect(new, "c", "e2.1")
    session = node.sessions["c"]
    assert session.record.created_by == "e2.1"
    assert HandOutWills() in commit.queue.pending()
    commit.durable()
    results, _ = new.heard()
    assert results[rid].session_present is False
    wills = [e.publish_will for e in old.events() + new.events() if e.HasField("publish_will")]
    assert [(w.client_id, w.message.payload) for w in wills] == [("c", b"old")]


def test_a_takeover_of_a_kept_session_cancels_a_delayed_will() -> None:
    # MQTT-3.1.3-9: a new connection to the session before the Will Delay has passed.
    node, commit = make_node()
    old, new = Edge(node, "e1"), Edge(node, "e2")
    will = pb.Will(message=Message(topic="w", payload=b"old"), delay_interval_s=30)
    connect(old, "c", "e1.1", will=will)
    commit.durable()
    old.heard()
    rid = connect(new, "c", "e2.1")
    commit.durable()
    results, _ = new.heard()
    assert results[rid].session_present is True
    node.hand_out_wills(clock_of(new).now + 60_000)
    assert [e for e in old.events() + new.events() if e.HasField("publish_will")] == []


# ----- strict takeover (G5): the new connection's answer waits for the old one's close -----

ACKING = THIS_RELEASE  # an edge of this release: it confirms each Kick once closed (kick-acks)


def kicks_of(edge: Edge) -> list[str]:
    return [e.kick.connection_id for e in edge.events() if e.HasField("kick")]


def taken_over(old: Edge, new: Edge, commit: InstantCommit) -> int:
    """c connected through `old` (as e1.1), then through `new` (as e2.1), both durable: the
    new connection's request id."""
    connect(old, "c", "e1.1")
    commit.durable()
    old.heard()
    rid = connect(new, "c", "e2.1")
    commit.durable()
    return rid


def test_a_takeover_answers_the_new_connection_only_once_the_old_edge_closed_the_old_one() -> None:
    node, commit = make_node()
    old, new = Edge(node, "e1", ACKING), Edge(node, "e2", ACKING)
    rid = taken_over(old, new, commit)
    assert kicks_of(old) == ["e1.1"]
    session = node.sessions["c"]
    assert session.connection is not None
    # Durable, but e1.1 may still be live: no CONNACK for e2.1, and nothing delivered to it.
    assert new.heard() == ({}, [])
    assert not session.connection.ready
    # Only the kicked connection's own edge can say it is closed.
    new.kicked("c", "e1.1")
    old.kicked("c", "e1.9")
    assert new.heard() == ({}, [])
    old.kicked("c", "e1.1")
    results, _ = new.heard()
    assert results[rid].status == SC.STATUS_CODE_OK
    assert results[rid].session_present is True
    assert session.connection.ready


def test_a_held_takeover_is_answered_when_the_old_edge_unlinks() -> None:
    # Its connections are no longer served through this master (one still open finds its
    # session taken over when it re-attaches).
    node, commit = make_node()
    old, new = Edge(node, "e1", ACKING), Edge(node, "e2", ACKING)
    rid = taken_over(old, new, commit)
    assert new.heard() == ({}, [])
    old.unlink()
    results, _ = new.heard()
    assert results[rid].status == SC.STATUS_CODE_OK


def test_a_held_takeover_is_answered_at_the_bound_by_the_clock_given(
    caplog: pytest.LogCaptureFixture,
) -> None:
    node, commit = make_node()
    old, new = Edge(node, "e1", ACKING), Edge(node, "e2", ACKING)
    start = clock_of(new).now
    rid = taken_over(old, new, commit)
    assert node.settle_takeovers(start + KICK_ACK_BOUND_MS - 1) == 1
    assert new.heard() == ({}, [])
    with caplog.at_level(logging.WARNING, logger="services.partition.takeover"):
        assert node.settle_takeovers(start + KICK_ACK_BOUND_MS) == 0
    results, _ = new.heard()
    assert results[rid].status == SC.STATUS_CODE_OK
    assert "did not confirm closing connection e1.1 within 2000 ms" in caplog.text
    old.kicked("c", "e1.1")  # late: nothing more to answer
    assert new.heard() == ({}, [])


def test_a_takeover_waits_only_for_an_edge_that_confirms_kicks() -> None:
    # An edge of the previous release never confirms: its kick and the new answer go out
    # together, as before. The same node waits for an edge of this release.
    node, commit = make_node()
    legacy, old, new = Edge(node, "e0"), Edge(node, "e1", ACKING), Edge(node, "e2", ACKING)
    connect(legacy, "c", "e0.1")
    commit.durable()
    first = connect(old, "c", "e1.1")
    commit.durable()
    (legacy_kick,) = [e.kick for e in legacy.events() if e.HasField("kick")]
    assert (legacy_kick.connection_id, legacy_kick.confirm) == ("e0.1", False)  # not asked
    assert old.heard()[0][first].status == SC.STATUS_CODE_OK
    second = connect(new, "c", "e2.1")
    commit.durable()
    (kick,) = [e.kick for e in old.events() if e.HasField("kick")]
    assert (kick.connection_id, kick.confirm) == ("e1.1", True)  # asked to confirm the close
    assert new.heard() == ({}, [])
    old.kicked("c", "e1.1")
    assert new.heard()[0][second].status == SC.STATUS_CODE_OK


def test_a_connection_taken_over_while_its_answer_is_held_is_refused_not_kicked() -> None:
    # c on e1, then e2 (held: e1.1 not closed yet), then e3: e2.1 was never accepted, so it
    # gets no Kick (no DISCONNECT before a CONNACK) but TAKEN_OVER; e3.1 waits for e1.1 too.
    node, commit = make_node()
    old, mid, new = Edge(node, "e1", ACKING), Edge(node, "e2", ACKING), Edge(node, "e3", ACKING)
    refused = taken_over(old, mid, commit)
    rid = connect(new, "c", "e3.1")
    commit.durable()
    (answer,) = mid.events()  # no Kick
    assert answer.result.request_id == refused
    assert answer.result.status == SC.STATUS_CODE_TAKEN_OVER
    assert new.heard() == ({}, [])
    old.kicked("c", "e1.1")
    results, _ = new.heard()
    assert results[rid].status == SC.STATUS_CODE_OK
    assert results[rid].session_present is True
    assert mid.heard() == ({}, [])


def test_a_qos1_publish_is_queued_durably_and_delivered_once_durable() -> None:
    node, commit = make_node()
    sub, pub = Edge(node, "e1"), Edge(node, "e2")
    connect(sub, "s", "e1.1")
    suback = subscribe(sub, "s", "e1.1", "t/#")
    # A filter new to the edges' index: the SUBACK waits until every edge routes by it.
    seq = node.state.index.barrier.seq
    (*_, after_indexed) = commit.queue.pending()
    assert after_indexed == AfterIndexed(
        sub.link,
        pb.PartitionEvent(
            result=pb.Result(
                request_id=suback,
                filter_outcomes=[pb.FILTER_OUTCOME_GRANTED_QOS_1],
                existed=[False],
            )
        ),
        seq,
    )
    for edge in (sub, pub):
        edge.handle(pb.EdgeCommand(index_ack=pb.IndexAck(seq=seq)))
    commit.durable()
    sub.heard()
    written = len(commit.written)
    rid = pub.command(
        "p",
        command_id=1,
        publish=pb.Publish(
            message=Message(topic="t/1", payload=b"m", qos=1, publisher_id="p"),
            targets=[pb.PartitionTarget(partition=P, epoch=EPOCH)],
        ),
    )
    session = node.sessions["s"]
    assert commit.queue.pending() == [MessageDurable(session, 1)]
    assert sub.heard() == ({}, [])  # not before it is durable
    commit.durable()
    assert [(op[0], op[1], op[2]) for _, op in commit.written[written:]] == [
        (HSET, queue_key(P, "s"), b"1"),
        (HSET, sessions_key(P), b"s"),  # (its next message id)
    ]
    results, _ = pub.heard()
    assert results[rid].status == SC.STATUS_CODE_OK
    _, deliveries = sub.heard()
    assert [
        (d.client_id, [(qm.message_id, qm.message.payload) for qm in d.messages])
        for d in deliveries
    ] == [("s", [(1, b"m")])]
    # The acknowledgement deletes it.
    sub.command(
        "s", delivery_ack=pb.DeliveryAck(client_id="s", connection_id="e1.1", message_ids=[1])
    )
    commit.durable()
    assert commit.written[-1][1][:3] == (HDEL, queue_key(P, "s"), b"1")
    assert not session.queue


def delivered(edge: Edge, commit: InstantCommit, cid: str, *qos: int) -> list[int]:
    """Messages of these QoS queued durably for `cid` (connected through `edge`) and delivered
    to it; their ids."""
    session = edge.node.sessions[cid]
    for qs in qos:
        qm = pb.QueuedMessage(message_id=session.next_message_id(), qos=qs)
        qm.message.topic, qm.message.payload = "t", b"m"
        session.enqueue(qm)
        session.durable_mid = qm.message_id
    commit.queue.after(Pump(session))  # (as a release that made them durable would)
    commit.durable()
    _, deliveries = edge.heard()
    return [qm.message_id for d in deliveries for qm in d.messages]


def test_a_qos1_acknowledgement_is_removed_with_the_next_write_not_on_its_own() -> None:
    """Issue 28: a QoS 1 message's removal waits for the next write up to the removal linger,
    even with no lazy linger, and leaves with it; its answer is released with that batch."""
    node, commit = make_node()
    sub, pub = Edge(node, "e1"), Edge(node, "e2")
    connect(sub, "s", "e1.1")
    commit.durable()
    assert delivered(sub, commit, "s", 1, 1) == [1, 2]
    ack = sub.command(
        "s", delivery_ack=pb.DeliveryAck(client_id="s", connection_id="e1.1", message_ids=[1, 2])
    )
    assert not node.sessions["s"].queue  # the window has room at once
    assert isinstance(commit.queue.next(100.0, 0.0, 0.1), AwaitCompany)
    assert sub.heard() == ({}, [])
    written = len(commit.written)
    rid = pub.command("p", close_session=pb.CloseSession(client_id="p", connection_id="e2.1"))
    assert commit.queue.company
    commit.durable()
    assert [(op[0], op[1]) for _, op in commit.written[written:]][:1] == [(HDEL, queue_key(P, "s"))]
    assert ack in sub.heard()[0]
    assert rid in pub.heard()[0]


def test_a_qos2_completion_or_a_pubrec_is_not_deferred() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    connect(edge, "s", "e1.1")
    commit.durable()
    assert delivered(edge, commit, "s", 2, 1) == [1, 2]
    edge.command(
        "s", delivery_ack=pb.DeliveryAck(client_id="s", connection_id="e1.1", received_ids=[1])
    )
    assert isinstance(commit.queue.next(100.0, 0.0, 0.1), Sealed)  # a PUBREL waits on it
    commit.durable()
    edge.heard()
    # PUBCOMP of the QoS 2 one with the PUBACK of the QoS 1 one: the lazy linger only (0).
    edge.command(
        "s",
        delivery_ack=pb.DeliveryAck(client_id="s", connection_id="e1.1", message_ids=[1, 2]),
    )
    step = commit.queue.next(101.0, 0.0, 0.1)
    assert isinstance(step, Sealed)
    assert step.lazy


def test_a_lost_connection_makes_its_will_due_after_the_delay_by_the_clock() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    clock = clock_of(edge)
    will = pb.Will(message=Message(topic="w", payload=b"gone", qos=1), delay_interval_s=10)
    connect(edge, "c", "e1.1", will=will)
    commit.durable()
    edge.heard()
    edge.command(
        "c", close_session=pb.CloseSession(client_id="c", connection_id="e1.1", graceful=False)
    )
    lost_at = clock.now
    assert node.sessions["c"].record.will_due_at_ms == lost_at + 10_000
    commit.durable()
    edge.heard()
    node.hand_out_wills(lost_at + 9_999)
    assert edge.events() == []
    clock.advance(10_000)
    node.hand_out_wills(clock.now)
    (event,) = edge.events()
    assert (event.publish_will.client_id, event.publish_will.message.payload) == ("c", b"gone")
    assert event.publish_will.message.published_at_ms == clock.now


def test_a_will_with_no_delay_is_handed_out_once_the_close_is_durable() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    connect(edge, "c", "e1.1", will=pb.Will(message=Message(topic="w", payload=b"x")))
    commit.durable()
    edge.heard()
    edge.command(
        "c", close_session=pb.CloseSession(client_id="c", connection_id="e1.1", graceful=False)
    )
    assert HandOutWills() in commit.queue.pending()
    assert [e for e in edge.events() if e.HasField("publish_will")] == []
    commit.durable()
    assert [e.publish_will.client_id for e in edge.events() if e.HasField("publish_will")] == ["c"]


def test_a_session_expires_by_the_clock_it_is_given() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    clock = clock_of(edge)
    edge.command(
        "c", open_session=pb.OpenSession(client_id="c", connection_id="e1.1", session_expiry_s=60)
    )
    edge.command(
        "c", close_session=pb.CloseSession(client_id="c", connection_id="e1.1", graceful=True)
    )
    commit.durable()
    closed_at = clock.now
    assert node.expire_sessions(closed_at + 59_999) == 0
    assert node.expire_sessions(closed_at + 60_000) == 1
    assert "c" not in node.sessions


def test_qos2_claims_carry_origin_ids_from_the_injected_source() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    connect(edge, "c", "e1.1")
    commit.durable()
    edge.heard()
    first, second = receive(edge, "c", "e1.1", 1), receive(edge, "c", "e1.1", 2)
    commit.durable()
    results, _ = edge.heard()
    assert [results[r].qos2_origin for r in (first, second)] == [
        b"origin:000000001",
        b"origin:000000002",
    ]


def test_what_goes_at_once_goes_once_when_carrying_it_out_sends_more() -> None:
    """The outbox is carried out in order, and a send that carrying out an effect adds (an
    index barrier nobody waits on releases at once) goes after it, each event once."""
    node, _ = make_node()
    edge = Edge(node, "e1")
    first, second = (
        pb.PartitionEvent(result=pb.Result(request_id=rid, status=SC.STATUS_CODE_UNAVAILABLE))
        for rid in (1, 2)
    )
    node.state.outbox.extend([Send(edge.link, first), AfterIndexed(edge.link, second, 0)])
    node.hand_out_wills(clock_of(edge).now)
    assert edge.events() == [first, second]
