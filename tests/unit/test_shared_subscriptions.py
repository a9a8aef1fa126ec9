"""Shared subscriptions without processes: the edge's choice of one partition per group and
message (services/edge/router.py), the partition's choice of one member (services/partition/
shared.py), and which shared filters are valid."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt.errors import TopicFilterInvalid
from hexmq.mqtt.reason_codes import ReasonCode
from hexmq.topics import validate_topic_filter
from services.edge import retained
from services.edge.router import Router
from services.partition.keys import queue_key
from services.partition.node import PartitionNode
from services.partition.redelivery import movable
from services.partition.replication import HDEL, HSET
from services.partition.sessions import LiveConnection, Session
from services.partition.shared import SharedGroups
from tests.support.edge_harness import alternating_master as master
from tests.support.edge_harness import alternating_router as make_router
from tests.support.edge_harness import announce
from tests.support.partition_harness import EPOCH, Edge, InstantCommit, P, connect, make_node

PARTITIONS = 8
NODES = ("n1", "n2")


def plan(router: Router, topic: str) -> dict[int, tuple[str, ...]]:
    """partition -> shared groups it serves, for one message; checks the node grouping."""
    route = router.route_publish(topic)
    assert not route.shared
    out: dict[int, tuple[str, ...]] = {}
    for node, targets in route.targets:
        for t in targets:
            assert master(t.partition) == node
            assert t.epoch == 10 + t.partition
            assert t.partition not in out
            out[t.partition] = tuple(t.shared)
    return out


def test_no_shared_groups_keeps_the_cached_route() -> None:
    router = make_router()
    announce(router, 1, "a/+")
    first = router.route_publish("a/b")
    assert router.route_publish("a/b") is first
    assert plan(router, "a/b") == {1: ()}


def test_each_message_goes_to_one_partition_per_group_in_turn() -> None:
    router = make_router()
    group = "$share/g/a/#"
    for p in (1, 2, 3):
        announce(router, p, group)
    announce(router, 2, "a/b")  # a non-shared subscriber in one of them
    seen: Counter[int] = Counter()
    for _ in range(300):
        targets = plan(router, "a/b")
        picked = [p for p, groups in targets.items() if groups]
        assert len(picked) == 1
        assert targets[picked[0]] == (group,)
        assert 2 in targets  # the non-shared subscriber's partition, every time
        seen[picked[0]] += 1
    assert seen == {1: 100, 2: 100, 3: 100}  # round robin: the cached route does not pin it


def test_groups_are_placed_independently_and_by_inner_filter() -> None:
    router = make_router()
    announce(router, 1, "$share/g/a/+")
    announce(router, 2, "$share/h/a/+")
    announce(router, 3, "$share/g/x/#")
    assert plan(router, "a/b") == {1: ("$share/g/a/+",), 2: ("$share/h/a/+",)}
    assert plan(router, "x") == {3: ("$share/g/x/#",)}
    assert plan(router, "b/b") == {}
    assert plan(router, "$SYS/a") == {}
    announce(router, 1, "$share/h/a/+")  # both groups may land on one partition
    placed = [plan(router, "a/b") for _ in range(4)]
    assert {1: ("$share/g/a/+", "$share/h/a/+")} in placed


def test_online_members_first_then_reachable_masters() -> None:
    router = make_router()
    group = "$share/g/t"
    announce(router, 1, group, online=False)
    announce(router, 2, group, online=True)
    announce(router, 4, group, online=True)
    assert Counter(next(iter(plan(router, "t"))) for _ in range(10)) == {2: 5, 4: 5}
    # Every member offline: still one partition each time (it queues for an offline member).
    announce(router, 2, group, online=False)
    announce(router, 4, group, online=False)
    assert Counter(next(iter(plan(router, "t"))) for _ in range(9)) == {1: 3, 2: 3, 4: 3}
    # The last member in partition 4 leaves.
    announce(router, 4, group, present=False)
    assert {next(iter(plan(router, "t"))) for _ in range(4)} == {1, 2}


def test_partitions_that_take_no_commands_are_avoided() -> None:
    router = make_router(up=("n1",))  # n2 masters the odd partitions
    group = "$share/g/t"
    for p in (1, 2, 4):
        announce(router, p, group)
    assert {next(iter(plan(router, "t"))) for _ in range(10)} == {2, 4}
    router.up.discard("n1")  # every master down: held
    assert len(plan(router, "t")) == 1


def test_a_node_snapshot_without_its_group_members_drops_them() -> None:
    router = make_router()
    announce(router, 1, "$share/g/t")
    announce(router, 2, "$share/g/t")
    router.apply_index_update("n2", pb.IndexUpdate(reset=True, snapshot_done=True))
    assert {next(iter(plan(router, "t"))) for _ in range(4)} == {2}


# ----- the partition's choice of member ---------------------------------------------------------


def session(cid: str, p: int = 3, *, online: bool = True) -> Session:
    s = Session(p, pb.SessionRecord(client_id=cid))
    if online:
        s.attach(LiveConnection(link=None, connection_id=f"c-{cid}", receive_maximum=10))
    return s


def entries(*items: pb.IndexEntry | None) -> list[tuple[Any, ...]]:
    return [(e.partition, e.filter, e.present, e.online) if e else None for e in items]


def test_members_take_turns_online_first() -> None:
    groups = SharedGroups()
    g = "$share/g/t"
    a, b, c = session("a"), session("b", online=False), session("c")
    assert entries(groups.join(a, g)) == [(3, g, True, True)]  # the partition now has the group
    assert groups.join(b, g) is None
    assert groups.join(c, g) is None
    picks = [groups.pick(3, g) for _ in range(6)]
    assert [s.client_id for s in picks if s] == ["a", "c"] * 3
    a.detach(0)
    assert groups.presence(a) == []  # c is still online
    assert {s.client_id for s in (groups.pick(3, g) for _ in range(4)) if s} == {"c"}
    c.detach(0)
    assert entries(*groups.presence(c)) == [(3, g, True, False)]
    # All offline: still one member per message, in turn (its session queues it).
    assert Counter(s.client_id for s in (groups.pick(3, g) for _ in range(9)) if s) == {
        "a": 3,
        "b": 3,
        "c": 3,
    }
    b.attach(LiveConnection(link=None, connection_id="c-b2", receive_maximum=10))
    assert entries(*groups.presence(b)) == [(3, g, True, True)]
    assert groups.pick(3, g) is b
    assert groups.pick(4, g) is None  # no member in partition 4


def test_leaving_groups() -> None:
    groups = SharedGroups()
    g, h = "$share/g/t", "$share/h/t"
    a, b = session("a"), session("b", online=False)
    groups.join(a, g)
    groups.join(a, h)
    groups.join(b, g)
    assert a.shared == {g, h}
    assert entries(groups.leave(a, g)) == [(3, g, True, False)]  # only b, offline, is left
    assert groups.leave(a, g) is None
    assert entries(groups.leave(b, g)) == [(3, g, False, False)]
    assert groups.pick(3, g) is None
    assert entries(*groups.entries()) == [(3, h, True, True)]


# ----- validation and retained messages -----------------------------------------------------


@pytest.mark.parametrize("bad", ["$share//t", "$share/g", "$share/g/", "$share/g+/t", "$share/#/t"])
def test_invalid_share_names_are_topic_filter_invalid(bad: str) -> None:
    with pytest.raises(TopicFilterInvalid) as info:
        validate_topic_filter(bad)
    assert info.value.reason_code == ReasonCode.TOPIC_FILTER_INVALID


def test_no_retained_messages_for_shared_subscriptions() -> None:
    specs = [pb.SubscriptionSpec(filter="$share/g/a"), pb.SubscriptionSpec(filter="a")]
    assert [s.filter for s, _ in retained.wanted(specs, [1, 1], [False, False])] == ["a"]


# ----- redelivery: a member's messages go to another member --------------------------------


def test_the_handoff_candidate_is_another_partition_online_members_first() -> None:
    router = make_router()
    group = "$share/g/t"
    assert router.shared_candidate(group, exclude=1) is None
    announce(router, 1, group)
    assert router.shared_candidate(group, exclude=1) is None  # only the member's own partition
    announce(router, 2, group, online=False)
    announce(router, 4, group, online=True)
    picks = [router.shared_candidate(group, exclude=1) for _ in range(3)]
    assert [(c.partition, c.online, c.epoch) for c in picks if c] == [(4, True, 14)] * 3
    announce(router, 4, group, present=False)
    only = router.shared_candidate(group, exclude=1)
    assert only is not None
    assert (only.partition, only.online) == (2, False)


G = "$share/g/t"


def queued(mid: int, qos: int, group: str = G) -> pb.QueuedMessage:
    qm = pb.QueuedMessage(message_id=mid, qos=qos, shared_group=group)
    qm.message.topic = "t"
    qm.message.payload = b"m%d" % mid
    qm.message.qos = qos
    return qm


def test_movable_messages_are_the_groups_alone_and_no_qos2_begun() -> None:
    a = session("a")
    for qm in (
        queued(1, 1),
        queued(2, 2),
        queued(3, 1, group=""),  # also matched a non-shared subscription: a's own
        queued(4, 2),
        queued(5, 1, group="$share/h/t"),
        queued(6, 2),
        queued(7, 1),
    ):
        a.enqueue(qm)
    a.durable_mid = 7
    a.connection.receive_maximum = 4
    a.connection.ready = True
    assert [qm.message_id for qm in a.pump()] == [1, 2, 3, 4]  # 5, 6, 7 never sent
    a.release([4])  # PUBREC: a released stub
    a.handing.add(7)
    assert movable(a) == {
        "$share/g/t": [1, 6],  # QoS 1 sent or not; QoS 2 never sent (2 sent, 4 released)
        "$share/h/t": [5],
    }


def test_deliveries_wait_at_a_message_being_handed_over() -> None:
    a = session("a")
    for mid in (1, 2, 3):
        a.enqueue(queued(mid, 1))
    a.durable_mid = 3
    a.connection.ready = True
    a.handing.add(2)
    assert [qm.message_id for qm in a.pump()] == [1]
    assert a.pump() == []
    a.acknowledge([2])  # moved: deleted here
    assert a.handing == set()
    assert [qm.message_id for qm in a.pump()] == [3]


def node_and_edge() -> tuple[PartitionNode, InstantCommit, Edge]:
    node, commit = make_node()
    edge = Edge(node, "e1")
    edge.link.index_acked = 1 << 62  # routes by every index update at once: SUBACKs go out
    return node, commit, edge


def join(edge: Edge, cid: str, *, window: int = 10, expiry: int = 600) -> None:
    edge.command(
        cid,
        open_session=pb.OpenSession(
            client_id=cid, connection_id=f"{cid}-1", session_expiry_s=expiry, receive_maximum=window
        ),
    )
    spec = pb.SubscriptionSpec(filter=G, qos=2)
    edge.command(
        cid, subscribe=pb.Subscribe(client_id=cid, connection_id=f"{cid}-1", subscriptions=[spec])
    )


def publish_to_group(edge: Edge, count: int, qos: int, *, groups: tuple[str, ...] = (G,)) -> None:
    for i in range(count):
        msg = pb.Publish(targets=[pb.PartitionTarget(partition=P, epoch=EPOCH, shared=groups)])
        msg.message.topic = "t"
        msg.message.payload = b"p%d" % i
        msg.message.qos = qos
        edge.command("pub", publish=msg)


def lose(edge: Edge, cid: str, **close: Any) -> None:
    edge.command(
        cid, close_session=pb.CloseSession(client_id=cid, connection_id=f"{cid}-1", **close)
    )


def delivered(deliveries: list[pb.Delivery], cid: str) -> list[bytes]:
    return [qm.message.payload for d in deliveries if d.client_id == cid for qm in d.messages]


def handoffs(edge: Edge) -> list[pb.SharedHandoff]:
    return [e.shared_handoff for e in edge.events() if e.HasField("shared_handoff")]


def test_a_lost_members_messages_move_in_one_batch_to_an_online_member_of_its_partition() -> None:
    node, commit, edge = node_and_edge()
    join(edge, "a")
    join(edge, "b")
    commit.durable()
    edge.heard()
    publish_to_group(edge, 4, qos=1)
    commit.durable()
    _, deliveries = edge.heard()
    assert delivered(deliveries, "a") == [b"p0", b"p2"]  # members in turn; a never acks
    assert delivered(deliveries, "b") == [b"p1", b"p3"]
    before = len(commit.written)
    lose(edge, "a")
    commit.durable()
    ops = [
        op[:3]
        for _, op in commit.written[before:]
        if op[0] != HSET or b"sessions" not in op[1].encode()
    ]
    a_key, b_key = queue_key(P, "a"), queue_key(P, "b")
    # One batch: queued at b (its ids 3 and 4) and deleted at a.
    assert (HSET, b_key, b"3") in ops
    assert (HSET, b_key, b"4") in ops
    assert (HDEL, a_key, b"1") in ops
    assert (HDEL, a_key, b"2") in ops
    _, deliveries = edge.heard()
    assert delivered(deliveries, "b") == [b"p0", b"p2"]
    assert node.sessions["a"].queue == {}
    assert handoffs(edge) == []


def test_without_an_online_member_here_an_edge_gets_the_unsent_qos2_and_the_rest_stays() -> None:
    node, commit, edge = node_and_edge()
    join(edge, "a", window=1)
    commit.durable()
    edge.heard()
    publish_to_group(edge, 3, qos=2)
    commit.durable()
    assert delivered(edge.heard()[1], "a") == [b"p0"]  # its window: p1, p2 not sent
    lose(edge, "a")
    commit.durable()
    (handoff,) = handoffs(edge)
    assert (handoff.client_id, handoff.group, handoff.from_partition, handoff.online_only) == (
        "a",
        G,
        P,
        True,
    )
    assert [m.payload for m in handoff.messages] == [b"p1", b"p2"]  # in order; p0 stays with a
    # a comes back before the edge answers: it gets p0 again, and waits at p1.
    connect(edge, "a", "a-2")
    commit.durable()
    assert delivered(edge.heard()[1], "a") == [b"p0"]
    done = pb.SharedHandoffDone(
        client_id="a", handoff_id=handoff.handoff_id, moved=True, online_only=True
    )
    edge.command("a", shared_handoff_done=done)
    commit.durable()
    a_key = queue_key(P, "a")
    assert [op[:3] for _, op in commit.written[-3:] if op[1] == a_key] == [
        (HDEL, a_key, b"2"),
        (HDEL, a_key, b"3"),
    ]
    assert list(node.sessions["a"].queue) == [1]
    assert delivered(edge.heard()[1], "a") == []  # moved: a never gets p1, p2
    edge.command("a", shared_handoff_done=done)  # a repeated answer changes nothing
    commit.durable()
    assert list(node.sessions["a"].queue) == [1]


def lost_member_of_two() -> tuple[PartitionNode, InstantCommit, Edge, pb.SharedHandoff]:
    """a, the group's only member here, got two QoS 1 messages and lost its connection: the
    handoff that asks an edge for an online member elsewhere."""
    node, commit, edge = node_and_edge()
    join(edge, "a")
    commit.durable()
    publish_to_group(edge, 2, qos=1)
    commit.durable()
    edge.heard()
    lose(edge, "a")
    commit.durable()
    (handoff,) = handoffs(edge)
    assert handoff.online_only
    return node, commit, edge, handoff


def test_with_no_member_online_anywhere_they_stay_with_the_member() -> None:
    node, commit, edge, handoff = lost_member_of_two()
    edge.command(
        "a",
        shared_handoff_done=pb.SharedHandoffDone(
            client_id="a", handoff_id=handoff.handoff_id, moved=False, online_only=True
        ),
    )
    commit.durable()
    assert list(node.sessions["a"].queue) == [1, 2]
    assert node.sessions["a"].handing == set()
    connect(edge, "a", "a-2")
    commit.durable()
    assert delivered(edge.heard()[1], "a") == [b"p0", b"p1"]


def test_a_session_that_ends_leaves_its_messages_stored_until_another_member_has_them() -> None:
    node, commit, edge = node_and_edge()
    join(edge, "a", window=1)
    join(edge, "b")
    lose(edge, "b")  # b's session stays, offline
    commit.durable()
    edge.heard()
    publish_to_group(edge, 3, qos=2)
    commit.durable()
    assert delivered(edge.heard()[1], "a") == [b"p0"]  # a, online, gets all three; p0 sent
    lose(edge, "a", session_expiry_s=0)  # a's session ends
    commit.durable()
    handoff_key = f"hx:{P}:handoff"
    stored = [op for _, op in commit.written if op[1] == handoff_key]
    (handoff,) = handoffs(edge)
    assert [op[:3] for op in stored] == [(HSET, handoff_key, b"%d" % handoff.handoff_id)]
    assert pb.SharedHandoff.FromString(stored[0][3]) == handoff
    assert not handoff.online_only
    assert [m.payload for m in handoff.messages] == [b"p1", b"p2"]  # p0 was sent: nobody's
    # No other partition holds a member: b, offline here, gets them.
    before = len(commit.written)
    edge.command(
        "a",
        shared_handoff_done=pb.SharedHandoffDone(
            client_id="a", handoff_id=handoff.handoff_id, moved=False
        ),
    )
    commit.durable()
    assert [qm.message.payload for qm in node.sessions["b"].queue.values()] == [b"p1", b"p2"]
    # In the same batch as the messages queued at b, the stored copy goes.
    batch = {op[:2] for _, op in commit.written[before:]}
    assert {(HDEL, handoff_key), (HSET, queue_key(P, "b"))} <= batch


def test_only_a_message_for_one_group_alone_is_the_groups() -> None:
    node, commit, edge = node_and_edge()
    join(edge, "a")
    join(edge, "b")
    h = "$share/h/t"
    edge.command(
        "a",
        subscribe=pb.Subscribe(
            client_id="a", connection_id="a-1", subscriptions=[pb.SubscriptionSpec(filter=h, qos=1)]
        ),
    )
    commit.durable()
    edge.heard()
    publish_to_group(edge, 2, qos=1, groups=(G, h))
    commit.durable()
    groups = {
        cid: [qm.shared_group for qm in node.sessions[cid].queue.values()] for cid in ("a", "b")
    }
    # p0: g and h both chose a (one delivery, for both: a's own); p1: g chose b, h chose a.
    assert groups == {"a": ["", h], "b": [G]}


def test_a_session_that_ends_while_its_messages_are_handed_over_asks_again_for_any_member() -> None:
    node, commit, edge, first = lost_member_of_two()
    # a comes back with a clean start before the edge answers: its old session ends, and the
    # messages being handed over are now kept only in the partition's handoff key.
    edge.command(
        "a",
        open_session=pb.OpenSession(
            client_id="a", connection_id="a-2", clean_start=True, session_expiry_s=600
        ),
    )
    commit.durable()
    handoff_key = f"hx:{P}:handoff"
    assert (HSET, handoff_key, b"%d" % first.handoff_id) in [op[:3] for _, op in commit.written]

    def answer(moved: bool, online_only: bool) -> None:
        done = pb.SharedHandoffDone(
            client_id="a", handoff_id=first.handoff_id, moved=moved, online_only=online_only
        )
        edge.command("a", shared_handoff_done=done)
        commit.durable()

    # No member online elsewhere: with the session gone, any member will do; asked at once.
    answer(moved=False, online_only=True)
    (again,) = handoffs(edge)
    assert (again.handoff_id, again.online_only) == (first.handoff_id, False)
    answer(moved=False, online_only=True)  # a late answer to the first hand-out: ignored
    assert first.handoff_id in node.state.redelivery.pending
    answer(moved=True, online_only=False)
    assert node.state.redelivery.pending == {}
    assert commit.written[-1][1][:3] == (HDEL, handoff_key, b"%d" % first.handoff_id)
    assert delivered(edge.heard()[1], "a") == []  # the new session never gets them
