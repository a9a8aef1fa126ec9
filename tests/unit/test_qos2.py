"""QoS 2 without processes: a session's outbound states (sent, released, completed) and its
inbound packet ids (services/partition/sessions.py), and the partition node's handling of the
QoS 2 commands over a fake group commit (who is answered what, what is written, and that
nothing leaves before the batch is durable)."""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.effects import Pump
from services.partition.keys import qos2_inbound_key, queue_key
from services.partition.replication import HDEL, HSET
from services.partition.sessions import Claim, LiveConnection, Routed, Session
from tests.support.partition_harness import (
    CountedIds,
    Edge,
    P,
    connect,
    make_node,
    receive,
    routed,
)

IDS = CountedIds()


def message(mid: int, qos: int = 2) -> pb.QueuedMessage:
    qm = pb.QueuedMessage(message_id=mid, qos=qos)
    qm.message.topic = "t"
    qm.message.payload = b"m%d" % mid
    return qm


def live_session(*mids: int, window: int = 10) -> Session:
    session = Session(P, pb.SessionRecord(client_id="c"))
    session.attach(LiveConnection(None, "conn-1", window, ready=True))
    for mid in mids:
        session.enqueue(message(mid))
        session.durable_mid = mid
    return session


# ----- Session: outbound ------------------------------------------------------------------


def test_pubrec_turns_a_qos2_message_into_a_released_stub() -> None:
    session = live_session(1, 2)
    session.enqueue(message(3, qos=1))
    session.durable_mid = 3
    assert [qm.message_id for qm in session.pump()] == [1, 2, 3]
    stubs = session.release([2, 3, 99])  # 3 is QoS 1, 99 unknown: not released
    assert [(s.message_id, s.qos, s.released, s.HasField("message")) for s in stubs] == [
        (2, 2, True, False)
    ]
    assert session.queue[2] is stubs[0]
    assert 2 in session.inflight  # still in flight until PUBCOMP
    # A repeated PUBREC gets the same stub again (PUBREL again).
    assert session.release([2]) == stubs
    # PUBCOMP removes it.
    assert session.acknowledge([2]) == [2]
    assert 2 not in session.queue
    assert 2 not in session.inflight


def test_after_a_reconnect_released_ones_go_as_pubrel_and_the_rest_as_publish_dup() -> None:
    session = live_session(1, 2, 3)
    session.pump()
    session.release([2])
    session.detach(0)
    session.attach(LiveConnection(None, "conn-2", 10, ready=True))
    again = session.pump()
    assert [(qm.message_id, qm.released, qm.dup) for qm in again] == [
        (1, False, True),
        (2, True, False),
        (3, False, True),
    ]
    assert again[0].message.payload == b"m1"


def test_released_messages_count_against_the_window_until_pubcomp() -> None:
    session = live_session(1, 2, window=1)
    assert [qm.message_id for qm in session.pump()] == [1]
    session.release([1])
    assert session.pump() == []  # 1 waits for PUBCOMP
    session.acknowledge([1])
    assert [qm.message_id for qm in session.pump()] == [2]


def test_a_message_loaded_after_a_restart_keeps_its_released_state() -> None:
    session = Session(P, pb.SessionRecord(client_id="c"))
    stored = [pb.QueuedMessage(message_id=5, qos=2, released=True), message(6)]
    for qm in stored:  # as PartitionNode.apply_view loads a queue
        session.queue[qm.message_id] = qm
        session.durable_mid = qm.message_id
        session.ever_sent.add(qm.message_id)
    session.attach(LiveConnection(None, "conn", 10, ready=True))
    assert [(qm.message_id, qm.released, qm.dup) for qm in session.pump()] == [
        (5, True, False),
        (6, False, True),
    ]


# ----- Session: inbound packet ids -------------------------------------------------------


def test_inbound_packet_id_lifecycle() -> None:
    session = Session(P, pb.SessionRecord(client_id="c"))
    assert session.qos2_receive(9, "a", None, IDS) is Claim.NEW
    claim = session.q2in[9]
    assert (claim.routed, claim.connection_id, len(claim.origin)) == (False, "a", 16)
    assert session.qos2_receive(9, "a", "a", IDS) is Claim.IN_PROGRESS
    assert session.qos2_receive(9, "b", "a", IDS) is Claim.WAIT
    assert session.qos2_routed(9, "a", ok=True) is Routed.PUT
    assert session.q2in[9].routed
    for running in (None, "a", "b"):
        assert session.qos2_receive(9, "b", running, IDS) is Claim.DUPLICATE
    assert session.qos2_routed(9, "a", ok=False) is Routed.UNCHANGED  # routed stays routed
    assert session.qos2_release(9) is True
    assert session.qos2_release(9) is False
    assert session.qos2_receive(9, "b", None, IDS) is Claim.NEW  # the packet id is free again


