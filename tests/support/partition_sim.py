"""The partition master's command core (services/partition/state.py, commands.py) driven by
hand: no PartitionNode, no event loop, no Redis. The simulation plays the adapter's part: it
gives the time, carries out the effects (sends to the edges' links, the state changes of
commands.RELEASED, the hand-outs), and plays the group commit over the core's CommitQueue.

The committer (services/partition/group_commit.py GroupCommit._due) is played exactly, on the
simulation's clock: whenever it is free (no batch of its own being written) and something may
have changed (a command, a release, the clock), it asks the queue `next(now, lazy linger,
removal linger)` (hexmq/pacing.py's defaults: 10 ms, 100 ms, and a pacing interval of 4 ms)
and takes the batch the queue hands it, if any: that batch is then written and replicated once
the script says `commit`. The clock moves only with `advance`, which stops at each deadline the
committer waits for on the way (company, pacing) to let it ask again then. What batches wrote
goes to an in-memory store (the Redis of a master and its in-sync followers: durable and
replicated are one step here), which `failover` loads a new master from.

The scenario language (one command a line, `#` comments; tests/support/scenario_script.py):

    nodes n1 partitions 2       # n1 masters p0..p1 at epoch 1: promoted, activated, served
    link e1                     # edge e1 links (again: its old link is replaced)
    unlink e1                   # edge e1's link drops (its connections with it)
    connect e1 c1 [clean] [expiry S] [will TOPIC]   # c1 connects through e1 (a new connection)
    disconnect c1 [will]        # c1 sends DISCONNECT (with `will`: 5.0's "with will message")
    subscribe c1 FILTER QOS
    publish c1 TOPIC QOS PAYLOAD
    ack c1                      # c1 sends PUBACK for the QoS 1 messages its connection was sent
    pubrec c1                   # c1 sends PUBREC for the QoS 2 messages its connection was sent
    pubcomp c1                  # c1 sends PUBCOMP for the PUBRELs its connection was sent
    commit                      # the batch the committer took is durable and replicated:
                                # released (nothing if it took none)
    durable                     # that batch, then all that is gathered, whatever the committer
                                # waits for: durable and replicated, released
    advance MS                  # the clock moves; the node's once-a-second housekeeping runs
    failover [reattach]         # the master is lost with all it had not made durable (the
                                # batch the committer took, what is gathered); a new one loads
                                # the store at the next epoch; the edges link again, their
                                # connections gone (clients `connect` again), or with
                                # `reattach` kept: each edge re-attaches them, carrying the
                                # acknowledgements not answered yet (AttachSession)
    check received c1 PAYLOAD...    # what c1's connections were sent, in order
    check has c1 PAYLOAD...     # c1's connections were sent each of these (at least once)
    check once c1               # no QoS 2 message came to c1 again once it had its PUBREL
    check queued c1 N           # messages c1's session holds
    check session c1 present|absent
    check wills TOPIC N         # PublishWill events for this will topic, so far
    check answered              # every command has its answer
    check unanswered N          # N commands have no answer yet
    check pending-removals N    # N acknowledged messages' removals are not durable yet
    check committer idle|busy   # it waits for something to be gathered | has taken a batch
    check committer company|pacing MS   # it waits for company | the pacing, MS more ms
    check last-batch removals N writes M    # the last batch written: its removals from
                                # queues, and its other writes
    check deferral              # each batch the committer took held each removal no longer
                                # than its linger (removal: QoS 1; lazy: others) past its ack,
                                # and took QoS 1 removals alone no sooner than the removal linger
    check has-published c1      # c1 was sent every QoS >= 1 message answered to its publisher
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hexmq import telemetry
from hexmq.api.common.v1.common_pb2 import Message
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.pacing import (
    DEFAULT_INTERVAL,
    DEFAULT_LAZY_LINGER,
    DEFAULT_REMOVAL_LINGER,
    FlushPacer,
)
from services.partition import commands, roles, session_commands, wills
from services.partition.commit_queue import (
    FULL_COMMIT,
    IDLE,
    AwaitCompany,
    AwaitPacing,
    CommitQueue,
    Sealed,
    Step,
)
from services.partition.effects import (
    AfterIndexed,
    EndAppendSpans,
    HandoffReady,
    HandOutShared,
    HandOutWills,
    RecordSpan,
    Send,
    SendToAll,
)
from services.partition.group_commit import carry_out_released
from services.partition.keys import (
    handoff_key,
    qos2_seen_key,
    retained_key,
    session_keys,
    sessions_key,
)
from services.partition.limits import QueueLimits
from services.partition.links import EdgeLink
from services.partition.replication import HDEL, HSET
from services.partition.stored import StoredPartition, StoredSession
from services.partition.tracing import AppendTracer
from tests.support.partition_harness import Clock, CountedIds
from tests.support.scenario_script import ScriptError, ScriptRunner, SimError

EPOCH = 1


@dataclass
class Client:
    name: str
    partition: int
    edge: str = ""
    # The connection that holds the session now ("" : none), and how many it had.
    conn: str = ""
    count: int = 0
    # Payloads its connections were sent (QoS >= 1 and 0), in order; ids sent to the
    # connection now and not acknowledged yet: QoS 1 (PUBACK), QoS 2 (PUBREC), PUBRELs
    # (PUBCOMP).
    received: list[str] = field(default_factory=list)
    unacked: list[int] = field(default_factory=list)
    unreceived: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    # The client's own session state, which outlives its connections: the payload of each
    # message id it was sent, the QoS 2 payloads it had a PUBREL for (done with: it delivered
    # them once), and those that came as PUBLISH again after that (twice).
    payloads: dict[int, str] = field(default_factory=dict)
    pubrel: set[str] = field(default_factory=set)
    twice: list[str] = field(default_factory=list)
    # What its edge keeps of the connection's acknowledgements not answered yet (by request
    # id: PUBACK/PUBCOMP ids, PUBREC ids), to carry again when it re-attaches the session.
    unconfirmed: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)
    # The connection's OpenSession while not answered: its edge sends it again to a new master.
    opening: pb.OpenSession | None = None

    def drop_connection(self) -> None:
        self.conn, self.unacked, self.unreceived, self.released = "", [], [], []
        self.unconfirmed, self.opening = {}, None

    def attach(self) -> pb.AttachSession:
        """What its edge re-attaches the connection with (services/edge/session/delivery.py
        reattach)."""
        acked = [mid for ids, _recs in self.unconfirmed.values() for mid in ids]
        received = [mid for _ids, recs in self.unconfirmed.values() for mid in recs]
        return pb.AttachSession(
            client_id=self.name,
            connection_id=self.conn,
            receive_maximum=10,
            inflight_ids=[*self.unacked, *self.unreceived],
            released_ids=self.released,
            acked_ids=acked,
            received_ids=received,
        )


@dataclass
class Taken:
    """A batch the committer took (or `durable` sealed: forced): when (ms), when the committer
    was free to take it (ms: its last batch released, or the master's start), the removals
    from queues in it, (client, message id), and its other writes."""

    sealed: Sealed
    at: int
    free_since: int
    removals: list[tuple[str, int]]
    writes: int
    forced: bool = False


# The committer's clock is the simulation's in ms (CommitQueue.next is unit-free): the
# lingers and the pacing in ms too, so that deadlines fall on whole ms.
LAZY_LINGER_MS = DEFAULT_LAZY_LINGER * 1000
REMOVAL_LINGER_MS = DEFAULT_REMOVAL_LINGER * 1000
PACING_MS = DEFAULT_INTERVAL * 1000


class Sim:
    def __init__(self, node_id: str, partitions: int) -> None:
        self.clock = Clock()
        self.start = self.clock()
        self.node_id = node_id
        self.ids = CountedIds()
        self.partitions = partitions
        self.epoch = EPOCH
        self.links: dict[str, EdgeLink] = {}
        self.clients: dict[str, Client] = {}
        # Shared subscriptions (their filters) per partition, which the edge names in a publish's
        # targets for the partitions holding them.
        self.shared: dict[int, set[str]] = {}
        # Commands asked and not answered yet -> their edge (a link lost drops its commands'
        # answers: its edge sends them again), and the answers heard.
        self.asked: dict[int, str] = {}
        self.wills: list[pb.PublishWill] = []
        self.next_id = 1
        # What the batches wrote (the Redis of the master and its followers): key -> hash.
        self.store: dict[str, dict[bytes, bytes]] = {}
        # Removals of acknowledged messages not durable yet: (client, message id) -> when (ms)
        # the acknowledgement came and the message's QoS; the acknowledgement (request id) each
        # came with; the commands answered (none before its removals are durable).
        self.unwritten: dict[tuple[str, int], tuple[int, int]] = {}
        self.removed_by: dict[tuple[str, int], int] = {}
        self.answered: set[int] = set()
        # When each command was asked (ms); the acknowledgements that only the removal linger
        # should hold (PUBACKs only, of QoS 1 messages: the rule of issue 28).
        self.asked_at: dict[int, int] = {}
        self.deferrable: set[int] = set()
        # The client whose edge waits for the answer to an OpenSession, DeliveryAck or
        # AttachSession ("open", "ack", "attach").
        self.answers_to: dict[int, tuple[Client, str]] = {}
        # The QoS >= 1 publishes asked, and those answered OK, by payload.
        self.publishing: dict[int, str] = {}
        self.published: list[str] = []
        # The batches the committer took (and `durable` sealed), in order, with their removals'
        # ack times and QoS as they were taken; how many the `deferral` check has seen; the
        # one being written (taken, not durable yet) and the last one written.
        self.taken: list[Taken] = []
        self.taken_acks: dict[int, list[tuple[int, int]]] = {}
        self.checked = 0
        self.in_flight: Taken | None = None
        self.written: Taken | None = None
        self.step: Step = IDLE
        self.free_since = self.start
        self.master(lambda p: StoredPartition())

    def master(self, load: Callable[[int], StoredPartition]) -> None:
        """A new master at `self.epoch`: its commit queue, its state, each partition promoted,
        activated from `load(p)` and served."""
        self.commit = CommitQueue(FlushPacer(interval=PACING_MS, full=FULL_COMMIT))
        tracer = AppendTracer(self.node_id, telemetry.Tracing.disabled(), None)
        self.state = state = commands.new_state(
            self.node_id, self.commit, self.ids, None, tracer, QueueLimits()
        )
        self.in_flight, self.step = None, IDLE
        self.free_since = self.clock()
        for p in range(self.partitions):
            roles.promote(state, p, self.epoch, 0)
            assert roles.activate(state, p, self.epoch, load(p), self.clock())
        roles.serve(state, list(range(self.partitions)), 0)
        self.carry()

    # ----- the adapter's part ---------------------------------------------------------------

    def carry(self) -> None:
        """Carry out the outbox, as the adapter does once a call returns; the committer, if
        free, asks the queue what to do."""
        out = self.state.outbox
        for effect in out:
            self._carry(effect)
        out.clear()
        self._hear()
        self._look()

    def _carry(self, effect: Any) -> None:
        released = commands.RELEASED.get(type(effect))
        if released is not None:
            released(self.state, effect)
            return
        carry = _CARRY.get(type(effect))
        if carry is None:
            raise SimError(f"an effect the simulation does not know: {effect!r}")
        carry(self, effect)

    def _now(self) -> float:
        return float(self.clock() - self.start)

    def _look(self) -> None:
        """The committer, unless it has a batch of its own, asks the queue what to do now and
        takes the batch it is handed (GroupCommit._due)."""
        if self.in_flight is not None:
            return
        self.step = step = self.commit.next(self._now(), LAZY_LINGER_MS, REMOVAL_LINGER_MS)
        if isinstance(step, Sealed):
            self.in_flight = self._taken(step)

    def _taken(self, sealed: Sealed, *, forced: bool = False) -> Taken:
        removals: list[tuple[str, int]] = []
        writes = 0
        for ops in (sealed.batch.ops if sealed.batch is not None else {}).values():
            for kind, key, name, _value in ops:
                if kind == HDEL and ":q:" in key:
                    removals.append((key.split(":", 3)[3], int(name)))
                else:
                    writes += 1
        taken = Taken(sealed, self.clock(), self.free_since, removals, writes, forced)
        self.taken_acks[len(self.taken)] = [self.unwritten.get(r, (-1, 0)) for r in removals]
        self.taken.append(taken)
        return taken

    def due(self) -> int | None:
        """When (ms) the committer asks again on its own: the end of a wait for company or of
        the pacing (None: it waits for something to be gathered, or for its batch)."""
        step = self.step
        if self.in_flight is not None or not isinstance(step, AwaitCompany | AwaitPacing):
            return None
        return self.start + math.ceil(step.until)

    def commit_taken(self) -> None:
        """The batch the committer took is durable and replicated: released."""
        taken = self.in_flight
        if taken is None:
            return
        self.in_flight = None
        self.free_since = self.clock()
        self._write(taken)

    def durable(self) -> None:
        """The committer's batch, then everything gathered: durable and replicated."""
        while self.in_flight is not None:
            self.commit_taken()
        _ = self.commit.batch
        self._write(self._taken(self.commit.seal(), forced=True))

    def _write(self, taken: Taken) -> None:
        sealed = taken.sealed
        for ops in (sealed.batch.ops if sealed.batch is not None else {}).values():
            for kind, key, name, value in ops:
                if kind == HSET:
                    self.store.setdefault(key, {})[name] = value
                elif kind == HDEL:
                    self.store.get(key, {}).pop(name, None)
                else:
                    self.store.pop(key, None)
        for removal in taken.removals:
            self.unwritten.pop(removal, None)
            self._answered_before(removal, self.removed_by.pop(removal, 0))
        self.written = taken
        queue = self.commit
        token = queue.durable(sealed, [], frozenset(), 0)
        tokens = [(token, frozenset[int]())] if token is not None else []
        carry_out_released(queue.release(tokens), self._released)
        commands.delivery.pump_released(self.state)
        self.carry()

    def _released(self, effect: Any) -> None:
        self._carry(effect)
        self.carry()

    def _hear(self) -> None:
        """What the edges' links carried: answers, deliveries, wills."""
        for link in self.links.values():
            events, oks = link.take()
            for rid in oks:
                self._answered(rid, ok=True)
            for event in events:
                if event.HasField("result"):
                    result = event.result
                    self._answered(result.request_id, result.status == pb.STATUS_CODE_OK)
                elif event.HasField("delivery"):
                    self._delivered(event.delivery)
                elif event.HasField("publish_will"):
                    self.wills.append(event.publish_will)

    def _answered_before(self, removal: tuple[str, int], rid: int) -> None:
        if rid in self.answered:
            raise SimError(f"command {rid} was answered before its removal {removal} was durable")

    def _answered(self, rid: int, ok: bool) -> None:
        self.answered.add(rid)
        if self.asked.pop(rid, None) is not None and ok and rid in self.publishing:
            self.published.append(self.publishing[rid])
        client, kind = self.answers_to.pop(rid, (None, ""))
        if client is None:
            return
        if kind == "open":
            client.opening = None
        elif kind == "ack" and ok:
            client.unconfirmed.pop(rid, None)
        elif kind == "attach" and ok:
            client.unconfirmed.clear()  # (the acknowledgements it carried)
        elif kind == "attach":
            client.drop_connection()  # its edge closes it (taken over, or the session ended)

    def _delivered(self, delivery: pb.Delivery) -> None:
        client = self.clients[delivery.client_id]
        if delivery.connection_id != client.conn:
            return  # a connection gone at the edge: its client never sees it
        for qm in delivery.messages:
            mid = qm.message_id
            if qm.released:
                # PUBREL: the client delivers the message (once) and waits to send PUBCOMP.
                client.released.append(mid)
                client.pubrel.add(client.payloads[mid])
                continue
            payload = qm.message.payload.decode()
            client.received.append(payload)
            if qm.qos == 2 and payload in client.pubrel:
                client.twice.append(payload)
            client.payloads[mid] = payload
            if qm.qos == 1:
                client.unacked.append(mid)
            elif qm.qos == 2:
                client.unreceived.append(mid)

    # ----- inputs ---------------------------------------------------------------------------

    def command(self, edge: str, partition: int, **kind: Any) -> int:
        rid = self.next_id
        self.next_id += 1
        cmd = pb.EdgeCommand(
            request_id=rid, partition=partition, partition_epoch=self.epoch, **kind
        )
        self.asked[rid] = edge
        self.asked_at[rid] = self.clock()
        if kind.get("publish") is not None and kind["publish"].message.qos:
            self.publishing[rid] = kind["publish"].message.payload.decode()
        held = commands.handle(self.state, self.links[edge], cmd, self.clock())
        if held is not None:
            raise SimError(f"command {rid} held for partition {held}")
        self.carry()
        return rid

    def acknowledge(self, client: Client, req: pb.DeliveryAck) -> None:
        """`req` from `client`'s edge; the messages it removes from the session's queue are
        unwritten removals until a batch carries them."""
        session = self.state.conns.sessions.get(client.name)
        before = dict(session.queue) if session is not None else {}
        qos = [qm.qos for mid in req.message_ids if (qm := before.get(mid)) is not None]
        rid = self.next_id
        self.answers_to[rid] = (client, "ack")
        client.unconfirmed[rid] = (list(req.message_ids), list(req.received_ids))
        self.command(client.edge, client.partition, delivery_ack=req)
        if not req.received_ids and all(q == 1 for q in qos):
            self.deferrable.add(rid)
        after = set(session.queue) if session is not None else set()
        for mid in before.keys() - after:
            self.unwritten[(client.name, mid)] = (self.clock(), before[mid].qos)
            self.removed_by[(client.name, mid)] = rid

    def check_deferral(self) -> None:
        """Each batch the committer took since the last check held each removal at most as long
        as its linger allows (the removal linger for a QoS 1 message's, the lazy linger for
        others, and the pacing) past its acknowledgement or the committer's being free,
        whichever came last; and a batch of nothing but PUBACKs of QoS 1 messages went no
        sooner than the removal linger after the first of them (or the committer's being
        free)."""
        for i in range(self.checked, len(self.taken)):
            taken = self.taken[i]
            if taken.forced:
                continue
            for removal, (acked, qos) in zip(taken.removals, self.taken_acks[i], strict=True):
                linger = REMOVAL_LINGER_MS if qos == 1 else LAZY_LINGER_MS
                since = max(acked, taken.free_since)
                if acked >= 0 and taken.at > since + linger + PACING_MS:
                    raise SimError(
                        f"the removal of {removal} (QoS {qos}) went {taken.at - since} ms "
                        f"after its acknowledgement or the committer's being free"
                    )
            sealed = taken.sealed
            rids = [rid for _sink, rid, _scope in sealed.oks]
            alone = sealed.lazy and not sealed.actions and not taken.writes
            if alone and rids and all(rid in self.deferrable for rid in rids):
                since = max(min(self.asked_at[rid] for rid in rids), taken.free_since)
                if taken.at < since + REMOVAL_LINGER_MS:
                    raise SimError(
                        f"a batch of QoS 1 removals alone went {taken.at - since} ms after "
                        f"the first, before the removal linger"
                    )
        self.checked = len(self.taken)

    def link(self, edge: str) -> None:
        if edge in self.links:
            self._lost(edge)
        link = EdgeLink(edge, 1)
        session_commands.link_opened(self.state, link, self.clock())
        self.links[edge] = link
        self.carry()

    def unlink(self, edge: str) -> None:
        link = self.links.pop(edge)
        self._lost(edge)
        session_commands.close_link(self.state, link, self.clock())
        self.carry()

    def _lost(self, edge: str, *, connections: bool = True) -> None:
        """Edge `edge`'s link is lost: what it carried so far was heard; its commands not
        answered yet never will be, and its client connections are gone (unless not
        `connections`: the edge keeps them, to re-attach)."""
        self._hear()
        for rid in [rid for rid, e in self.asked.items() if e == edge]:
            del self.asked[rid]
            self.answers_to.pop(rid, None)
        for client in self.clients.values():
            if client.edge == edge and connections:
                client.drop_connection()

    def failover(self, *, reattach: bool = False) -> None:
        """The master is lost, with what it had not made durable and replicated; a new one
        masters every partition at the next epoch from the store. The edges link to it again,
        their client connections gone, or (`reattach`) kept: each re-attached with what its
        edge knows (AttachSession)."""
        edges = sorted(self.links)
        for edge in edges:
            self._lost(edge, connections=not reattach)
        self.links = {}
        for removal, rid in self.removed_by.items():
            self._answered_before(removal, rid)
        self.unwritten.clear()
        self.removed_by.clear()
        self.epoch += 1
        self.master(self.load)
        for edge in edges:
            self.link(edge)
        for client in self.clients.values():
            if client.conn:
                self.open(client)

    def open(self, client: Client) -> None:
        """`client`'s edge opens its connection's session at the master: OpenSession, or if
        that was answered once already, AttachSession (a new master)."""
        if client.opening is not None:
            self.answers_to[self.next_id] = (client, "open")
            self.command(client.edge, client.partition, open_session=client.opening)
        else:
            self.answers_to[self.next_id] = (client, "attach")
            self.command(client.edge, client.partition, attach_session=client.attach())

    def load(self, p: int) -> StoredPartition:
        """Partition p as the store holds it (RedisStore.load_partitions)."""
        store = self.store
        loaded = StoredPartition(
            retained=[Message.FromString(v) for v in store.get(retained_key(p), {}).values()],
            seen=sorted(
                ((k, int(v)) for k, v in store.get(qos2_seen_key(p), {}).items()),
                key=lambda kv: kv[1],
            ),
            handoffs=sorted(
                (pb.SharedHandoff.FromString(v) for v in store.get(handoff_key(p), {}).values()),
                key=lambda h: h.handoff_id,
            ),
        )
        for raw in store.get(sessions_key(p), {}).values():
            record = pb.SessionRecord.FromString(raw)
            subs, queue, q2in = (store.get(k, {}) for k in session_keys(p, record.client_id))
            loaded.sessions.append(
                StoredSession(
                    record,
                    [pb.SubscriptionSpec.FromString(v) for v in subs.values()],
                    sorted(
                        (pb.QueuedMessage.FromString(v) for v in queue.values()),
                        key=lambda qm: qm.message_id,
                    ),
                    {int(k): pb.Qos2Inbound.FromString(v) for k, v in q2in.items()},
                )
            )
        return loaded

    def advance(self, ms: int) -> None:
        target = self.clock() + ms
        # The committer asks again at each deadline it waits for on the way.
        while (due := self.due()) is not None and due <= target:
            self.clock.now = max(due, self.clock())
            self._look()
        self.clock.now = target
        now = self.clock()
        session_commands.settle_takeovers(self.state, now)
        session_commands.expire_sessions(self.state, now)
        wills.hand_out(self.state, now)
        self.state.redelivery.sweep(now)
        self.carry()


class ScriptChaos:
    """What a randomized run over the simulation (scenario_script.Chaos) keeps: its script,
    run as it goes, from its setup lines (the first of `lines`) on."""

    def __init__(self, source: str, setup: list[str]) -> None:
        self.script = Script(source)
        for line in setup:
            self.script.run_line(line)
        self.lines = ["\n".join(setup)]

    @property
    def sim(self) -> Sim:
        return self.script.s

    def run(self, line: str) -> None:
        self.lines.append(line)
        self.script.run_line(line)


def failure_kind(exc: SimError) -> str:
    """A randomized run's failure without its script line and numbers: the seeds that fail
    alike (scenario_script.run_seeds)."""
    return re.sub(r"\d+", "N", str(exc).split(": ", 2)[-1])[:60]


def _send(sim: Sim, e: Send) -> None:
    e.link.send(e.event)


def _send_to_all(sim: Sim, e: SendToAll) -> None:
    for link in e.links:
        link.send(e.event)


def _after_indexed(sim: Sim, e: AfterIndexed) -> None:
    e.link.send(e.event)  # every edge here applies index updates at once


_CARRY: dict[type, Callable[[Sim, Any], None]] = {
    Send: _send,
    SendToAll: _send_to_all,
    AfterIndexed: _after_indexed,
    RecordSpan: lambda sim, e: None,
    EndAppendSpans: lambda sim, e: None,
    HandOutWills: lambda sim, e: wills.hand_out(sim.state, sim.clock()),
    HandoffReady: lambda sim, e: sim.state.redelivery.ready(e.handoff_id, sim.clock()),
    HandOutShared: lambda sim, e: sim.state.redelivery.hand_out(sim.clock()),
}


class Script(ScriptRunner[Sim]):
    def __init__(self, source: str = "<script>") -> None:
        super().__init__(source)
        self.commands = {
            "nodes": self.do_nodes,
            "link": lambda a: self.s.link(a[0]),
            "unlink": lambda a: self.s.unlink(a[0]),
            "connect": self.do_connect,
            "disconnect": self.do_disconnect,
            "subscribe": self.do_subscribe,
            "publish": self.do_publish,
            "ack": self.do_ack,
            "pubrec": lambda a: self.do_ack(a, "unreceived", "received_ids"),
            "pubcomp": lambda a: self.do_ack(a, "released"),
            "commit": lambda a: self.s.commit_taken(),
            "durable": lambda a: self.s.durable(),
            "advance": lambda a: self.s.advance(int(a[0])),
            "failover": lambda a: self.s.failover(reattach="reattach" in a),
            "check": self.do_check,
        }
        self.checks = {
            "received": self.check_received,
            "has": self.check_has,
            "queued": self.check_queued,
            "session": self.check_session,
            "wills": self.check_wills,
            "answered": self.check_answered,
            "unanswered": self.check_unanswered,
            "once": self.check_once,
            "pending-removals": self.check_pending_removals,
            "committer": self.check_committer,
            "last-batch": self.check_last_batch,
            "deferral": lambda a: self.s.check_deferral(),
            "has-published": self.check_has_published,
        }

    def do_nodes(self, a: list[str]) -> None:
        self.sim = Sim(a[0], int(a[a.index("partitions") + 1]) if "partitions" in a else 1)

    def client(self, name: str) -> Client:
        client = self.s.clients.get(name)
        if client is None:
            raise ScriptError(f"no client {name}")
        return client

    def do_connect(self, a: list[str]) -> None:
        edge, name = a[0], a[1]
        sim = self.s
        if edge not in sim.links:
            raise ScriptError(f"edge {edge} is not linked")
        client = sim.clients.get(name)
        if client is None:
            client = sim.clients[name] = Client(name, len(sim.clients) % sim.partitions)
        client.count += 1
        conn = f"{edge}.{name}.{client.count}"
        opts = a[2:]
        req = pb.OpenSession(
            client_id=name,
            connection_id=conn,
            clean_start="clean" in opts,
            session_expiry_s=int(opts[opts.index("expiry") + 1]) if "expiry" in opts else 600,
            receive_maximum=10,
        )
        if "will" in opts:
            req.will.message.topic = opts[opts.index("will") + 1]
            req.will.message.payload = b"gone"
        client.drop_connection()
        client.edge, client.conn, client.opening = edge, conn, req
        sim.open(client)

    def do_disconnect(self, a: list[str]) -> None:
        client = self.client(a[0])
        if not client.conn:
            raise ScriptError(f"{client.name} is not connected")
        req = pb.CloseSession(
            client_id=client.name,
            connection_id=client.conn,
            graceful=True,
            send_will="will" in a[1:],
        )
        edge = client.edge
        client.drop_connection()
        self.s.command(edge, client.partition, close_session=req)

    def do_subscribe(self, a: list[str]) -> None:
        client = self.connected(a[0])
        spec = pb.SubscriptionSpec(filter=a[1], qos=int(a[2]))
        if a[1].startswith("$share/"):
            self.s.shared.setdefault(client.partition, set()).add(a[1])
        req = pb.Subscribe(client_id=client.name, connection_id=client.conn, subscriptions=[spec])
        self.s.command(client.edge, client.partition, subscribe=req)

    def do_publish(self, a: list[str]) -> None:
        client = self.connected(a[0])
        topic, qos, payload = a[1], int(a[2]), a[3]
        message = Message(topic=topic, qos=qos, payload=payload.encode(), publisher_id=client.name)
        targets = [
            pb.PartitionTarget(
                partition=p, epoch=self.s.epoch, shared=sorted(self.s.shared.get(p, ()))
            )
            for p in range(self.s.partitions)
        ]
        self.s.command(
            client.edge, client.partition, publish=pb.Publish(message=message, targets=targets)
        )

    def do_ack(self, a: list[str], pending: str = "unacked", kind: str = "message_ids") -> None:
        """The client's edge sends `kind` (a DeliveryAck field) for the ids in its `pending`
        list (PUBACK: unacked as message_ids; PUBREC: unreceived as received_ids; PUBCOMP:
        released as message_ids)."""
        client = self.connected(a[0])
        ids = getattr(client, pending)
        if not ids:
            return
        setattr(client, pending, [])
        req = pb.DeliveryAck(client_id=client.name, connection_id=client.conn, **{kind: ids})
        self.s.acknowledge(client, req)

    def connected(self, name: str) -> Client:
        client = self.client(name)
        if not client.conn:
            raise ScriptError(f"{name} is not connected")
        return client

    def check_received(self, a: list[str]) -> None:
        self.expect(f"{a[0]} received", self.client(a[0]).received, a[1:])

    def check_has(self, a: list[str]) -> None:
        received = set(self.client(a[0]).received)
        self.expect(f"{a[0]} missed", [m for m in a[1:] if m not in received], [])

    def check_queued(self, a: list[str]) -> None:
        session = self.s.state.conns.sessions.get(a[0])
        self.expect(f"{a[0]} queued", len(session.queue) if session else 0, int(a[1]))

    def check_session(self, a: list[str]) -> None:
        have = "present" if a[0] in self.s.state.conns.sessions else "absent"
        self.expect(f"{a[0]}'s session", have, a[1])

    def check_wills(self, a: list[str]) -> None:
        count = sum(1 for w in self.s.wills if w.message.topic == a[0])
        self.expect(f"wills on {a[0]}", count, int(a[1]))

    def check_answered(self, a: list[str]) -> None:
        self.expect("unanswered commands", sorted(self.s.asked), [])

    def check_unanswered(self, a: list[str]) -> None:
        self.expect("unanswered commands", len(self.s.asked), int(a[0]))

    def check_once(self, a: list[str]) -> None:
        self.expect(f"{a[0]} had again after their PUBREL", self.client(a[0]).twice, [])

    def check_pending_removals(self, a: list[str]) -> None:
        self.expect("removals not durable", len(self.s.unwritten), int(a[0]))

    def check_committer(self, a: list[str]) -> None:
        sim = self.s
        step, due = sim.step, sim.due()
        if sim.in_flight is not None:
            have = ["busy"]
        elif due is None:
            have = ["idle"]
        else:
            kind = "company" if isinstance(step, AwaitCompany) else "pacing"
            have = [kind, str(due - sim.clock())]
        self.expect("the committer", have, a)

    def check_last_batch(self, a: list[str]) -> None:
        written = self.s.written
        if written is None:
            raise ScriptError("no batch was written yet")
        have = ["removals", str(len(written.removals)), "writes", str(written.writes)]
        self.expect("the last batch written", have, a)

    def check_has_published(self, a: list[str]) -> None:
        self.check_has([a[0], *self.s.published])
