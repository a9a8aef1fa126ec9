"""The edge during a failover, without processes (docs/failover.md, "The edge during a
failover"): services/edge/hold.py with a fake clock and its effects read as data (what is sent
where, held, answered, refused, in which order), and the subscription index by epoch
(services/edge/subscription_index.py)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.hold import PartitionCommands
from services.edge.partition_hold import RETRY_PAUSE
from services.edge.subscription_index import SubscriptionIndex
from services.edge.tickets import (
    Answer,
    Effect,
    Kind,
    Log,
    Send,
    Ticket,
    publish_partitions,
    refused_by_hold,
)

SC = pb.StatusCode
HOLD = 10.0
NODES = ("n1", "n2", "n3")


def view(
    epoch: int,
    masters: dict[int, tuple[str, int]],
    members: tuple[str, ...] = NODES,
) -> mpb.View:
    """A view of len(masters) partitions: partition -> (master, partition epoch)."""
    return mpb.View(
        epoch=epoch,
        partition_count=len(masters),
        members=[mpb.Member(node_id=n) for n in members],
        partitions=[
            mpb.PartitionAssignment(partition=p, epoch=e, replicas=[m] if m else [])
            for p, (m, e) in sorted(masters.items())
        ],
    )


class Recorder:
    """Answers heard by callers, by label."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, pb.Result]] = []

    def __call__(self, label: str) -> object:
        return lambda result: self.heard.append((label, result))

    def statuses(self) -> list[tuple[str, int]]:
        return [(label, r.status) for label, r in self.heard]


class World:
    """The core, a fake clock, and helpers to submit commands and run their answers."""

    def __init__(self, masters: dict[int, tuple[str, int]], *, up: tuple[str, ...] = NODES):
        self.core = PartitionCommands(HOLD)
        self.now = 0.0
        self.heard = Recorder()
        self.core.set_view(view(1, masters))
        self.sessions = dict.fromkeys(NODES, 1)
        for node in up:
            self.core.link_up(node, 1)

    def request(self, p: int, label: str, kind: Kind = Kind.REQUEST) -> tuple[Ticket, list[Effect]]:
        cmd = pb.EdgeCommand(subscribe=pb.Subscribe(client_id=label))
        ticket = Ticket(kind, (p,), cmd, self.heard(label))
        return ticket, self.run(self.core.submit(ticket, self.now))

    def publish(
        self, label: str, targets: tuple[int, ...], retained: int | None = None
    ) -> tuple[Ticket, list[Effect]]:
        cmd = pb.EdgeCommand()
        cmd.publish.message.topic = label
        for p in targets:
            cmd.publish.targets.add(partition=p, epoch=1)
        if retained is not None:
            cmd.publish.retained.partition = retained
        ticket = Ticket(Kind.REQUEST, publish_partitions(cmd), cmd, self.heard(label))
        return ticket, self.run(self.core.submit(ticket, self.now))

    def answer(self, send: Send, status: int = SC.STATUS_CODE_OK, **fields: object) -> list[Effect]:
        result = pb.Result(status=status, **fields)
        return self.run(self.core.answered(send.ticket, send.attempt, result, self.now))

    def link_down(self, node: str) -> None:
        self.core.link_down(node)

    def link_up(self, node: str) -> list[Effect]:
        self.sessions[node] += 1
        self.core.link_up(node, self.sessions[node])
        return self.run(self.core.pump_all(self.now))

    def set_view(self, v: mpb.View) -> list[Effect]:
        self.core.set_view(v)
        return self.run(self.core.pump_all(self.now))

    def tick(self, now: float) -> list[Effect]:
        self.now = now
        return self.run(self.core.tick(now))

    def run(self, effects: list[Effect]) -> list[Effect]:
        """Deliver Answers to their callers (as the adapter does) and return every effect."""
        for effect in effects:
            if isinstance(effect, Answer) and effect.ticket.on_result is not None:
                effect.ticket.on_result(effect.result)
        return effects


def sends(effects: list[Effect]) -> list[Send]:
    return [e for e in effects if isinstance(e, Send)]


