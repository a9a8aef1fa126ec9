"""One edge's order counts (issue 16), without processes: what an edge received first counts
first. A PUBLISH read after a SUBSCRIBE (from another client on the same edge) also goes to the
subscriber's partition, after the SUBSCRIBE on the same link, until the partition answers; a
shared group's partition whose member is unsubscribing is the group's last choice until the
answer; retained messages routed after a SUBSCRIBE are not sent again among the ones gathered
after its SUBACK. Pure parts (services/edge/pending_subscriptions.py, the router) directly; the
connection's part through a ClientConnection over a fake socket with the edge's real links and
dispatcher, the partition played by hand (tests/support/edge_harness.py)."""

from __future__ import annotations

import pytest

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.hashring import partition_of
from hexmq.mqtt import PubAck, Publish, SubAck, Subscribe, Subscription, UnsubAck, Unsubscribe
from services.edge.links import PartitionLink
from services.edge.pending_subscriptions import PendingSubscriptions
from services.edge.router import Router
from services.edge.server import Edge
from tests.support.edge_harness import (
    HOLD,
    Clock,
    client_id_in,
    connected,
    make_edge,
    ok,
    taken,
    up,
    view,
)

SC = pb.StatusCode


# ----- PendingSubscriptions ------------------------------------------------------------------


def test_pending_subscriptions_count_per_filter_and_partition() -> None:
    pending = PendingSubscriptions()
    assert not pending
    pending.subscribing(3, ["a/+", "b/#"])
    pending.subscribing(3, ["a/+"])  # a second SUBSCRIBE of the same filter, not answered
    pending.subscribing(5, ["a/+"])
    assert pending
    assert sorted(pending.matching("a/x")) == [("a/+", 3), ("a/+", 5)]
    assert sorted(pending.matching("b/y/z")) == [("b/#", 3)]
    pending.subscribed(3, ["a/+", "b/#"])
    assert sorted(pending.matching("a/x")) == [("a/+", 3), ("a/+", 5)]  # one still waits
    assert list(pending.matching("b/y")) == []
    pending.subscribed(3, ["a/+"])
    pending.subscribed(5, ["a/+"])
    pending.subscribed(5, ["a/+"])  # an answer more than asked changes nothing
    assert not pending
    assert list(pending.matching("a/x")) == []


def test_only_shared_unsubscribes_are_recorded() -> None:
    pending = PendingSubscriptions()
    recorded = pending.unsubscribing(2, ["plain/+", "$share/g/t", "$share/h/t"])
    assert recorded == ["$share/g/t", "$share/h/t"]
    assert pending.leaving("$share/g/t", 2)
    assert not pending.leaving("$share/g/t", 3)
    pending.unsubscribing(2, ["$share/g/t"])
    pending.unsubscribed(2, recorded)
    assert pending.leaving("$share/g/t", 2)  # the second UNSUBSCRIBE is still unanswered
    assert not pending.leaving("$share/h/t", 2)
    pending.unsubscribed(2, ["$share/g/t"])
    assert not pending


def message(topic: str, payload: bytes, at_ms: int, publisher: str = "a") -> cpb.Message:
    return cpb.Message(
        topic=topic, payload=payload, publisher_id=publisher, published_at_ms=at_ms, retain=True
    )


def test_a_retained_watch_records_only_matching_messages_and_filters_gathered_ones() -> None:
    pending = PendingSubscriptions()
    watch = pending.watch_retained(["s/+"])
    other = pending.watch_retained(["t/#"])
    live = message("s/1", b"new", 20)
    pending.routed_retained(live)
    pending.routed_retained(message("u/1", b"elsewhere", 21))
    assert watch.routed_live == {("s/1", "a", 20, b"new")}
    assert other.routed_live == set()
    older = message("s/2", b"old", 10)
    same_topic_other_publisher = message("s/1", b"new", 20, publisher="b")
    gathered = [message("s/1", b"new", 20), older, same_topic_other_publisher]
    assert watch.not_sent_live(gathered) == [older, same_topic_other_publisher]
    pending.end_watch(watch)
    pending.end_watch(watch)  # ending twice is harmless
    assert pending.watches == 1
    pending.routed_retained(message("s/3", b"after", 30))
    assert ("s/3", "a", 30, b"after") not in watch.routed_live


