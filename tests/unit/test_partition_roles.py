"""The partition node across role changes, without processes (services/partition/roles.py and
node.py): promotion loads and then serves, commands wait for it in order, demotion unloads,
aborted writes are answered MOVED, a quiesced partition answers MOVED, a re-attached connection
is not sent again what its client has, an OpenSession sent again by its own connection is no
takeover, and a takeover closes the connection the new master inherited."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hexmq import telemetry
from hexmq.api.common.v1.common_pb2 import Message
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.node_protocol import THIS_RELEASE
from services.partition.delivery import publish_origin
from services.partition.node import PartitionNode
from services.partition.promotion import ACTIVATE_AT_ONCE
from services.partition.replication import Assignment, Replicator
from services.partition.roles import WAIT_S
from services.partition.store import StoredPartition, StoredSession
from tests.support.partition_harness import (
    Clock,
    CountedIds,
    Edge,
    InstantCommit,
    commit_queue,
    connect,
)

P = 5
SC = pb.StatusCode


class FakeStore:
    """What a promoted master loads, held back until `release()` (a slow Redis)."""

    def __init__(self) -> None:
        self.partitions: dict[int, StoredPartition] = {}
        self.gate = asyncio.Event()
        self.loads: list[list[int]] = []

    async def load_partitions(self, partitions: Sequence[int]) -> dict[int, StoredPartition]:
        self.loads.append(list(partitions))
        await self.gate.wait()
        return {p: self.partitions.get(p, StoredPartition()) for p in partitions}


def view(epoch: int, master: str = "n1", p: int = P, handover_to: str = "") -> mpb.View:
    replicas = [master, "n2" if master != "n2" else "n1"]
    return mpb.View(
        epoch=epoch,
        partition_count=8,
        replication_factor=2,
        members=[mpb.Member(node_id="n1"), mpb.Member(node_id="n2")],
        partitions=[
            mpb.PartitionAssignment(
                partition=q,
                epoch=epoch if q == p else 1,
                replicas=replicas if q == p else ["n2", "n1"],
                in_sync=replicas if q == p else ["n2", "n1"],
                handover_to=handover_to if q == p else "",
            )
            for q in range(8)
        ],
    )


class Cluster:
    """Node n1 with a real Replicator, a fake store and commit; views applied as the partition
    service applies them (node first, then the replicator, whose roles reach the node)."""

    def __init__(self) -> None:
        self.store = FakeStore()
        self.rep = Replicator("n1")
        queue = commit_queue()
        self.clock = Clock()
        self.node = PartitionNode(
            "n1",
            self.store,
            queue,
            replicator=self.rep,
            clock=self.clock,
            ids=CountedIds(),
            monotonic=self.clock.monotonic,
        )
        self.commit = InstantCommit(queue, self.node.carry_out, self.rep)
        self.edge = Edge(self.node, "n2")

    def take(self, v: mpb.View) -> None:
        self.node.apply_view(v)
        assignments = {
            a.partition: Assignment(a.epoch, tuple(a.replicas), frozenset(a.in_sync), a.handover_to)
            for a in v.partitions
        }
        self.rep.set_view(assignments, {})
        ready = self.rep.ready()
        self.node.demoted_all(ready.demoted)
        for p in ready.promoted:
            self.node.promoted(p)

    async def loaded(self) -> None:
        self.store.gate.set()
        for _ in range(10):
            await asyncio.sleep(0)


def stored_session(cid: str, connection_id: str = "", queued: Sequence[int] = ()) -> StoredSession:
    record = pb.SessionRecord(
        client_id=cid, session_expiry_s=600, connection_id=connection_id, next_message_id=100
    )
    queue = []
    for mid in queued:
        qm = pb.QueuedMessage(message_id=mid, qos=1)
        qm.message.topic = "t"
        qm.message.payload = b"m%d" % mid
        queue.append(qm)
    return StoredSession(record, [pb.SubscriptionSpec(filter="t", qos=1)], queue)


async def test_commands_for_a_partition_being_loaded_wait_and_are_handled_in_order() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("a")])
    c.take(view(4))
    assert c.node.state.roles.loading == {P: 4}
    first = connect(c.edge, "b", "b1", partition=P, epoch=4)
    second = c.edge.command(
        "b",
        partition=P,
        epoch=4,
        publish=pb.Publish(
            message=Message(topic="t", payload=b"x", qos=1),
            targets=[pb.PartitionTarget(partition=P, epoch=4)],
        ),
    )
    c.commit.durable()
    assert c.edge.heard() == ({}, [])  # neither refused nor answered: waiting
    await c.loaded()
    assert c.node.mastered == {P: 4}
    assert set(c.node.sessions) == {"a", "b"}
    c.commit.durable()
    results, _ = c.edge.heard()
    assert results[first].status == SC.STATUS_CODE_OK
    assert results[second].status == SC.STATUS_CODE_OK
    # The publish was handled after the session it follows, and reached the loaded one.
    assert [qm.message.payload for qm in c.node.sessions["a"].queue.values()] == [b"x"]


async def test_a_promoted_master_announces_its_partitions_index_at_its_epoch() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("a")])
    c.take(view(4))
    c.edge.events()
    await c.loaded()
    updates = [e.index_update for e in c.edge.events() if e.HasField("index_update")]
    assert [(r.partition, r.epoch) for r in updates[0].reset_partitions] == [(P, 4)]
    assert [(e.partition, e.filter, e.epoch) for e in updates[0].entries] == [(P, "t", 4)]


async def test_a_command_naming_a_newer_epoch_than_the_nodes_view_waits_for_that_view() -> None:
    c = Cluster()
    c.take(view(2, master="n2"))
    rid = connect(c.edge, "b", "b1", partition=P, epoch=6)  # the edge saw view 6 first
    c.commit.durable()
    assert c.edge.heard() == ({}, [])
    c.take(view(6))
    await c.loaded()
    c.commit.durable()
    assert c.edge.heard()[0][rid].status == SC.STATUS_CODE_OK


async def test_a_command_that_waited_too_long_is_answered_unavailable() -> None:
    c = Cluster()
    c.take(view(2, master="n2"))
    rid = connect(c.edge, "b", "b1", partition=P, epoch=6)
    assert c.node.expire_waiting(c.clock.monotonic()) == 0
    c.clock.advance(int(WAIT_S * 1000))
    assert c.node.expire_waiting(c.clock.monotonic()) == 1
    result = c.edge.heard()[0][rid]
    assert result.status == SC.STATUS_CODE_UNAVAILABLE
    assert f"partition {P}" in result.message


async def test_commands_queued_behind_an_expired_one_are_handled_when_it_is_answered() -> None:
    """A command naming an epoch no view brings (a probe's 99) holds the partition's later
    commands back, so that none overtakes it; when it expires the ones behind it must go on at
    once. They waited for their own expiry instead, were refused, and their edges' resends
    queued behind each other's: OpenSessions for that partition never got through (seen as
    CONNECTs refused after 10 s in make test)."""
    c = Cluster()
    c.take(view(4))
    await c.loaded()
    c.edge.events()
    future = connect(c.edge, "b", "b1", partition=P, epoch=99)
    c.clock.advance(1_000)
    current = connect(c.edge, "a", "a1", partition=P, epoch=4)
    c.commit.durable()
    assert c.edge.heard() == ({}, [])  # the second waits behind the first
    assert c.node.waiting_commands == 2
    c.clock.advance(int(WAIT_S * 1000) - 1_000)  # the first one's WAIT_S is over, not the second's
    assert c.node.expire_waiting(c.clock.monotonic()) == 1
    c.commit.durable()
    results, _ = c.edge.heard()
    assert results[future].status == SC.STATUS_CODE_UNAVAILABLE
    assert results[current].status == SC.STATUS_CODE_OK
    assert c.node.waiting_commands == 0


async def test_a_demoted_partition_is_unloaded_and_its_commands_go_elsewhere() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("a")])
    c.take(view(4))
    await c.loaded()
    c.take(view(5, master="n2"))
    assert c.node.mastered == {}
    assert "a" not in c.node.sessions
    assert not list(c.node.state.index.trie.match("t"))
    rid = connect(c.edge, "a", "a1", partition=P, epoch=4)
    c.commit.durable()
    result = c.edge.heard()[0][rid]
    assert result.status == SC.STATUS_CODE_WRONG_MASTER
    assert (result.current_master, result.current_epoch) == ("n2", 5)


def view_of(epoch: int, masters: dict[int, tuple[str, int]]) -> mpb.View:
    """Partitions 0-7 on n1 and n2, with the (master, epoch) `masters` gives (n2 at epoch 1
    for the rest)."""
    parts = []
    for q in range(8):
        master, at = masters.get(q, ("n2", 1))
        replicas = [master, "n2" if master == "n1" else "n1"]
        parts.append(
            mpb.PartitionAssignment(
                partition=q,
                epoch=at,
                replicas=replicas,
                in_sync=replicas,
            )
        )
    return mpb.View(
        epoch=epoch,
        partition_count=8,
        replication_factor=2,
        members=[mpb.Member(node_id="n1"), mpb.Member(node_id="n2")],
        partitions=parts,
    )


async def test_partitions_promoted_together_are_served_a_share_at_a_time() -> None:
    """A failover promotes a node's share of every session at once: activating them in one go
    stalled the event loop past the agents' probe timeout, so the loop turns between shares."""
    c = Cluster()
    per = ACTIVATE_AT_ONCE // 2 + 1  # two partitions' sessions are more than one share
    for q in (1, 2, 3):
        c.store.partitions[q] = StoredPartition(
            sessions=[stored_session(f"c{q}-{i}") for i in range(per)]
        )
    c.take(view_of(4, {1: ("n1", 4), 2: ("n1", 4), 3: ("n1", 4)}))
    seen: list[int] = []

    async def watch() -> None:
        while len(c.node.mastered) < 3:
            seen.append(len(c.node.mastered))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    await c.loaded()
    await watcher
    assert c.node.mastered == {1: 4, 2: 4, 3: 4}
    assert len(c.node.sessions) == 3 * per
    assert 2 in seen  # other work ran while the third partition waited its turn


