"""Inbound QoS 2 retried routings, without processes: a claim's origin id (given once, kept on a
takeover), the target partitions that remember the origin ids they stored (a retried routing
stores once per subscriber), how they forget them (Qos2Forget, the age sweep), and that the
remembered set is written, replicated and snapshotted with the partition's other state."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.router import Router
from services.partition.keys import qos2_inbound_key, qos2_seen_key, queue_key
from services.partition.qos2_seen import SeenOrigins
from services.partition.replication import HDEL, HSET
from services.partition.sessions import Claim, Routed, Session
from services.partition.store import RedisStore
from tests.support.edge_harness import alternating_router as make_router
from tests.support.edge_harness import announce
from tests.support.partition_harness import (
    EPOCH,
    CountedIds,
    Edge,
    P,
    connect,
    make_node,
    receive,
    routed,
)
from tests.support.replication_sim import Sim

IDS = CountedIds()
# A second partition mastered by the same node (P is the first one).
P2 = 5
TOPIC = "t/x"


def subscriber(edge: Edge, cid: str, p: int) -> None:
    conn = f"{cid}-conn"
    edge.command(
        cid,
        partition=p,
        open_session=pb.OpenSession(
            client_id=cid, connection_id=conn, session_expiry_s=600, receive_maximum=10
        ),
    )
    edge.command(
        cid,
        partition=p,
        subscribe=pb.Subscribe(
            client_id=cid,
            connection_id=conn,
            subscriptions=[pb.SubscriptionSpec(filter="t/#", qos=2)],
        ),
    )
    # The edge applied the index update (else the SUBACK waits for it).
    seq = edge.node.state.index.barrier.seq
    edge.handle(pb.EdgeCommand(index_ack=pb.IndexAck(seq=seq)))


def publish(edge: Edge, partitions: list[int], origin: bytes, payload: bytes = b"m") -> int:
    message = cpb.Message(topic=TOPIC, payload=payload, qos=2, publisher_id="pub")
    targets = [pb.PartitionTarget(partition=p, epoch=EPOCH) for p in partitions]
    return edge.command(
        "pub",
        partition=partitions[0],
        publish=pb.Publish(message=message, targets=targets, qos2_origin=origin),
    )


def forget(edge: Edge, *entries: tuple[int, int, bytes]) -> None:
    origins = [pb.SeenOrigin(partition=p, epoch=e, origin=o) for p, e, o in entries]
    edge.handle(pb.EdgeCommand(qos2_forget=pb.Qos2Forget(origins=origins)))


def two_partitions() -> tuple[Any, Any, Edge]:
    """A node mastering P and P2, a subscriber to t/# in each (s1 in P, s2 in P2)."""
    node, commit = make_node()
    node.mastered[P2] = EPOCH
    edge = Edge(node, "e1")
    subscriber(edge, "s1", P)
    subscriber(edge, "s2", P2)
    commit.durable()
    edge.heard()
    return node, commit, edge


def queued(node: Any, cid: str) -> list[bytes]:
    return [qm.message.payload for qm in node.sessions[cid].queue.values()]


# ----- the claim's origin id -------------------------------------------------------------


def test_a_takeover_of_the_claim_keeps_its_origin_id() -> None:
    """A claim gets its origin id once; every attempt that takes it over gets the same one."""
    session = Session(P, pb.SessionRecord(client_id="c"))
    assert session.qos2_receive(1, "a", None, IDS) is Claim.NEW
    origin = session.q2in[1].origin
    # a's attempt ended unreported (its edge died): b takes the claim over.
    assert session.qos2_receive(1, "b", None, IDS) is Claim.NEW
    assert (session.q2in[1].connection_id, session.q2in[1].origin) == ("b", origin)
    # A failed routing that keeps its claim (no PUBREC 0x80 went out): the resend routes with
    # the same origin id again.
    assert session.qos2_routed(1, "b", ok=False, keep_claim=True) is Routed.UNCHANGED
    assert session.qos2_receive(1, "c", None, IDS) is Claim.NEW
    assert session.q2in[1].origin == origin
    # One that drops it (PUBREC 0x80 follows): the packet id is a new message, with a new
    # origin id [MQTT-4.3.3-9].
    assert session.qos2_routed(1, "c", ok=False) is Routed.DELETED
    assert session.qos2_receive(1, "d", None, IDS) is Claim.NEW
    assert session.q2in[1].origin not in (b"", origin)
    # Routed: nothing can retry it, the origin id is let go.
    assert session.qos2_routed(1, "d", ok=True) is Routed.PUT
    assert session.q2in[1].origin == b""
    # Distinct claims get distinct origin ids.
    session.qos2_receive(2, "d", None, IDS)
    session.qos2_receive(3, "d", None, IDS)
    assert len({session.q2in[2].origin, session.q2in[3].origin}) == 2