def sent(effects: list[Effect]) -> list[tuple[str, str, int]]:
    """(label, node, epoch) of each Send, in order."""
    out = []
    for send in sends(effects):
        cmd = send.ticket.command
        assert cmd is not None
        label = (
            cmd.publish.message.topic
            if cmd.HasField("publish")
            else cmd.subscribe.client_id or cmd.WhichOneof("command") or ""
        )
        epoch = (
            cmd.publish.targets[0].epoch
            if cmd.HasField("publish") and cmd.publish.targets
            else cmd.partition_epoch
        )
        out.append((label, send.route.node, epoch))
    return out


# ----- holding and sending in order --------------------------------------------------------


def test_commands_for_a_partition_whose_link_is_down_wait_and_go_in_order() -> None:
    w = World({0: ("n1", 1), 1: ("n2", 1)}, up=("n2",))
    for label in ("a", "b", "c"):
        _, effects = w.request(0, label)
        assert effects == []
    assert w.core.held == 3
    _, effects = w.request(1, "other")  # another partition is not held up
    assert sent(effects) == [("other", "n2", 1)]
    effects = w.link_up("n1")
    assert sent(effects) == [("a", "n1", 1), ("b", "n1", 1), ("c", "n1", 1)]
    ids = [s.ticket.command_id for s in sends(effects)]
    assert ids == sorted(ids)
    assert len(set(ids)) == 3
    assert all(s.ticket.command.command_id == s.ticket.command_id for s in sends(effects))
    assert w.core.held == 0


def test_commands_for_a_master_outside_the_view_wait_for_a_view_naming_a_live_one() -> None:
    w = World({0: ("n1", 1)})
    w.set_view(view(2, {0: ("n1", 1)}, members=("n2", "n3")))  # n1 left; p0 offline
    _, effects = w.request(0, "a")
    assert effects == []
    effects = w.set_view(view(3, {0: ("n2", 3)}, members=("n2", "n3")))
    assert sent(effects) == [("a", "n2", 3)]


def test_requests_lost_with_a_link_go_back_ahead_of_newer_ones_with_their_ids() -> None:
    w = World({0: ("n1", 1)})
    _, first = w.request(0, "a")
    _, second = w.request(0, "b")
    ids = [s.ticket.command_id for s in sends(first + second)]
    w.link_down("n1")
    _, effects = w.request(0, "c")
    assert effects == []
    effects = w.link_up("n1")
    assert sent(effects) == [("a", "n1", 1), ("b", "n1", 1), ("c", "n1", 1)]
    assert [s.ticket.command_id for s in sends(effects)][:2] == ids
    # An answer to the send the broken link lost is ignored; the new send's answer counts.
    w.answer(sends(first)[0])
    assert w.heard.heard == []
    w.answer(sends(effects)[0])
    assert w.heard.statuses() == [("a", SC.STATUS_CODE_OK)]


def test_moved_goes_back_first_and_waits_for_a_newer_epoch_in_the_view() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    (b,) = sends(w.request(0, "b")[1])
    w.answer(a, SC.STATUS_CODE_MOVED, current_epoch=1)
    _, effects = w.request(0, "c")  # behind a: held
    assert effects == []
    w.answer(b, SC.STATUS_CODE_MOVED, current_epoch=1)  # between a and c
    assert w.set_view(view(2, {0: ("n1", 1)})) == []  # the partition's epoch has not moved
    effects = w.set_view(view(3, {0: ("n2", 3)}))
    assert sent(effects) == [("a", "n2", 3), ("b", "n2", 3), ("c", "n2", 3)]
    assert [s.ticket.command_id for s in sends(effects)][:2] == [
        a.ticket.command_id,
        b.ticket.command_id,
    ]
    assert w.heard.heard == []


def test_an_answer_naming_a_newer_epoch_holds_until_the_view_has_it_and_never_jumps() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    # n1 says n3 masters the partition at epoch 5: the edge's view (epoch 1) is behind.
    assert w.answer(a, SC.STATUS_CODE_WRONG_MASTER, current_master="n3", current_epoch=5) == []
    assert w.request(0, "b")[1] == []  # the partition is moving: new commands wait too
    assert w.set_view(view(4, {0: ("n2", 4)})) == []  # still older than what n1 named
    effects = w.set_view(view(5, {0: ("n3", 5)}))
    assert sent(effects) == [("a", "n3", 5), ("b", "n3", 5)]