async def test_partitions_demoted_together_leave_the_others_alone() -> None:
    c = Cluster()
    for q in (1, 2, 3):
        c.store.partitions[q] = StoredPartition(
            sessions=[stored_session(f"c{q}")],
            retained=[Message(topic=f"r{q}", payload=b"x", retain=True)],
        )
    c.take(view_of(4, {1: ("n1", 4), 2: ("n1", 4), 3: ("n1", 4)}))
    await c.loaded()
    c.take(view_of(5, {1: ("n2", 5), 2: ("n2", 5), 3: ("n1", 4)}))
    assert c.node.mastered == {3: 4}
    assert set(c.node.sessions) == {"c3"}
    assert set(c.node.retained) == {"r3"}
    assert {q for q, _filter in c.node.state.index.refs} == {3}
    assert [cid for _filter, cid, _spec in c.node.state.index.trie.match("t")] == ["c3"]


async def test_writes_of_a_partition_aborted_before_release_are_answered_moved() -> None:
    c = Cluster()
    c.take(view(4))
    await c.loaded()
    connect(c.edge, "a", "a1", partition=P, epoch=4)
    c.commit.durable()
    c.edge.heard()
    pub = c.edge.command(
        "a",
        partition=P,
        epoch=4,
        publish=pb.Publish(
            message=Message(topic="t", payload=b"x", qos=1),
            targets=[pb.PartitionTarget(partition=P, epoch=4)],
        ),
    )
    ping = c.edge.command("a", node_stats=pb.NodeStatsQuery())
    c.commit.durable(aborted=frozenset({P}))
    results, deliveries = c.edge.heard()
    assert results[pub].status == SC.STATUS_CODE_MOVED
    assert results[ping].status == SC.STATUS_CODE_OK  # not a write of P: answered as usual
    assert deliveries == []
    assert c.commit.moved == 1


