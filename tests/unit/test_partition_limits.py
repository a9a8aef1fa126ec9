"""The limits a partition master keeps (issue 25), driven through its command handlers
(tests/support/partition_harness.py): a session's queue by count and by bytes, subscriptions
per session, the cluster's retained messages by count and bytes; and a will's owner, carried
to the edge that publishes it."""

from __future__ import annotations

import dataclasses
from typing import Any

from hexmq.api.common.v1.common_pb2 import Message
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.delivery import QueueLimits
from services.partition.node import PartitionNode
from tests.support.partition_harness import EPOCH, Edge, InstantCommit, P, connect, make_node

SC = pb.StatusCode
LIMIT = pb.FILTER_OUTCOME_SUBSCRIPTION_LIMIT


def limited(**limits: Any) -> tuple[PartitionNode, InstantCommit, Edge]:
    node, commit = make_node()
    node.state.delivery.limits = dataclasses.replace(QueueLimits(), **limits)
    edge = Edge(node, "e1")
    return node, commit, edge


def subscribe(edge: Edge, cid: str, conn: str, *filters: str) -> int:
    return edge.command(
        cid,
        subscribe=pb.Subscribe(
            client_id=cid,
            connection_id=conn,
            subscriptions=[pb.SubscriptionSpec(filter=f, qos=1) for f in filters],
        ),
    )


def publish(
    edge: Edge, topic: str, payload: bytes, *, command_id: int, retain: bool = False
) -> int:
    target = pb.PartitionTarget(partition=P, epoch=EPOCH)
    kind = pb.Publish(
        message=Message(topic=topic, payload=payload, qos=1, publisher_id="p", retain=retain),
        targets=[target],
    )
    if retain:
        kind.retained.CopyFrom(target)
    return edge.command("p", command_id=command_id, publish=kind)


def offline_subscriber(node: PartitionNode, commit: InstantCommit, edge: Edge) -> None:
    connect(edge, "s", "e1.1")
    subscribe(edge, "s", "e1.1", "t/#")
    node.state.index.barrier.acked(edge.link, node.state.index.barrier.seq)
    edge.command(
        "s", close_session=pb.CloseSession(client_id="s", connection_id="e1.1", graceful=True)
    )
    commit.durable()
    edge.heard()


def test_a_sessions_queue_is_capped_by_count_newest_dropped() -> None:
    node, commit, edge = limited(max_queued_messages=3)
    offline_subscriber(node, commit, edge)
    for i in range(5):
        publish(edge, "t/x", b"m%d" % i, command_id=i + 1)
    commit.durable()
    session = node.sessions["s"]
    assert [qm.message.payload for qm in session.queue.values()] == [b"m0", b"m1", b"m2"]
    assert (node.limit_counts.queued_messages, node.dropped_queue_full) == (2, 2)
    # The publisher is acknowledged all the same: one slow subscriber stalls nobody.
    results, _ = edge.heard()
    assert all(r.status == SC.STATUS_CODE_OK for r in results.values())


def test_a_sessions_queue_is_capped_by_bytes_of_payload_and_topic() -> None:
    # Each message is 3 (topic) + 100 bytes: three fit in 320, not four.
    node, commit, edge = limited(max_queued_bytes=320)
    offline_subscriber(node, commit, edge)
    for i in range(5):
        publish(edge, "t/x", bytes([i]) * 100, command_id=i + 1)
    commit.durable()
    session = node.sessions["s"]
    assert len(session.queue) == 3
    assert session.queued_bytes == 3 * 103
    assert node.limit_counts.queued_bytes == 2
    # Acknowledged messages free their bytes.
    connect(edge, "s", "e1.2", clean_start=False)
    commit.durable()
    edge.heard()
    edge.command(
        "s",
        delivery_ack=pb.DeliveryAck(client_id="s", connection_id="e1.2", message_ids=[1, 2]),
    )
    assert session.queued_bytes == 103


def test_drop_oldest_makes_room_by_bytes_too() -> None:
    node, commit, edge = limited(max_queued_bytes=320, drop_oldest=True)
    offline_subscriber(node, commit, edge)
    for i in range(4):
        publish(edge, "t/x", bytes([i]) * 100, command_id=i + 1)
    publish(edge, "t/x", b"b" * 200, command_id=9)  # needs two of the oldest to go
    commit.durable()
    payloads = [qm.message.payload[:1] for qm in node.sessions["s"].queue.values()]
    assert payloads == [b"\x03", b"b"]
    assert node.sessions["s"].queued_bytes == 103 + 203