def test_an_answer_naming_an_older_epoch_is_not_followed() -> None:
    """The view routes p0 to n2 at epoch 4; n2, behind the view, names n1 at epoch 3: the
    command is not sent to n1 but to n2 again after a pause."""
    w = World({0: ("n2", 4)})
    (a,) = sends(w.request(0, "a")[1])
    effects = w.answer(a, SC.STATUS_CODE_WRONG_MASTER, current_master="n1", current_epoch=3)
    assert effects == []
    assert w.tick(RETRY_PAUSE / 2) == []
    effects = w.tick(RETRY_PAUSE)
    assert sent(effects) == [("a", "n2", 4)]


def test_a_stale_epoch_answer_after_the_view_moved_on_goes_again_by_the_view() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    w.core.set_view(view(2, {0: ("n1", 2)}))  # the master restarted: a new epoch, same node
    effects = w.answer(a, SC.STATUS_CODE_STALE_EPOCH, current_master="n1", current_epoch=2)
    assert sent(effects) == [("a", "n1", 2)]


def test_a_view_move_waits_for_the_old_masters_answers_before_newer_commands() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    (b,) = sends(w.request(0, "b")[1])
    # A handover: n2 masters p0 at epoch 2; n1 is still a member and answers what it has.
    assert w.set_view(view(2, {0: ("n2", 2)})) == []
    assert w.request(0, "c")[1] == []  # would overtake a and b if they come back MOVED
    assert sends(w.answer(a)) == []  # answered; c still waits for b
    assert w.heard.statuses() == [("a", SC.STATUS_CODE_OK)]
    effects = w.answer(b, SC.STATUS_CODE_MOVED, current_epoch=1)
    assert sent(effects) == [("b", "n2", 2), ("c", "n2", 2)]


def test_requests_in_flight_to_a_master_that_left_the_view_are_taken_back_at_once() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    effects = w.set_view(view(2, {0: ("n2", 2)}, members=("n2", "n3")))
    (again,) = sends(effects)
    assert sent(effects) == [("a", "n2", 2)]
    w.answer(a)  # n1's late answer: ignored (the command went on to n2)
    assert w.heard.heard == []
    w.answer(again)
    assert w.heard.statuses() == [("a", SC.STATUS_CODE_OK)]


def test_an_unavailable_answer_is_asked_again_after_a_pause() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    assert w.answer(a, SC.STATUS_CODE_UNAVAILABLE, message="no role") == []
    assert w.request(0, "b")[1] == []
    effects = w.tick(RETRY_PAUSE)
    assert sent(effects) == [("a", "n1", 1), ("b", "n1", 1)]


# ----- the bound ---------------------------------------------------------------------------


def test_past_the_bound_held_commands_are_refused_naming_the_partition_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World({0: ("n1", 1), 1: ("n1", 1)}, up=())
    w.request(0, "a")
    w.request(1, "other")
    w.now = 4.0
    w.request(0, "b")
    assert w.tick(HOLD - 0.01) == []
    effects = w.tick(HOLD)
    assert sorted(w.heard.statuses()) == [
        ("a", SC.STATUS_CODE_UNAVAILABLE),
        ("other", SC.STATUS_CODE_UNAVAILABLE),
    ]
    refusal = dict(w.heard.heard)["a"]
    assert refused_by_hold(refusal)
    assert refusal.message.startswith("partition 0 has no master")
    assert "the link to its master n1 is down" in refusal.message
    logs = [e for e in effects if isinstance(e, Log)]
    assert [(e.level, e.message.split(":")[0]) for e in logs] == [
        (logging.WARNING, "partition 0"),
        (logging.WARNING, "partition 1"),
    ]
    # The same burst: b is refused without another log line.
    effects = w.tick(HOLD + 4.0)
    assert ("b", SC.STATUS_CODE_UNAVAILABLE) in w.heard.statuses()
    assert not [e for e in effects if isinstance(e, Log)]
    assert w.core.held == 0
    assert w.core.refused == 3
    # Once the partition has sent again, the next refusal is a new burst, logged again.
    w.link_up("n1")
    w.request(0, "c")
    w.link_down("n1")
    w.request(0, "d")
    effects = w.tick(2 * HOLD + 4.0)
    assert len([e for e in effects if isinstance(e, Log)]) == 1