def test_the_node_answers_new_with_the_origin_id_and_a_takeover_with_the_same() -> None:
    """NEW carries the stored claim's origin id; the attempt taking the claim over gets it too."""
    node, commit = make_node()
    old, new = Edge(node, "e1"), Edge(node, "e2")
    connect(old, "c", "c1")
    first = receive(old, "c", "c1", 7)
    commit.durable()
    origin = old.heard()[0][first].qos2_origin
    assert len(origin) == 16
    stored = [op for _, op in commit.written if op[1] == qos2_inbound_key(P, "c")]
    assert pb.Qos2Inbound.FromString(stored[-1][3]).origin == origin
    connect(new, "c", "c2")
    again = receive(new, "c", "c2", 7)
    node.close_link(old.link, node.clock())  # e1 died mid-routing
    commit.durable()
    answer = new.heard()[0][again]
    assert (answer.qos2_state, answer.qos2_origin) == (pb.QOS2_STATE_NEW, origin)
    # The old attempt's failure report (its edge re-linked) cannot drop the claim c2 holds, and
    # says so: that edge must not free the packet id with a PUBREC 0x80.
    late = Edge(node, "e1")
    stale = routed(late, "c", "c1", 7, ok=False)
    commit.durable()
    assert late.heard()[0][stale].status == pb.STATUS_CODE_TAKEN_OVER
    assert node.sessions["c"].q2in[7].origin == origin
    # A failed routing that drops the claim (a 5.0 PUBREC 0x80 follows): the next PUBLISH
    # with that packet id is a new message, with a new origin id.
    routed(new, "c", "c2", 7, ok=False)
    commit.durable()
    new.heard()
    fresh = receive(new, "c", "c2", 7)
    commit.durable()
    assert new.heard()[0][fresh].qos2_origin not in (b"", origin)


# ----- target partitions -----------------------------------------------------------------


def test_mqtt_4_3_3_10_a_retried_routing_stores_once_per_subscriber() -> None:
    """MQTT-4.3.3-10: a repeated PUBLISH before PUBREL must not cause duplicate deliveries."""
    node, commit, edge = two_partitions()
    origin = b"o" * 16
    # The first attempt reached P only (its edge died before P2's node got the message).
    first = publish(edge, [P], origin)
    commit.durable()
    # The origin id is written in the same batch as the enqueue (one log entry per partition).
    assert {op[:3] for p, op in commit.written if p == P and op[0] == HSET} >= {
        (HSET, queue_key(P, "s1"), b"1"),
        (HSET, qos2_seen_key(P), origin),
    }
    # The resend took the claim over and routes again, to both partitions.
    second = publish(edge, [P, P2], origin)
    commit.durable()
    results, _ = edge.heard()
    assert results[first].status == results[second].status == pb.STATUS_CODE_OK
    assert queued(node, "s1") == [b"m"]
    assert queued(node, "s2") == [b"m"]
    # A third attempt (everything stored already) stores nothing and still answers success.
    written = len(commit.written)
    third = publish(edge, [P, P2], origin)
    commit.durable()
    assert edge.heard()[0][third].status == pb.STATUS_CODE_OK
    assert commit.written[written:] == []
    assert (queued(node, "s1"), queued(node, "s2")) == ([b"m"], [b"m"])
    # Another claim (another origin id) is another message; QoS 0/1 publishes carry none.
    publish(edge, [P], b"p" * 16, b"n")
    publish(edge, [P], b"", b"q")
    publish(edge, [P], b"", b"q")
    commit.durable()
    assert queued(node, "s1") == [b"m", b"n", b"q", b"q"]


def test_forgotten_origin_ids_are_removed_durably_and_only_at_their_epoch() -> None:
    """Qos2Forget lets an origin id go (an HDEL, replicated); a stale epoch changes nothing."""
    node, commit, edge = two_partitions()
    origin = b"f" * 16
    publish(edge, [P, P2], origin)
    commit.durable()
    written = len(commit.written)
    forget(edge, (P, EPOCH + 1, origin), (P2, EPOCH, origin), (P2, EPOCH, b"unknown"))
    commit.durable()
    assert commit.written[written:] == [(P2, (HDEL, qos2_seen_key(P2), origin, b""))]
    assert node.seen.remembers(P, origin)
    assert not node.seen.remembers(P2, origin)
    assert node.seen.forgotten == 1


def test_origin_ids_past_the_retention_are_swept_durably() -> None:
    """The backstop for a forget that never came: the oldest go after the retention."""
    seen = SeenOrigins(retention_ms=3_000)
    assert seen.admit(b"old", [P, P2], 1_000) == {P, P2}
    assert seen.admit(b"new", [P], 5_000) == {P}
    assert seen.admit(b"old", [P, 9], 5_000) == {9}  # P has it already
    assert seen.sweep(3_999) == []
    assert sorted(seen.sweep(4_500)) == [(P, b"old"), (P2, b"old")]
    assert (seen.remembers(P, b"new"), seen.remembers(9, b"old"), len(seen)) == (True, True, 2)
    # On the node: what the sweep lets go is deleted from Redis (and from the followers).
    node, commit = make_node()
    node.seen.load(P, [(b"stale", 1), (b"young", 2**62)])
    assert node.sweep_qos2_seen(node.clock()) == 1
    commit.durable()
    assert commit.written == [(P, (HDEL, qos2_seen_key(P), b"stale", b""))]
    assert node.sweep_qos2_seen(node.clock()) == 0