# ----- the router ---------------------------------------------------------------------------

PARTITIONS = 8


def make_router() -> Router:
    router = Router()
    router.set_view(
        mpb.View(
            epoch=1,
            partition_count=PARTITIONS,
            partitions=[
                mpb.PartitionAssignment(partition=p, epoch=5, replicas=["n1" if p < 4 else "n2"])
                for p in range(PARTITIONS)
            ],
        )
    )
    for node in ("n1", "n2"):
        router.apply_index_update(node, pb.IndexUpdate(reset=True, snapshot_done=True))
    assert router.index_complete
    return router


def announce(router: Router, p: int, filt: str, *, present: bool = True) -> None:
    node = "n1" if p < 4 else "n2"
    update = pb.IndexUpdate(
        entries=[pb.IndexEntry(partition=p, filter=filt, present=present, online=True)]
    )
    router.apply_index_update(node, update)


def partitions(router: Router, topic: str) -> dict[int, tuple[str, ...]]:
    route = router.route_publish(topic)
    return {t.partition: tuple(t.shared) for _node, ts in route.targets for t in ts}


def test_a_pending_subscription_is_a_target_until_answered_and_the_cache_follows() -> None:
    router = make_router()
    announce(router, 1, "t/+")
    assert partitions(router, "t/x") == {1: ()}  # cached now
    router.subscribing(6, ["t/#"])
    route = router.route_publish("t/x")
    assert {n: [t.partition for t in ts] for n, ts in route.targets} == {"n1": [1], "n2": [6]}
    assert [t.epoch for _n, ts in route.targets for t in ts] == [5, 5]
    assert partitions(router, "u/x") == {}
    announce(router, 6, "t/#")  # the partition's announcement, ahead of its answer
    router.subscribed(6, ["t/#"])
    assert partitions(router, "t/x") == {1: (), 6: ()}  # by the index now, once
    announce(router, 6, "t/#", present=False)  # e.g. unsubscribed meanwhile
    assert partitions(router, "t/x") == {1: ()}


def test_a_refused_subscription_leaves_no_target() -> None:
    router = make_router()
    router.subscribing(2, ["t/#"])
    assert partitions(router, "t/x") == {2: ()}
    router.subscribed(2, ["t/#"])  # answered, announced nothing
    assert partitions(router, "t/x") == {}


def test_a_pending_shared_subscription_is_a_candidate_with_an_online_member() -> None:
    router = make_router()
    group = "$share/g/t/+"
    router.subscribing(2, [group])
    assert partitions(router, "t/x") == {2: (group,)}
    # A group known elsewhere with offline members only: the subscriber here, online, first.
    router.apply_index_update(
        "n2",
        pb.IndexUpdate(entries=[pb.IndexEntry(partition=5, filter=group, present=True)]),
    )
    assert [partitions(router, "t/x") for _ in range(3)] == [{2: (group,)}] * 3


def test_a_partition_whose_member_is_unsubscribing_is_its_groups_last_choice() -> None:
    router = make_router()
    group = "$share/g/t/+"
    for p in (1, 5):
        announce(router, p, group)
    turns = [partitions(router, "t/x") for _ in range(2)]
    assert sorted(p for t in turns for p in t) == [1, 5]  # in turn
    leaving = router.unsubscribing(1, [group, "t/#"])
    assert leaving == [group]
    assert [partitions(router, "t/x") for _ in range(4)] == [{5: (group,)}] * 4
    router.partition_open = lambda p: p != 5
    # A held partition of a member staying still comes before the one whose member leaves.
    assert partitions(router, "t/x") == {5: (group,)}
    router.unsubscribed(1, leaving)
    router.partition_open = lambda p: True
    turns = [partitions(router, "t/x") for _ in range(2)]
    assert sorted(p for t in turns for p in t) == [1, 5]


def test_a_group_whose_only_partition_is_leaving_still_goes_there() -> None:
    """Another member may be in that partition: the partition decides (nobody, if none)."""
    router = make_router()
    group = "$share/g/t/+"
    announce(router, 3, group)
    router.unsubscribing(3, [group])
    assert partitions(router, "t/x") == {3: (group,)}