def test_a_request_in_flight_is_not_refused_by_the_bound() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    assert w.tick(HOLD * 3) == []
    w.answer(a)
    assert w.heard.statuses() == [("a", SC.STATUS_CODE_OK)]


def test_a_command_held_again_keeps_its_first_submission_time_for_the_bound() -> None:
    w = World({0: ("n1", 1)})
    sends(w.request(0, "a")[1])
    w.now = HOLD - 1
    w.link_down("n1")
    effects = w.tick(HOLD)
    assert w.heard.statuses() == [("a", SC.STATUS_CODE_UNAVAILABLE)]
    assert len([e for e in effects if isinstance(e, Log)]) == 1


def test_a_withdrawn_request_is_never_sent_again() -> None:
    """Fault seed 3032: an OpenSession in flight to a master that could not commit it (cut off
    with the edge's node) came back WRONG_MASTER after the heal and went to the new master,
    taking the session from the connection its client had made meanwhile elsewhere. Once the
    edge gives the CONNECT up, nothing of it goes again."""
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    w.now = HOLD + 1
    assert w.run(w.core.withdraw(a.ticket, w.now)) == []
    assert w.set_view(view(2, {0: ("n2", 2)})) == []  # the old master's answer is awaited
    assert w.answer(a, SC.STATUS_CODE_WRONG_MASTER) == []
    assert w.heard.statuses() == []
    assert w.core.held == 0
    _b, effects = w.request(0, "b")
    assert sent(effects) == [("b", "n2", 2)]  # the partition is open: nothing waits for a


def test_a_withdrawn_request_lost_with_its_link_or_answered_is_ended() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    w.core.withdraw(a.ticket, w.now)
    w.link_down("n1")
    assert w.core.held == 0
    assert w.link_up("n1") == []
    # An answer that applied it still reaches its caller (who lets the session go).
    w2 = World({0: ("n1", 1)})
    (c,) = sends(w2.request(0, "c")[1])
    w2.core.withdraw(c.ticket, w2.now)
    w2.answer(c)
    assert w2.heard.statuses() == [("c", SC.STATUS_CODE_OK)]


def test_a_withdrawn_held_request_is_dropped_and_lets_the_next_go() -> None:
    w = World({0: ("n1", 1)}, up=())
    a, _ = w.request(0, "a")
    w.request(0, "b")
    assert w.core.held == 2
    assert w.run(w.core.withdraw(a, w.now)) == []  # the link is still down
    assert w.core.held == 1
    assert sent(w.link_up("n1")) == [("b", "n1", 1)]
    w.tick(HOLD * 2)
    assert w.heard.statuses() == []  # neither refused (withdrawn) nor answered (in flight)


def test_the_hold_must_be_positive() -> None:
    with pytest.raises(ValueError, match="failover hold must be more than 0 seconds"):
        PartitionCommands(0)


# ----- publishes for several partitions -----------------------------------------------------


def test_a_publish_with_a_held_target_is_split_and_answered_once() -> None:
    w = World({0: ("n1", 1), 1: ("n1", 1), 2: ("n1", 1)})
    w.core.saw_epoch(1, 7)  # p1 is moving to epoch 7: held
    whole, effects = w.publish("m", (0, 1), retained=2)
    parts = {s.ticket.partitions[0]: s for s in sends(effects)}
    assert sorted(parts) == [0, 2]  # p0's and the retained part go now, p1's waits
    p0 = parts[0].ticket.command
    p2 = parts[2].ticket.command
    assert p0 is not None
    assert p2 is not None
    assert [t.partition for t in p0.publish.targets] == [0]
    assert not p0.publish.HasField("retained")
    assert list(p2.publish.targets) == []
    assert p2.publish.retained.partition == 2
    assert p0.publish.message.topic == p2.publish.message.topic == "m"
    assert p0.command_id == p2.command_id == whole.command_id
    assert w.core.held == 1
    w.answer(parts[0])
    w.answer(parts[2])
    assert w.heard.heard == []  # the PUBACK waits for every part
    effects = w.set_view(view(7, {0: ("n1", 1), 1: ("n2", 7), 2: ("n1", 1)}))
    (last,) = sends(effects)
    assert sent(effects) == [("m", "n2", 7)]
    assert last.ticket.command.command_id == whole.command_id
    w.answer(last)
    assert w.heard.statuses() == [("m", SC.STATUS_CODE_OK)]


