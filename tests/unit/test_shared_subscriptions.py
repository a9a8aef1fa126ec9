"""Shared subscriptions without processes: the edge's choice of one partition per group and
message (services/edge/router.py), the partition's choice of one member (services/partition/
shared.py), and which shared filters are valid."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt.errors import TopicFilterInvalid
from hexmq.mqtt.reason_codes import ReasonCode
from hexmq.topics import validate_topic_filter
from services.edge import retained
from services.edge.router import Router
from services.partition.sessions import LiveConnection, Session
from services.partition.shared import SharedGroups

PARTITIONS = 8
NODES = ("n1", "n2")


def master(p: int) -> str:
    return NODES[p % 2]


def make_router(*, up: tuple[str, ...] = NODES) -> Router:
    router = Router()
    router.set_view(
        mpb.View(
            epoch=1,
            partition_count=PARTITIONS,
            partitions=[
                mpb.PartitionAssignment(partition=p, epoch=10 + p, replicas=[master(p)])
                for p in range(PARTITIONS)
            ],
        )
    )
    for node in NODES:
        # The router only reads a link's node_id and whether it is up.
        router.links[node] = SimpleNamespace(node_id=node, connected=node in up)  # type: ignore[assignment]
        router.apply_index_update(node, pb.IndexUpdate(reset=True, snapshot_done=True))
    return router


def announce(
    router: Router, p: int, filt: str, *, present: bool = True, online: bool = True
) -> None:
    router.apply_index_update(
        master(p),
        pb.IndexUpdate(
            entries=[pb.IndexEntry(partition=p, filter=filt, present=present, online=online)]
        ),
    )


def plan(router: Router, topic: str) -> dict[int, tuple[str, ...]]:
    """partition -> shared groups it serves, for one message; checks the node grouping."""
    route = router.route_publish(topic)
    assert not route.shared
    out: dict[int, tuple[str, ...]] = {}
    for link, targets in route.targets:
        for t in targets:
            assert master(t.partition) == link.node_id
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


def test_partitions_behind_a_down_link_are_avoided() -> None:
    router = make_router(up=("n1",))  # n2 masters the odd partitions
    group = "$share/g/t"
    for p in (1, 2, 4):
        announce(router, p, group)
    assert {next(iter(plan(router, "t"))) for _ in range(10)} == {2, 4}
    router.links["n1"].connected = False  # every master down: the publish will be refused
    assert len(plan(router, "t")) == 1


def test_dropping_a_node_index_drops_its_group_members() -> None:
    router = make_router()
    announce(router, 1, "$share/g/t")
    announce(router, 2, "$share/g/t")
    router.drop_node_index("n2")
    assert {next(iter(plan(router, "t"))) for _ in range(4)} == {2}


# ----- the partition's choice of member ---------------------------------------------------------


def session(cid: str, p: int = 3, *, online: bool = True) -> Session:
    s = Session(p, pb.SessionRecord(client_id=cid))
    if online:
        s.attach(LiveConnection(link=None, connection_id=f"c-{cid}", receive_maximum=10))  # type: ignore[arg-type]
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
    b.attach(LiveConnection(link=None, connection_id="c-b2", receive_maximum=10))  # type: ignore[arg-type]
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
