"""The edge's session core under random traffic, many seeds: a client publishing QoS 1 and 2
(and releasing), the partitions answering in any order, some refusing. Whatever happens, every
publish is answered at most once and only once its partition commands are answered, nothing is
written after the session closed, what it writes decodes, and once everything is answered the
inbound window is empty. A failing seed prints its steps."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import Packet, PubAck, PubComp, Publish, PubRec, PubRel
from services.edge.session import Action, State
from services.edge.session import actions as act
from services.edge.tickets import Route
from tests.support.edge_harness import Driver, SessionEdge, token_of

SEEDS = range(300)
STEPS = 120
OK = pb.StatusCode.STATUS_CODE_OK
UNAVAILABLE = pb.StatusCode.STATUS_CODE_UNAVAILABLE


@dataclass
class Run:
    client: Driver
    rng: random.Random
    log: list[str] = field(default_factory=list)
    # Commands sent and not answered.
    due: list[Action] = field(default_factory=list)
    # Packet ids the client has published and not had answered (PUBACK / PUBREC).
    publishing: dict[int, int] = field(default_factory=dict)
    # QoS 2 packet ids answered PUBREC, not yet released; and released awaiting PUBCOMP.
    received: set[int] = field(default_factory=set)
    releasing: set[int] = field(default_factory=set)
    closed: bool = False

    def feed(self, actions: list[Action]) -> None:
        for a in actions:
            if self.closed and isinstance(a, act.Write):
                raise AssertionError(f"written after Close: {a}")
            if isinstance(a, act.Close):
                self.closed = True
            if token_of(a):
                self.due.append(a)
        for packet in self.client.packets(actions):
            self.heard(packet)

    def heard(self, packet: Packet) -> None:
        self.log.append(f"  <- {packet}")
        if isinstance(packet, PubAck):
            assert self.publishing.pop(packet.packet_id, None) == 1, packet
        elif isinstance(packet, PubRec):
            assert self.publishing.pop(packet.packet_id, None) == 2, packet
            if packet.reason_code < 0x80:
                self.received.add(packet.packet_id)
        elif isinstance(packet, PubComp):
            self.releasing.remove(packet.packet_id)

    def step(self) -> None:
        rng = self.rng
        roll = rng.random()
        free = [
            p
            for p in range(1, 12)
            if p not in self.publishing and p not in self.received and p not in self.releasing
        ]
        if roll < 0.35 and free and not self.closed:
            pid = rng.choice(free)
            qos = rng.choice((1, 2))
            self.publishing[pid] = qos
            self.log.append(f"-> PUBLISH qos {qos} id {pid}")
            self.feed(self.client.send(Publish("t/x", b"m", qos=qos, packet_id=pid)))
        elif roll < 0.45 and self.received and not self.closed:
            pid = rng.choice(sorted(self.received))
            self.received.remove(pid)
            self.releasing.add(pid)
            self.log.append(f"-> PUBREL {pid}")
            self.feed(self.client.send(PubRel(pid)))
        elif self.due:
            sent = self.due.pop(rng.randrange(len(self.due)))
            self.feed(self.client.answer(sent, **self.answer_for(sent)))

    def answer_for(self, sent: Action) -> dict[str, object]:
        rng = self.rng
        command = getattr(sent, "command", None)
        kind = command.WhichOneof("command") if command is not None else "?"
        if rng.random() < 0.1 and kind != "close_session":
            self.log.append(f"   {kind} refused")
            return {"status": UNAVAILABLE, "message": "partition 0 has no master"}
        self.log.append(f"   {kind} ok")
        if kind == "qos2_receive":
            state = rng.choice((pb.QOS2_STATE_NEW, pb.QOS2_STATE_NEW, pb.QOS2_STATE_DUPLICATE))
            return {"qos2_state": state, "qos2_origin": b"o" * 16}
        if kind == "qos2_release":
            return {"qos2_state": pb.QOS2_STATE_RELEASED}
        return {}


@pytest.mark.parametrize("seed", SEEDS)
def test_random_traffic_keeps_the_session_honest(seed: int) -> None:
    rng = random.Random(seed)
    edge = SessionEdge.make(
        {0: ["t/#"], 5: ["t/#"]}, moved={5: ("n2", 1)}, receive_maximum=rng.choice((4, 8, 64))
    )
    client = Driver(edge)
    assert client.connect("c1", rng.choice((4, 5))).reason_code == 0
    run = Run(client, rng)
    try:
        for _ in range(STEPS):
            run.step()
        session = client.session
        epoch = 1
        while run.due:  # everything answered, in a random order
            sent = run.due.pop(rng.randrange(len(run.due)))
            run.feed(client.answer(sent, **run.answer_for(sent)))
            if not run.due and session.claims is not None and session.claims.unrecorded:
                # Routings whose record waits for the session's partition: it has a master
                # again, and the connection is re-attached there.
                epoch += 1
                edge.routes[6] = Route("n1", epoch, 1)
                run.log.append(f"   re-attach (epoch {epoch})")
                run.feed(session.reattach()[1])

        if session.state is State.CONNECTED:
            assert not run.publishing, run.publishing  # every publish answered
            assert not run.releasing, run.releasing
            window = session.inbound
            assert window is None or (window.count, window.bytes) == (0, 0)
            claims = session.claims
            assert claims is None or not (claims.routing or claims.unrecorded)
            assert not session.waiting
        else:
            assert run.closed
    except AssertionError:
        print(f"seed {seed}:\n" + "\n".join(run.log))
        raise