def test_a_split_publish_hears_the_first_failure_once_all_parts_answered() -> None:
    w = World({0: ("n1", 1), 1: ("n1", 1)})
    w.link_down("n1")
    w.core.link_up("n1", 5)
    w.core.saw_epoch(1, 3)
    _, effects = w.publish("m", (0, 1))
    (p0,) = sends(effects)
    w.answer(p0)
    w.tick(HOLD)  # p1's part is refused past the bound
    ((label, result),) = w.heard.heard
    assert label == "m"
    assert refused_by_hold(result)
    assert "partition 1" in result.message


def test_a_whole_publish_answered_moved_goes_again_split_per_partition() -> None:
    w = World({0: ("n1", 1), 1: ("n1", 1)})
    _, effects = w.publish("m", (0, 1))
    (whole,) = sends(effects)
    assert whole.ticket.partitions == (0, 1)
    # Which partition is moving the answer does not say: each part goes alone and tells.
    effects = w.answer(whole, SC.STATUS_CODE_MOVED, current_epoch=1)
    parts = sends(effects)
    assert [s.ticket.partitions for s in parts] == [(0,), (1,)]
    w.answer(parts[0])
    w.answer(parts[1], SC.STATUS_CODE_MOVED, current_epoch=1)
    assert w.heard.heard == []
    (again,) = sends(w.set_view(view(2, {0: ("n1", 1), 1: ("n2", 2)})))
    w.answer(again)
    assert w.heard.statuses() == [("m", SC.STATUS_CODE_OK)]


def test_a_publish_whose_partitions_are_open_goes_whole() -> None:
    w = World({0: ("n1", 1), 1: ("n1", 1)})
    _, effects = w.publish("m", (0, 1))
    (whole,) = sends(effects)
    assert [t.partition for t in whole.ticket.command.publish.targets] == [0, 1]
    w.answer(whole)
    assert w.heard.statuses() == [("m", SC.STATUS_CODE_OK)]


# ----- QoS 0, one-way commands, gates, re-attach -------------------------------------------


def test_a_qos0_publish_is_dropped_for_partitions_that_cannot_take_it_not_held() -> None:
    w = World({0: ("n1", 1), 1: ("n2", 1)}, up=("n1",))
    cmd = pb.EdgeCommand()
    cmd.publish.message.topic = "q0"
    cmd.publish.targets.add(partition=0)
    cmd.publish.targets.add(partition=1)
    ticket = Ticket(Kind.ONEWAY, (0, 1), cmd, None)
    effects = w.core.submit_qos0(ticket, w.now)
    assert [(s.ticket.partitions, s.route.node) for s in sends(effects)] == [((0,), "n1")]
    assert w.core.held == 0
    assert w.core.dropped_qos0 == 1


def test_one_way_commands_are_held_then_sent_untracked() -> None:
    w = World({0: ("n1", 1)}, up=())
    ticket, effects = w.request(0, "will", Kind.ONEWAY)
    assert effects == []
    assert w.core.held == 1
    effects = w.link_up("n1")
    assert sent(effects) == [("will", "n1", 1)]
    assert not ticket.in_flight
    w.link_down("n1")  # nothing to take back
    assert w.core.held == 0


def test_a_gate_opens_in_turn_with_the_held_commands() -> None:
    w = World({0: ("n1", 1)}, up=())
    w.request(0, "a")
    gate = Ticket(Kind.GATE, (0,), None, w.heard("gate"))
    assert w.run(w.core.submit(gate, w.now)) == []
    assert not w.core.open(0, w.now)
    effects = w.link_up("n1")
    assert sent(effects) == [("a", "n1", 1)]
    assert w.heard.statuses() == [("gate", SC.STATUS_CODE_OK)]
    assert w.core.open(0, w.now)