# ----- connections over a fake socket ------------------------------------------------------


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def edge(clock: Clock) -> Edge:
    edge = make_edge(clock, view(1, dict.fromkeys((5, 6, 7), ("n2", 1))))
    for link in edge.router.links.values():
        up(link)  # n1's partitions 0 and 3 subscribe to t/#
    assert edge.router.index_complete
    return edge


def index_update(link: PartitionLink, *entries: pb.IndexEntry, seq: int = 0) -> None:
    update = pb.IndexUpdate(entries=entries, seq=seq)
    link._dispatch(pb.PartitionFrame(events=[pb.PartitionEvent(index_update=update)]))


def targets(cmd: pb.EdgeCommand) -> list[int]:
    return [t.partition for t in cmd.publish.targets]


async def test_a_publish_read_after_a_subscribe_goes_to_the_subscribers_partition_after_it(
    edge: Edge,
) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    sub = await connected(edge, client_id_in(5, "sub"))  # its session: partition 5, on n2
    pub = await connected(edge, client_id_in(1, "pub"))
    sub.send(Subscribe(1, (Subscription("u/+", 1),)))
    pub.send(Publish("u/x", b"after", qos=1, packet_id=1))
    subscribe, publish = taken(n2)  # in the order the edge read them, on one link
    assert subscribe.HasField("subscribe")
    assert targets(publish) == [5]
    assert taken(n1) == []
    # The partition announces the filter (applied before its answer, same link), answers.
    index_update(n2, pb.IndexEntry(partition=5, filter="u/+", present=True, epoch=1))
    ok(n2, subscribe, filter_outcomes=[pb.FILTER_OUTCOME_GRANTED_QOS_1], existed=[False])
    ok(n2, publish)
    packets = await sub.received()
    assert [type(p) for p in packets] == [SubAck]
    (puback,) = await pub.received()
    assert isinstance(puback, PubAck)
    assert puback.reason_code == 0
    assert not edge.router.pending
    # After the answer the index alone routes it: one target, no pending entry.
    pub.send(Publish("u/y", b"later", qos=1, packet_id=2))
    *_queries, later = taken(n2)
    assert targets(later) == [5]


async def test_an_answer_that_refuses_the_subscribe_ends_the_pending_entry(
    edge: Edge, clock: Clock
) -> None:
    n2 = edge.router.links["n2"]
    sub = await connected(edge, client_id_in(6, "sub"))
    n2._fail("killed")  # the SUBSCRIBE is held, and refused past the bound
    sub.send(Subscribe(1, (Subscription("v/+", 1),)))
    assert edge.router.pending
    clock.now += HOLD
    edge.dispatcher._tick()
    (suback,) = await sub.received()
    assert isinstance(suback, SubAck)
    assert suback.reason_codes == (0x80,)
    assert not edge.router.pending
    assert edge.router.pending.watches == 0


async def test_a_subscriber_gone_before_its_suback_keeps_the_route_until_the_answer(
    edge: Edge,
) -> None:
    n2 = edge.router.links["n2"]
    sub = await connected(edge, client_id_in(7, "sub"))
    sub.send(Subscribe(1, (Subscription("w/+", 1),)))
    sub.conn.connection_lost(None)  # (a takeover: the session goes on with the subscription)
    (subscribe, close) = taken(n2)
    assert close.HasField("close_session")
    assert edge.router.pending  # the SUBSCRIBE may still be applied: still routed there
    ok(n2, subscribe, filter_outcomes=[pb.FILTER_OUTCOME_GRANTED_QOS_1], existed=[False])
    assert not edge.router.pending
    assert edge.router.pending.watches == 0