async def test_a_partition_being_handed_over_answers_moved() -> None:
    c = Cluster()
    c.take(view(4))
    await c.loaded()
    c.take(view(4, handover_to="n2"))
    rid = connect(c.edge, "a", "a1", partition=P, epoch=4)
    c.commit.durable()
    result = c.edge.heard()[0][rid]
    assert result.status == SC.STATUS_CODE_MOVED
    assert result.current_epoch == 4


async def test_an_open_session_sent_again_by_its_connection_is_not_a_takeover() -> None:
    c = Cluster()
    c.take(view(4))
    await c.loaded()
    first = connect(c.edge, "a", "a1", partition=P, epoch=4)
    again = connect(c.edge, "a", "a1", partition=P, epoch=4)
    c.commit.durable()
    events = c.edge.events()
    assert not [e for e in events if e.HasField("kick")]
    results, _ = c.edge.heard()
    results.update({e.result.request_id: e.result for e in events if e.HasField("result")})
    assert not results[first].session_present
    assert not results[again].session_present  # created by this same connection


async def test_a_takeover_closes_the_connection_the_new_master_inherited() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("a", "n2.1.9")])
    c.take(view(4))
    await c.loaded()
    assert c.node.sessions["a"].orphan == "n2.1.9"
    rid = connect(c.edge, "a", "n2.1.10", partition=P, epoch=4)
    c.commit.durable()
    events = c.edge.events()
    kicks = [e.kick for e in events if e.HasField("kick")]
    assert [(k.client_id, k.connection_id, k.reason) for k in kicks] == [
        ("a", "n2.1.9", pb.KICK_REASON_TAKEN_OVER)
    ]
    (result,) = [e.result for e in events if e.HasField("result")]
    assert result.request_id == rid
    assert result.session_present  # the session lives on, now this connection's