def test_subscriptions_per_session_are_capped_filter_by_filter() -> None:
    node, commit, edge = limited(max_subscriptions=2)
    connect(edge, "s", "e1.1")
    rid = subscribe(edge, "s", "e1.1", "a", "b", "c")
    node.state.index.barrier.acked(edge.link, node.state.index.barrier.seq)
    commit.durable()
    results, _ = edge.heard()
    assert list(results[rid].filter_outcomes) == [
        pb.FILTER_OUTCOME_GRANTED_QOS_1,
        pb.FILTER_OUTCOME_GRANTED_QOS_1,
        LIMIT,
    ]
    # Replacing a subscription the session has is not a new one; a new one is refused.
    rid = subscribe(edge, "s", "e1.1", "a", "d")
    commit.durable()
    results, _ = edge.heard()
    assert list(results[rid].filter_outcomes) == [pb.FILTER_OUTCOME_GRANTED_QOS_1, LIMIT]
    assert set(node.sessions["s"].subscriptions) == {"a", "b"}
    assert node.limit_counts.subscriptions == 2
    assert node.limit_counts.counters()["limits/subscriptions"] == 2


def test_retained_messages_are_capped_by_count_new_topics_only() -> None:
    node, commit, edge = limited(max_retained_messages=2)
    for i, topic in enumerate(["r/1", "r/2", "r/3"]):
        publish(edge, topic, b"v", command_id=i + 1, retain=True)
    commit.durable()
    results, _ = edge.heard()
    assert [r.retained_refused for _, r in sorted(results.items())] == [False, False, True]
    assert "maximum of 2 retained messages" in results[3].message
    assert set(node.retained) == {"r/1", "r/2"}
    # A topic's own message may be replaced, and deleted; then there is room again.
    publish(edge, "r/1", b"new", command_id=4, retain=True)
    publish(edge, "r/2", b"", command_id=5, retain=True)
    publish(edge, "r/3", b"v", command_id=6, retain=True)
    commit.durable()
    results, _ = edge.heard()
    assert not any(r.retained_refused for r in results.values())
    assert {t: m.payload for t, (_, m) in node.retained.items()} == {"r/1": b"new", "r/3": b"v"}
    assert node.limit_counts.retained_messages == 1


def test_retained_bytes_are_capped_and_a_refused_one_still_reaches_subscribers() -> None:
    node, commit, edge = limited(max_retained_bytes=100)
    connect(edge, "s", "e1.1")
    subscribe(edge, "s", "e1.1", "r/#")
    node.state.index.barrier.acked(edge.link, node.state.index.barrier.seq)
    commit.durable()
    edge.heard()
    first = publish(edge, "r/1", b"x" * 60, command_id=1, retain=True)  # 63 bytes
    second = publish(edge, "r/2", b"y" * 60, command_id=2, retain=True)  # 126 in all: refused
    commit.durable()
    results, deliveries = edge.heard()
    assert (results[first].retained_refused, results[second].retained_refused) == (False, True)
    assert "100 bytes" in results[second].message
    assert [qm.message.topic for d in deliveries for qm in d.messages] == ["r/1", "r/2"]
    assert set(node.retained) == {"r/1"}
    assert node.limit_counts.retained_bytes == 1


def test_a_nodes_share_of_the_retained_cap_follows_the_partitions_it_masters() -> None:
    # 4 partitions, this node masters 1: its share of 8 retained messages is 2.
    node, commit, edge = limited(max_retained_messages=8)
    node.state.roles.view = mpb.View(epoch=1, partition_count=4)
    for i in range(3):
        publish(edge, f"r/{i}", b"v", command_id=i + 1, retain=True)
    commit.durable()
    assert len(node.retained) == 2


def test_a_wills_owner_goes_to_the_edge_that_publishes_it() -> None:
    node, commit = make_node()
    edge = Edge(node, "e1")
    will = pb.Will(message=Message(topic="w", payload=b"x"), owner_recorded=True, username="eve")
    connect(edge, "c", "e1.1", will=will)
    connect(edge, "anon", "e1.2", will=pb.Will(message=Message(topic="w"), owner_recorded=True))
    commit.durable()
    edge.heard()
    for cid, conn in (("c", "e1.1"), ("anon", "e1.2")):
        edge.command(
            cid,
            close_session=pb.CloseSession(client_id=cid, connection_id=conn, graceful=False),
        )
    commit.durable()
    wills = {
        e.publish_will.client_id: e.publish_will
        for e in edge.events()
        if e.HasField("publish_will")
    }
    assert (wills["c"].owner_recorded, wills["c"].username) == (True, "eve")
    assert wills["anon"].owner_recorded
    assert not wills["anon"].HasField("username")


def test_the_brokers_own_sys_topics_neither_count_nor_are_refused() -> None:
    node, commit, edge = limited(max_retained_messages=1)
    publish(edge, "$SYS/broker/nodes/n1/uptime", b"1", command_id=1, retain=True)
    publish(edge, "$SYS/broker/nodes/n1/load", b"1", command_id=2, retain=True)
    rid = publish(edge, "r/1", b"v", command_id=3, retain=True)
    commit.durable()
    results, _ = edge.heard()
    assert not results[rid].retained_refused
    assert len(node.retained) == 3