def test_a_reattach_goes_before_held_commands_which_wait_for_its_answer() -> None:
    w = World({0: ("n1", 1)})
    (a,) = sends(w.request(0, "a")[1])
    w.link_down("n1")
    w.request(0, "b")
    # The link comes back: the edge re-attaches the partition's connections before pumping.
    w.sessions["n1"] += 1
    w.core.link_up("n1", w.sessions["n1"])
    _attach_ticket, effects = w.request(0, "attach", Kind.ATTACH)
    assert sent(effects) == [("attach", "n1", 1)]
    assert w.run(w.core.pump_all(w.now)) == []  # a and b wait for the re-attach
    assert w.request(0, "c")[1] == []
    (attach,) = sends(effects)
    effects = w.answer(attach)
    assert sent(effects) == [("a", "n1", 1), ("b", "n1", 1), ("c", "n1", 1)]
    assert sends(effects)[0].ticket is a.ticket


def test_a_reattach_answered_moved_is_held_and_sent_again_first() -> None:
    w = World({0: ("n1", 1)})
    _, effects = w.request(0, "attach", Kind.ATTACH)
    (attach,) = sends(effects)
    w.request(0, "a")
    w.answer(attach, SC.STATUS_CODE_MOVED, current_epoch=1)
    effects = w.set_view(view(2, {0: ("n2", 2)}))
    assert sent(effects) == [("attach", "n2", 2)]


def test_publishes_wait_for_every_partitions_index_within_the_bound() -> None:
    w = World({0: ("n1", 1)})
    first = Ticket(Kind.GATE, (), None, w.heard("first"))
    assert w.run(w.core.await_index(first, w.now)) == []
    w.now = 5.0
    second = Ticket(Kind.GATE, (), None, w.heard("second"))
    w.run(w.core.await_index(second, w.now))
    w.tick(HOLD)
    assert w.heard.statuses() == [("first", SC.STATUS_CODE_UNAVAILABLE)]
    assert "subscription index" in w.heard.heard[0][1].message
    w.run(w.core.index_completed())
    assert w.heard.statuses()[1:] == [("second", SC.STATUS_CODE_OK)]
    third = Ticket(Kind.GATE, (), None, w.heard("third"))
    w.run(w.core.await_index(third, w.now))
    assert w.heard.statuses()[2:] == [("third", SC.STATUS_CODE_OK)]


def test_an_acknowledgement_goes_to_the_live_master_unless_the_partition_is_moving() -> None:
    w = World({0: ("n1", 1), 1: ("n2", 1)}, up=("n1",))
    route = w.core.ack_route(0)
    assert route is not None
    assert route.node == "n1"
    assert w.core.ack_route(1) is None  # no link
    w.core.saw_epoch(0, 2)
    assert w.core.ack_route(0) is None


# ----- the subscription index by epoch -----------------------------------------------------


def index_update(
    *,
    resets: dict[int, int] | None = None,
    entries: list[tuple[int, str, bool, int]] = (),
    done: bool = False,
    reset: bool = False,
) -> pb.IndexUpdate:
    return pb.IndexUpdate(
        reset=reset,
        reset_partitions=[
            pb.PartitionEpoch(partition=p, epoch=e) for p, e in (resets or {}).items()
        ],
        entries=[
            pb.IndexEntry(partition=p, filter=f, present=present, epoch=e)
            for p, f, present, e in entries
        ],
        snapshot_done=done,
    )


def routed(index: SubscriptionIndex, topic: str) -> set[int]:
    return {p for _, p, _ in index.match(topic)}


def test_a_deposed_master_cannot_undo_what_the_new_master_announced() -> None:
    v = view(3, {0: ("n2", 3)})
    index = SubscriptionIndex()
    index.apply("n1", index_update(resets={0: 1}, entries=[(0, "old/#", True, 1)], done=True), v)
    assert routed(index, "old/x") == {0}
    index.apply("n2", index_update(resets={0: 3}, entries=[(0, "new/#", True, 3)], done=True), v)
    assert index.epoch(0) == 3
    assert routed(index, "new/x") == {0}
    assert routed(index, "old/x") == set()
    # n1 comes back and announces its (older) epoch: ignored, reset and entries alike.
    index.apply(
        "n1",
        index_update(
            resets={0: 1}, entries=[(0, "new/#", False, 1), (0, "old/#", True, 1)], done=True
        ),
        v,
    )
    assert routed(index, "new/x") == {0}
    assert routed(index, "old/x") == set()