async def inherited_takeover() -> tuple[Cluster, int]:
    """n1 promoted at epoch 4 with session a live on n2's edge (of this release) as n2.1.9;
    n2.1.10 takes it over, durably: the cluster and the takeover's request id."""
    c = Cluster()
    c.edge = Edge(c.node, "n2", THIS_RELEASE)
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("a", "n2.1.9")])
    c.take(view(4))
    await c.loaded()
    rid = connect(c.edge, "a", "n2.1.10", partition=P, epoch=4)
    c.commit.durable()
    return c, rid


async def test_a_takeover_of_an_inherited_connection_waits_for_its_edge_to_close_it() -> None:
    # G5 as for a connection this master accepted itself: the orphan's edge (of this release)
    # confirms the close before the new connection is answered.
    c, rid = await inherited_takeover()
    events = c.edge.events()
    kicks = [(e.kick.connection_id, e.kick.confirm) for e in events if e.HasField("kick")]
    assert kicks == [("n2.1.9", True)]
    assert [e for e in events if e.HasField("result")] == []
    c.edge.kicked("a", "n2.1.9")
    result = c.edge.heard()[0][rid]
    assert result.status == SC.STATUS_CODE_OK
    assert result.session_present


async def test_a_held_takeover_is_answered_when_its_partition_is_demoted() -> None:
    # This node no longer masters the session: it has nothing to hold it for (the edge
    # re-attaches the connection to the new master), and the answer must not wait forever.
    c, rid = await inherited_takeover()
    assert [e for e in c.edge.events() if e.HasField("result")] == []
    c.take(view(5, master="n2"))
    assert c.node.settle_takeovers(c.node.clock()) == 0
    assert c.edge.heard()[0][rid].status == SC.STATUS_CODE_OK


async def test_a_reattached_connection_is_not_sent_again_what_its_client_has() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(
        sessions=[stored_session("a", "n2.1.9", queued=[1, 2, 3, 4])]
    )
    c.take(view(4))
    await c.loaded()
    rid = c.edge.command(
        "a",
        partition=P,
        epoch=4,
        attach_session=pb.AttachSession(
            client_id="a",
            connection_id="n2.1.9",
            receive_maximum=10,
            inflight_ids=[2],  # sent, not yet acknowledged: not sent again
            acked_ids=[1],  # acknowledged on the old master, the ack lost with it
        ),
    )
    c.commit.durable()
    results, deliveries = c.edge.heard()
    assert results[rid].status == SC.STATUS_CODE_OK
    # 2 is in flight on the client's connection: not sent again (MQTT-4.4.0-1); 1 is gone.
    assert [qm.message_id for d in deliveries for qm in d.messages] == [3, 4]
    assert 1 not in c.node.sessions["a"].queue
    assert c.node.sessions["a"].orphan == ""


async def test_a_reattach_by_another_connection_is_refused() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("a", "n2.1.9")])
    c.take(view(4))
    await c.loaded()
    rid = c.edge.command(
        "a",
        partition=P,
        epoch=4,
        attach_session=pb.AttachSession(client_id="a", connection_id="n3.1.1"),
    )
    c.commit.durable()
    assert c.edge.heard()[0][rid].status == SC.STATUS_CODE_TAKEN_OVER


async def test_delivery_acks_are_answered_once_durable_and_refused_where_not_mastered() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("a", "n2.1.9", [1])])
    c.take(view(4))
    await c.loaded()
    ack = pb.DeliveryAck(client_id="a", connection_id="n2.1.9", message_ids=[1])
    rid = c.edge.command("a", partition=P, epoch=4, delivery_ack=ack)
    assert c.edge.heard() == ({}, [])
    c.commit.durable()
    assert c.edge.heard()[0][rid].status == SC.STATUS_CODE_OK
    c.take(view(5, master="n2"))
    moved = c.edge.command("a", partition=P, epoch=4, delivery_ack=ack)
    c.commit.durable()
    result = c.edge.heard()[0][moved]
    assert result.status == SC.STATUS_CODE_WRONG_MASTER  # its edge re-attaches with it instead
    assert (result.current_master, result.current_epoch) == ("n2", 5)


def recording(node: PartitionNode) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    node.tracing = telemetry.Tracing(
        service="partition", node_id="n1", provider=provider, processors=[]
    )
    return exporter


def spans(exporter: InMemorySpanExporter, name: str) -> list[dict[str, object]]:
    return [dict(s.attributes or {}) for s in exporter.get_finished_spans() if s.name == name]