def test_a_failed_routing_drops_only_its_own_claim() -> None:
    session = Session(P, pb.SessionRecord(client_id="c"))
    session.qos2_receive(4, "a", None, IDS)
    # a's attempt ended unreported (say its edge died): b takes the claim over.
    assert session.qos2_receive(4, "b", None, IDS) is Claim.NEW
    assert session.qos2_routed(4, "a", ok=False) is Routed.UNCHANGED
    assert session.q2in[4].connection_id == "b"
    assert session.qos2_routed(4, "b", ok=False) is Routed.DELETED
    assert 4 not in session.q2in
    # Released (a client's early PUBREL) while routing: nothing is recreated.
    session.qos2_receive(5, "b", None, IDS)
    session.qos2_release(5)
    assert session.qos2_routed(5, "b", ok=True) is Routed.UNCHANGED
    assert 5 not in session.q2in


# ----- PartitionNode over a fake group commit --------------------------------------------


def test_node_records_a_packet_id_durably_before_answering() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    connect(edge, "c", "c1")
    commit.durable()
    edge.heard()
    rid = receive(edge, "c", "c1", 42)
    assert edge.heard() == ({}, [])  # nothing before the claim is durable
    commit.durable()
    key = qos2_inbound_key(P, "c")
    assert [op[:3] for _, op in commit.written if op[1] == key] == [(HSET, key, b"42")]
    assert pb.Qos2Inbound.FromString(commit.written[-1][1][3]).connection_id == "c1"
    assert edge.heard()[0][rid].qos2_state == pb.QOS2_STATE_NEW
    routed(edge, "c", "c1", 42)
    commit.durable()
    edge.heard()
    stored = pb.Qos2Inbound.FromString(commit.written[-1][1][3])
    assert stored.routed
    again = receive(edge, "c", "c1", 42)
    commit.durable()
    assert edge.heard()[0][again].qos2_state == pb.QOS2_STATE_DUPLICATE
    release = edge.command(
        "c", qos2_release=pb.Qos2Release(client_id="c", connection_id="c1", packet_id=42)
    )
    commit.durable()
    assert commit.written[-1][1][:3] == (HDEL, key, b"42")
    assert edge.heard()[0][release].qos2_state == pb.QOS2_STATE_RELEASED
    unknown = edge.command(
        "c", qos2_release=pb.Qos2Release(client_id="c", connection_id="c1", packet_id=42)
    )
    commit.durable()
    assert edge.heard()[0][unknown].qos2_state == pb.QOS2_STATE_NOT_FOUND


def test_a_resend_through_another_node_waits_for_the_attempt_still_routing() -> None:
    node, commit = make_node()
    old, new = Edge(node, "e1"), Edge(node, "e2")
    connect(old, "c", "c1")
    receive(old, "c", "c1", 7)
    commit.durable()
    old.heard()
    # The client reconnects through e2 (taking the session over) and resends PUBLISH 7.
    connect(new, "c", "c2")
    rid = receive(new, "c", "c2", 7)
    commit.durable()
    results, _ = new.heard()
    assert rid not in results  # waits: e1's attempt is still routing
    routed(old, "c", "c1", 7)  # e1 reports, though c1 is no longer the live connection
    commit.durable()
    assert old.heard()[0]  # answered
    assert new.heard()[0][rid].qos2_state == pb.QOS2_STATE_DUPLICATE


def test_a_waiter_routes_again_when_the_routing_edge_goes_away() -> None:
    node, commit = make_node()
    old, new = Edge(node, "e1"), Edge(node, "e2")
    connect(old, "c", "c1")
    receive(old, "c", "c1", 7)
    connect(new, "c", "c2")
    rid = receive(new, "c", "c2", 7)
    commit.durable()
    assert rid not in new.heard()[0]
    node.close_link(old.link, node.clock())  # e1 died mid-routing: nobody will report
    commit.durable()
    assert new.heard()[0][rid].qos2_state == pb.QOS2_STATE_NEW
    assert node.sessions["c"].q2in[7].connection_id == "c2"


def test_pubrec_is_made_durable_before_pubrel_goes_out() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    connect(edge, "c", "c1")
    session = node.sessions["c"]
    commit.durable()
    session.enqueue(message(1))
    session.durable_mid = 1
    commit.queue.after(Pump(session))  # (as a release that made it durable would)
    commit.durable()
    _, deliveries = edge.heard()
    assert [qm.message_id for d in deliveries for qm in d.messages] == [1]
    edge.command(
        "c", delivery_ack=pb.DeliveryAck(client_id="c", connection_id="c1", received_ids=[1])
    )
    assert edge.heard()[1] == []  # PUBREL only once the release is durable
    commit.durable()
    assert commit.written[-1] == (
        P,
        (
            HSET,
            queue_key(P, "c"),
            b"1",
            pb.QueuedMessage(message_id=1, qos=2, released=True).SerializeToString(),
        ),
    )
    _, deliveries = edge.heard()
    assert [(qm.message_id, qm.released) for d in deliveries for qm in d.messages] == [(1, True)]
    edge.command(
        "c", delivery_ack=pb.DeliveryAck(client_id="c", connection_id="c1", message_ids=[1])
    )
    commit.durable()
    assert commit.written[-1][1][:3] == (HDEL, queue_key(P, "c"), b"1")
    assert not session.queue