async def test_retained_messages_routed_after_the_subscribe_are_not_gathered_again(
    edge: Edge,
) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    sub = await connected(edge, client_id_in(5, "sub"))
    pub = await connected(edge, client_id_in(1, "pub"))
    # A topic whose retained message lives on n1 (partitions 0-4).
    topic = next(t for i in range(1000) if partition_of(t := f"r/{i}", PARTITIONS) < 5)
    sub.send(Subscribe(1, (Subscription("r/+", 1),)))
    pub.send(Publish(topic, b"set after the subscribe", qos=0, retain=True))
    subscribe, live = taken(n2)
    assert targets(live) == [5]
    (stored,) = taken(n1)
    assert stored.publish.HasField("retained")
    assert stored.publish.message == live.publish.message
    ok(n2, subscribe, filter_outcomes=[pb.FILTER_OUTCOME_GRANTED_QOS_1], existed=[False])
    (suback,) = await sub.received()
    assert isinstance(suback, SubAck)
    (query1,) = taken(n1)
    (query2,) = taken(n2)
    assert list(query1.retained_query.filters) == ["r/+"]
    older = cpb.Message(topic="r/old", payload=b"set before", qos=1, retain=True)
    ok(n1, query1, retained=[live.publish.message, older])
    assert edge.router.pending.watches == 1  # until every node has answered
    ok(n2, query2)
    assert edge.router.pending.watches == 0
    (enqueue,) = taken(n2)
    assert [qm.message.topic for qm in enqueue.enqueue_retained.messages] == ["r/old"]


async def test_retained_messages_without_a_newer_routing_are_gathered(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    sub = await connected(edge, client_id_in(5, "sub"))
    sub.send(Subscribe(1, (Subscription("q/+", 1), Subscription("$share/g/q/+", 1))))
    (subscribe,) = taken(n2)
    assert edge.router.pending.watches == 1
    ok(
        n2,
        subscribe,
        filter_outcomes=[pb.FILTER_OUTCOME_GRANTED_QOS_1, pb.FILTER_OUTCOME_GRANTED_QOS_1],
        existed=[False, False],
    )
    await sub.received()
    (query1,) = taken(n1)
    (query2,) = taken(n2)
    assert list(query1.retained_query.filters) == ["q/+"]  # not the shared subscription
    retained = cpb.Message(topic="q/1", payload=b"kept", qos=1, retain=True)
    ok(n1, query1, retained=[retained])
    ok(n2, query2)
    (enqueue,) = taken(n2)
    assert [qm.message.payload for qm in enqueue.enqueue_retained.messages] == [b"kept"]


async def test_no_watch_for_subscriptions_that_get_no_retained_messages(edge: Edge) -> None:
    n2 = edge.router.links["n2"]
    sub = await connected(edge, client_id_in(6, "sub"))
    sub.send(Subscribe(1, (Subscription("z/+", 1, retain_handling=2),)))
    (subscribe,) = taken(n2)
    assert edge.router.pending.watches == 0
    ok(n2, subscribe, filter_outcomes=[pb.FILTER_OUTCOME_GRANTED_QOS_1], existed=[False])
    await sub.received()
    assert taken(n2) == []  # nothing to gather


async def test_a_shared_members_unsubscribe_keeps_the_group_off_its_partition_until_answered(
    edge: Edge,
) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    group = "$share/g/s/+"
    leaver = await connected(edge, client_id_in(1, "leaver"))
    pub = await connected(edge, client_id_in(2, "pub"))
    index_update(n1, pb.IndexEntry(partition=1, filter=group, present=True, online=True))
    index_update(n2, pb.IndexEntry(partition=6, filter=group, present=True, online=True))
    leaver.send(Unsubscribe(1, (group,)))
    (unsubscribe,) = taken(n1)
    for pid in range(1, 5):
        pub.send(Publish("s/x", b"m", qos=1, packet_id=pid))
    assert taken(n1) == []
    assert [targets(c) for c in taken(n2)] == [[6]] * 4
    ok(n1, unsubscribe, filter_outcomes=[pb.FILTER_OUTCOME_REMOVED])
    (unsuback,) = await leaver.received()
    assert isinstance(unsuback, UnsubAck)
    assert not edge.router.pending
    # Answered without announcing anything (another member stays in partition 1): in turn.
    for pid in range(5, 7):
        pub.send(Publish("s/x", b"m", qos=1, packet_id=pid))
    assert [targets(c) for c in taken(n1) + taken(n2)] == [[1], [6]]