def test_a_reset_keeps_routing_the_old_filters_until_its_snapshot_ends() -> None:
    v = view(3, {0: ("n2", 3)})
    index = SubscriptionIndex()
    index.apply("n1", index_update(resets={0: 1}, entries=[(0, "a/#", True, 1)], done=True), v)
    index.apply("n2", index_update(resets={0: 3}, entries=[(0, "b/#", True, 3)]), v)
    # While n2's snapshot is still arriving, a publish for a/x still reaches partition 0.
    assert routed(index, "a/x") == {0}
    assert routed(index, "b/x") == {0}
    index.apply("n2", index_update(entries=[(0, "a/#", True, 3)]), v)  # announced again
    index.apply("n2", index_update(done=True), v)
    assert routed(index, "a/x") == {0}
    index.apply("n2", index_update(resets={0: 3}, done=True), v)  # announced without it
    assert routed(index, "a/x") == set()
    assert routed(index, "b/x") == set()


def test_an_entry_of_a_newer_epoch_implies_a_reset_and_an_older_one_is_ignored() -> None:
    v = view(5, {0: ("n2", 5)})
    index = SubscriptionIndex()
    index.apply("n1", index_update(resets={0: 2}, entries=[(0, "a/#", True, 2)], done=True), v)
    newer = index.apply("n2", index_update(entries=[(0, "b/#", True, 4)]), v)
    assert index.epoch(0) == 4
    assert newer == []
    index.apply("n1", index_update(entries=[(0, "c/#", True, 2)]), v)
    assert routed(index, "c/x") == set()
    index.apply("n2", index_update(done=True), v)
    assert routed(index, "a/x") == set()
    assert routed(index, "b/x") == {0}
    newer = index.apply("n3", index_update(resets={0: 9}), v)
    assert newer == [(0, 9)]  # the partition is moving past the view


def test_the_node_wide_reset_drops_only_the_partitions_that_node_set() -> None:
    v = view(2, {0: ("n1", 2), 1: ("n2", 2)})
    index = SubscriptionIndex()
    # n1 is an older partition service: node-wide reset, entries without an epoch.
    index.apply("n1", index_update(reset=True, entries=[(0, "a/#", True, 0)], done=True), v)
    index.apply("n2", index_update(resets={1: 2}, entries=[(1, "b/#", True, 2)], done=True), v)
    assert index.epoch(0) == 2  # the view's epoch of its partition
    index.apply("n1", index_update(reset=True, done=True), v)
    assert routed(index, "a/x") == set()
    assert routed(index, "b/x") == {1}


def test_the_index_is_complete_once_every_partition_had_one_from_some_master() -> None:
    v = view(1, {0: ("n1", 1), 1: ("n1", 1), 2: ("n2", 1)})
    index = SubscriptionIndex()
    # An older n1 announces nothing for its partitions (no subscriptions): its snapshot_done
    # still covers both.
    index.apply("n1", index_update(reset=True, done=True), v)
    assert index.indexed == {0, 1}
    index.apply("n2", index_update(resets={2: 1}), v)
    assert index.indexed == {0, 1}  # n2's snapshot has not ended
    index.apply("n2", index_update(done=True), v)
    assert index.indexed == {0, 1, 2}


@pytest.mark.parametrize("bad", ["0", "-1", "3601"])
def test_the_edge_refuses_a_bad_failover_hold_naming_it(bad: str) -> None:
    hexmq = Path(sys.executable).with_name("hexmq")
    argv = [str(hexmq), "edge", "--node-id", "n1", "--listen", "127.0.0.1:1"]
    argv += ["--membership", "127.0.0.1:2", f"--failover-hold={bad}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "--failover-hold must be more than 0 and at most 3600 seconds" in done.stderr