async def test_a_takeover_records_a_failover_span_naming_the_lost_master() -> None:
    c = Cluster()
    exporter = recording(c.node)
    c.take(view(3, master="n2"))
    c.take(view(4, master="n1"))
    await c.loaded()
    (failover,) = spans(exporter, telemetry.SpanName.FAILOVER)
    assert failover[telemetry.Attr.PARTITION] == P
    assert failover[telemetry.Attr.EPOCH] == 4
    assert failover[telemetry.Attr.NODE_LOST] == "n2"


def test_a_follower_records_a_catchup_span_from_out_of_sync_to_in_sync() -> None:
    c = Cluster()
    exporter = recording(c.node)
    behind = view(3, master="n2")
    behind.partitions[P].ClearField("in_sync")
    behind.partitions[P].in_sync.append("n2")
    c.node.apply_view(behind)  # n1 follows P out of sync: catching up
    c.node.apply_view(behind)
    assert spans(exporter, telemetry.SpanName.CATCHUP) == []
    c.node.apply_view(view(3, master="n2"))  # in sync again
    c.node.apply_view(view(3, master="n2"))
    (catchup,) = spans(exporter, telemetry.SpanName.CATCHUP)
    assert catchup[telemetry.Attr.PARTITION] == P
    assert catchup[telemetry.Attr.FOLLOWER] == "n1"
    # The other partitions were followed in sync throughout: no span for them.


async def test_a_qos1_publish_sent_again_is_answered_without_being_written_twice() -> None:
    c = Cluster()
    c.store.partitions[P] = StoredPartition(sessions=[stored_session("s")])
    c.take(view(4))
    await c.loaded()

    def publish(command_id: int, payload: bytes) -> int:
        rid = c.edge.next_id
        c.edge.handle(
            pb.EdgeCommand(
                request_id=rid,
                partition=P,
                partition_epoch=4,
                command_id=command_id,
                publish=pb.Publish(
                    message=Message(topic="t", payload=payload, qos=1),
                    targets=[pb.PartitionTarget(partition=P, epoch=4)],
                ),
            ),
        )
        c.edge.next_id += 1
        return rid

    first = publish(7, b"m")
    c.commit.durable()
    again = publish(7, b"m")  # its answer was lost: the edge sends it again, same command id
    other = publish(8, b"m")  # another publish with the same payload is another message
    c.commit.durable()
    results, _ = c.edge.heard()
    assert {results[r].status for r in (first, again, other)} == {SC.STATUS_CODE_OK}
    payloads = [qm.message.payload for qm in c.node.sessions["s"].queue.values()]
    assert payloads == [b"m", b"m"]
    assert c.node.resent_publishes == 1
    # The second batch's entry carries the resend's origin again (its answer waits for that
    # entry on every in-sync replica) besides the new publish's.
    origin = publish_origin(c.edge.link, pb.EdgeCommand(command_id=7))
    last = c.rep.mastered[P].log.entries[-1]
    assert list(last.origins) == [origin, publish_origin(c.edge.link, pb.EdgeCommand(command_id=8))]


class SpanRecorder:
    """Stands in for the node's tracing: the spans recorded, by name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, dict[str, object]]] = []

    def record(self, name: str, start_ns: int, end_ns: int, attributes: dict[str, object]) -> None:
        self.spans.append((name, attributes))

    def __getattr__(self, name: str) -> object:
        raise AttributeError(name)


async def test_a_failover_span_names_the_view_that_made_the_change() -> None:
    """n1 takes P over at view 3 and finishes loading it only after view 4 arrived: its
    partition.failover span is filed under view 3, where P's master changed (the Spark job's
    failover timeline groups by it; found by the fault suite's trace cross-check, seed 1218)."""
    c = Cluster()
    recorder = SpanRecorder()
    c.node.tracing = recorder
    c.take(view(1, master="n2"))
    c.take(view(3, master="n1"))
    later = view(3, master="n1")
    later.epoch = 4
    later.partitions[0].epoch = 4  # another partition changed at 4; P stays at 3
    later.partitions[0].replicas[:] = ["n1", "n2"]
    c.take(later)
    await c.loaded()
    failovers = {
        a["hexmq.partition"]: a for name, a in recorder.spans if name == "partition.failover"
    }
    assert failovers[0]["hexmq.view.epoch"] == 4  # partition 0 moved to n1 at view 4
    assert failovers[P]["hexmq.partition.epoch"] == 3
    assert failovers[P]["hexmq.view.epoch"] == 3
    assert failovers[P]["hexmq.node.lost"] == "n2"
