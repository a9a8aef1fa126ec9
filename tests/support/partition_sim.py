"""The partition master's command core (services/partition/state.py, commands.py) driven by
hand: no PartitionNode, no event loop, no Redis. The simulation plays the adapter's part: it
gives the time, carries out the effects (sends to the edges' links, the state changes of
commands.RELEASED, the hand-outs), and plays the group commit over the core's CommitQueue.

The scenario language (one command a line, `#` comments; tests/support/scenario_script.py):

    nodes n1 partitions 2       # n1 masters p0..p1 at epoch 1: promoted, activated, served
    link e1                     # edge e1 links (again: its old link is replaced)
    unlink e1                   # edge e1's link drops (its connections with it)
    connect e1 c1 [clean] [expiry S] [will TOPIC]   # c1 connects through e1 (a new connection)
    disconnect c1 [will]        # c1 sends DISCONNECT (with `will`: 5.0's "with will message")
    subscribe c1 FILTER QOS
    publish c1 TOPIC QOS PAYLOAD
    ack c1                      # c1 acknowledges what its connection was sent
    durable                     # the batch gathered is durable and replicated: released
    advance MS                  # the clock moves; the node's once-a-second housekeeping runs
    check received c1 PAYLOAD...    # what c1's connections were sent, in order
    check has c1 PAYLOAD...     # c1's connections were sent each of these (at least once)
    check queued c1 N           # messages c1's session holds
    check session c1 present|absent
    check wills TOPIC N         # PublishWill events for this will topic, so far
    check answered              # every command has its answer
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hexmq import telemetry
from hexmq.api.common.v1.common_pb2 import Message
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.pacing import FlushPacer
from services.partition import commands, roles, session_commands, wills
from services.partition.commit_queue import FULL_COMMIT, CommitQueue
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
from services.partition.limits import QueueLimits
from services.partition.links import EdgeLink
from services.partition.stored import StoredPartition
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
    # connection now and not acknowledged yet.
    received: list[str] = field(default_factory=list)
    unacked: list[int] = field(default_factory=list)


class Sim:
    def __init__(self, node_id: str, partitions: int) -> None:
        self.clock = Clock()
        self.commit = CommitQueue(FlushPacer(full=FULL_COMMIT))
        tracer = AppendTracer(node_id, telemetry.Tracing.disabled(), None)
        self.state = state = commands.new_state(
            node_id, self.commit, CountedIds(), None, tracer, QueueLimits()
        )
        self.partitions = partitions
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
        # The pure promotion: each partition loading, then activated (an empty store), served.
        for p in range(partitions):
            roles.promote(state, p, EPOCH, 0)
            assert roles.activate(state, p, EPOCH, StoredPartition(), self.clock())
        roles.serve(state, list(range(partitions)), 0)
        self.carry()

    # ----- the adapter's part ---------------------------------------------------------------

    def carry(self) -> None:
        """Carry out the outbox, as the adapter does once a call returns."""
        out = self.state.outbox
        for effect in out:
            self._carry(effect)
        out.clear()
        self._hear()

    def _carry(self, effect: Any) -> None:
        released = commands.RELEASED.get(type(effect))
        if released is not None:
            released(self.state, effect)
            return
        carry = _CARRY.get(type(effect))
        if carry is None:
            raise SimError(f"an effect the simulation does not know: {effect!r}")
        carry(self, effect)

    def durable(self) -> None:
        queue = self.commit
        _ = queue.batch
        sealed = queue.seal()
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
                self.asked.pop(rid, None)
            for event in events:
                if event.HasField("result"):
                    self.asked.pop(event.result.request_id, None)
                elif event.HasField("delivery"):
                    self._delivered(event.delivery)
                elif event.HasField("publish_will"):
                    self.wills.append(event.publish_will)

    def _delivered(self, delivery: pb.Delivery) -> None:
        client = self.clients[delivery.client_id]
        if delivery.connection_id != client.conn:
            return  # a connection gone at the edge: its client never sees it
        for qm in delivery.messages:
            if qm.released:
                continue
            client.received.append(qm.message.payload.decode())
            if qm.qos:
                client.unacked.append(qm.message_id)

    # ----- inputs ---------------------------------------------------------------------------

    def command(self, edge: str, partition: int, **kind: Any) -> int:
        rid = self.next_id
        self.next_id += 1
        cmd = pb.EdgeCommand(request_id=rid, partition=partition, partition_epoch=EPOCH, **kind)
        self.asked[rid] = edge
        held = commands.handle(self.state, self.links[edge], cmd, self.clock())
        if held is not None:
            raise SimError(f"command {rid} held for partition {held}")
        self.carry()
        return rid

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

    def _lost(self, edge: str) -> None:
        """Edge `edge`'s link is lost: what it carried so far was heard; its commands not
        answered yet never will be, and its client connections are gone."""
        self._hear()
        for rid in [rid for rid, e in self.asked.items() if e == edge]:
            del self.asked[rid]
        for client in self.clients.values():
            if client.edge == edge:
                client.conn, client.unacked = "", []

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        now = self.clock()
        session_commands.settle_takeovers(self.state, now)
        session_commands.expire_sessions(self.state, now)
        wills.hand_out(self.state, now)
        self.state.redelivery.sweep(now)
        self.carry()


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
            "durable": lambda a: self.s.durable(),
            "advance": lambda a: self.s.advance(int(a[0])),
            "check": self.do_check,
        }
        self.checks = {
            "received": self.check_received,
            "has": self.check_has,
            "queued": self.check_queued,
            "session": self.check_session,
            "wills": self.check_wills,
            "answered": self.check_answered,
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
        client.edge, client.conn, client.unacked = edge, conn, []
        sim.command(edge, client.partition, open_session=req)

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
        client.conn, client.unacked = "", []
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
            pb.PartitionTarget(partition=p, epoch=EPOCH, shared=sorted(self.s.shared.get(p, ())))
            for p in range(self.s.partitions)
        ]
        self.s.command(
            client.edge, client.partition, publish=pb.Publish(message=message, targets=targets)
        )

    def do_ack(self, a: list[str]) -> None:
        client = self.connected(a[0])
        if not client.unacked:
            return
        ids, client.unacked = client.unacked, []
        req = pb.DeliveryAck(client_id=client.name, connection_id=client.conn, message_ids=ids)
        self.s.command(client.edge, client.partition, delivery_ack=req)

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