def test_mqtt_4_3_3_10_a_retried_routing_picks_the_same_shared_group_partitions() -> None:
    """MQTT-4.3.3-10: a repeated PUBLISH before PUBREL must not cause duplicate deliveries."""
    group = "$share/g/a/#"

    def edge_router() -> Router:
        router = make_router()
        for p in (1, 2, 3, 4, 5):
            announce(router, p, group, online=p != 5)
        return router

    def picked(router: Router, key: bytes) -> list[int]:
        route = router.route_publish("a/b", key)
        return [t.partition for _, targets in route.targets for t in targets if t.shared]

    first_edge, other_edge = edge_router(), edge_router()
    keys = [bytes([i]) * 16 for i in range(200)]
    first = [picked(first_edge, key) for key in keys]
    for _ in range(3):
        first_edge.route_publish("a/b")  # other messages move the round robin on
    # The retry, on the same edge or another one, picks what the first attempt picked.
    assert [picked(first_edge, key) for key in keys] == first
    assert [picked(other_edge, key) for key in keys] == first
    # One partition per message, spread over the online members' partitions.
    assert all(len(p) == 1 for p in first)
    assert set(Counter(p for (p,) in first)) == {1, 2, 3, 4}


# ----- replication and storage -----------------------------------------------------------


def test_remembered_origins_replicate_with_the_enqueues() -> None:
    """A follower holding the queued message holds its origin id (one log entry), and a
    forget reaches it too."""
    _, commit, edge = two_partitions()
    origin = b"r" * 16
    publish(edge, [P], origin)
    batch = commit.queue.batch.ops
    assert {op[1] for op in batch[P]} >= {queue_key(P, "s1"), qos2_seen_key(P)}
    sim = Sim(2, P + 1, 2)
    sim.deliver_all()
    master = sim.master_of(P)
    follower = next(n for n in sim.nodes if n != master)
    sim.write(master, {P: list(batch[P])})
    sim.deliver_all()
    assert sim.divergence(P) == []
    stored = sim.nodes[follower].store
    assert origin in stored[qos2_seen_key(P)]
    assert b"1" in stored[queue_key(P, "s1")]
    commit.durable()
    forget(edge, (P, EPOCH, origin))
    sim.write(master, {P: list(commit.queue.batch.ops[P])})
    sim.deliver_all()
    assert qos2_seen_key(P) not in sim.nodes[follower].store


class HashRedis:
    """The few Redis hash reads RedisStore makes of a partition, over a dict."""

    def __init__(self, data: dict[str, dict[bytes, bytes]]) -> None:
        self.data = data

    async def hkeys(self, key: str) -> list[bytes]:
        return list(self.data.get(key, {}))

    async def hgetall(self, key: str) -> dict[bytes, bytes]:
        return dict(self.data.get(key, {}))

    def pipeline(self, transaction: bool = False) -> HashPipeline:
        return HashPipeline(self)

    async def hscan_iter(self, key: str, count: int = 10) -> AsyncIterator[tuple[bytes, bytes]]:
        for item in list(self.data.get(key, {}).items()):
            yield item


class HashPipeline:
    """HashRedis's reads queued and answered together, as a pipeline."""

    def __init__(self, redis: HashRedis) -> None:
        self.redis = redis
        self.keys: list[str] = []

    def hgetall(self, key: str) -> None:
        self.keys.append(key)

    async def execute(self) -> list[dict[bytes, bytes]]:
        return [await self.redis.hgetall(key) for key in self.keys]


async def test_a_partition_snapshot_and_reload_carry_its_remembered_origins() -> None:
    """A follower catching up by snapshot, and a master reloading, get the origin ids too."""
    seen = {b"b": b"2000", b"a": b"1000"}
    data = {
        f"hx:{P}:sessions": {b"s1": pb.SessionRecord(client_id="s1").SerializeToString()},
        qos2_seen_key(P): seen,
    }
    store = RedisStore(HashRedis(data))
    assert qos2_seen_key(P) in await store.partition_keys(P)
    ops = [op async for chunk in store.snapshot_chunks(P, 100) for op in chunk]
    assert {(op[1], op[2], op[3]) for op in ops if op[1] == qos2_seen_key(P)} == {
        (qos2_seen_key(P), k, v) for k, v in seen.items()
    }
    assert (await store.load_partitions([P]))[P].seen == [(b"a", 1000), (b"b", 2000)]
