"""The membership agent's pieces that need no Consul: its records, failure detection, the
bookkeeping of local requests, view change reports, the board and the view watcher."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.health import NOT_SERVING, SERVING, add_health
from hexmq.membership.client import ViewWatcher, describe_leave, leave_cluster
from hexmq.membership.view import has_left, master_of, partition_health
from hexmq.node_protocol import LEGACY, Support
from hexmq.trust.grpc_tls import ClusterTLS
from hexmq.trust.identity import MEMBERSHIP, Identity
from services.membership import main as membership_main
from services.membership.agent import LEAVE_RECHECK_S, MembershipAgent, nobody_stays
from services.membership.changes import RebalanceLog, describe, record_view_change
from services.membership.plan import HandoverRequest, InSyncRequest
from services.membership.probes import (
    FORGIVE_MS,
    FailureDetector,
    Outcome,
    ProbeChannel,
    ProbeTarget,
    looks_gone,
    tcp_refused,
)
from services.membership.proposals import ProposalBook, ProposalError, requests_from_proto
from services.membership.records import (
    ClusterKeys,
    MemberRecord,
    RecordError,
    RegistryTracker,
    encode_suspicions,
    parse_member_record,
    parse_suspicions,
    service_registration,
)
from services.membership.session import Reachability, lease_at
from services.membership.view_board import ViewBoard


def record(node: str = "n1", incarnation: int = 7) -> MemberRecord:
    return MemberRecord(
        node_id=node,
        partition_addr="127.0.0.1:7002",
        mqtt_addr="127.0.0.1:1883",
        membership_addr="127.0.0.1:7001",
        incarnation=incarnation,
    )


def view(epoch: int = 1, members: tuple[str, ...] = ("n1", "n2", "n3")) -> pb.View:
    """Three partitions: p0 mastered by n1 (in sync n1 n2), p1 by n2 (n2 n3), p2 by n3 (n3 n1)."""
    return pb.View(
        epoch=epoch,
        partition_count=3,
        replication_factor=2,
        members=[pb.Member(node_id=m, incarnation=1) for m in members],
        target_members=list(members),
        partitions=[
            pb.PartitionAssignment(partition=0, epoch=1, replicas=["n1", "n2"], in_sync=["n1"]),
            pb.PartitionAssignment(
                partition=1, epoch=1, replicas=["n2", "n3"], in_sync=["n2", "n3"]
            ),
            pb.PartitionAssignment(
                partition=2, epoch=1, replicas=["n3", "n1"], in_sync=["n3", "n1"]
            ),
        ],
    )


# --- records in Consul ------------------------------------------------------------------------


def test_a_member_record_round_trips_through_its_json() -> None:
    keys = ClusterKeys("demo")
    assert keys.member("n1") == "hexmq/demo/members/n1"
    assert keys.suspicions_of("n2") == "hexmq/demo/suspects/n2"
    assert keys.view == "hexmq/demo/view"
    value = record().to_json()
    assert json.loads(value) == {
        "node_id": "n1",
        "partition_addr": "127.0.0.1:7002",
        "mqtt_addr": "127.0.0.1:1883",
        "membership_addr": "127.0.0.1:7001",
        "incarnation": 7,
        "protocol": 1,
        "protocol_max": 2,
        "features": ["kick-acks", "zlib-snapshots"],
    }
    assert parse_member_record(keys.member("n1"), "n1", value) == record()
    assert keys.node_of("hexmq/demo/members/n1", keys.members) == "n1"
    assert keys.node_of("hexmq/demo/members/a/b", keys.members) is None


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (b"{", "not JSON"),
        (b"[]", "expected a JSON object"),
        (None, "empty value"),
        (b'{"node_id": "n1"}', "protocol must be a whole number >= 1, got None"),
        (b'{"protocol": 0}', "protocol must be a whole number >= 1, got 0"),
        (b'{"protocol": 1, "protocol_max": "2"}', "protocol_max must be a whole number"),
        (b'{"protocol": 2, "protocol_max": 1}', "protocol versions 2..1: need 1 <= lowest"),
        (b'{"protocol": 1, "features": "zlib"}', "features must be a list of names"),
        (b'{"protocol": 1, "features": ["zlib-snapshots"]}', "needs protocol version 2"),
        (b'{"protocol": 1, "node_id": "n2"}', "node_id 'n2' does not match"),
        (
            b'{"protocol": 1, "node_id": "n1", "partition_addr": "nowhere"}',
            "partition_addr must be HOST:PORT",
        ),
    ],
)
def test_a_malformed_member_record_is_named(value: bytes | None, error: str) -> None:
    with pytest.raises(RecordError, match=error) as info:
        parse_member_record("hexmq/demo/members/n1", "n1", value)
    assert str(info.value).startswith("hexmq/demo/members/n1: ")


def test_a_record_of_v0_2_0_speaks_version_1_and_v0_2_0_agents_read_ours() -> None:
    doc = json.loads(record().to_json())
    # A v0.2.0 agent takes a record only if its "protocol" is exactly 1 (and ignores the rest).
    assert doc["protocol"] == 1
    for key in ("protocol_max", "features"):
        del doc[key]
    old = parse_member_record("k", "n1", json.dumps(doc).encode())
    assert old.protocol == LEGACY
    assert old.registration(5).protocol == LEGACY


def test_a_record_of_a_later_release_parses_so_that_the_planner_can_say_why_it_is_refused() -> None:
    doc = json.loads(record().to_json())
    doc.update(protocol=3, protocol_max=4, features=["zlib-snapshots", "x-later"])
    later = parse_member_record("k", "n1", json.dumps(doc).encode())
    assert later.protocol == Support(3, 4, frozenset({"zlib-snapshots", "x-later"}))


def test_a_negative_incarnation_is_refused() -> None:
    doc = json.loads(record().to_json())
    doc["incarnation"] = -1
    with pytest.raises(RecordError, match="incarnation must be a whole number >= 0"):
        parse_member_record("k", "n1", json.dumps(doc).encode())


def test_suspicions_are_json_of_refused_or_silent() -> None:
    value = encode_suspicions({"n3": "silent", "n2": "refused"})
    assert value == b'{"n2": "refused", "n3": "silent"}'
    assert parse_suspicions("k", value) == {"n2": "refused", "n3": "silent"}
    assert parse_suspicions("k", b"{}") == {}
    with pytest.raises(RecordError, match="k: suspicion of 'n2' is 'dead'"):
        parse_suspicions("k", b'{"n2": "dead"}')
    with pytest.raises(ValueError, match="refused or silent"):
        encode_suspicions({"n2": "dead"})


def test_the_service_registration_carries_addresses_and_a_passing_ttl_check() -> None:
    assert service_registration(record(), 10) == {
        "name": "hexmq",
        "service_id": "n1",
        "address": "127.0.0.1",
        "port": 7002,
        "tags": [],
        "meta": {
            "node_id": "n1",
            "mqtt_addr": "127.0.0.1:1883",
            "membership_addr": "127.0.0.1:7001",
            "incarnation": "7",
        },
        "check": {"ttl": "10s", "status": "passing"},
    }


def test_the_service_registration_takes_the_discovery_service_name_and_tags() -> None:
    registration = service_registration(record(), 10, "mqtt-prod", ("prod", "eu"))
    assert (registration["name"], registration["tags"]) == ("mqtt-prod", ["prod", "eu"])


def test_a_registration_is_as_old_as_its_exact_record() -> None:
    tracker = RegistryTracker()
    tracker.update({"n1": (record(), 10), "n2": (record("n2"), 11)}, now_ms=1000)
    tracker.update({"n1": (record(), 10), "n2": (record("n2", incarnation=8), 11)}, now_ms=2500)
    regs = tracker.registrations()
    assert regs["n1"].since_ms == 1000  # unchanged
    assert regs["n2"].since_ms == 2500  # a new incarnation is a new registration
    assert regs["n2"].incarnation == 8
    tracker.update({"n2": (record("n2", incarnation=8), 11)}, now_ms=3000)
    assert set(tracker.registrations()) == {"n2"}  # n1's key is gone
    # The same value in a key deleted and written again (another CreateIndex) is new.
    tracker.update({"n2": (record("n2", incarnation=8), 12)}, now_ms=3500)
    assert tracker.registrations()["n2"].since_ms == 3500


def test_a_doubt_about_a_node_restarts_its_settle_time() -> None:
    tracker = RegistryTracker()
    tracker.update({"n1": (record(), 10), "n2": (record("n2"), 11)}, now_ms=1000)
    tracker.unsettle("n2", now_ms=4000)  # suspected, unanswered, or removed from the view
    tracker.update({"n1": (record(), 10), "n2": (record("n2"), 11)}, now_ms=4500)
    assert tracker.registrations()["n2"].since_ms == 4000
    assert tracker.registrations()["n1"].since_ms == 1000
    tracker.unsettle_all(now_ms=6000)  # this agent stalled or lost its watch
    assert {r.since_ms for r in tracker.registrations().values()} == {6000}


# --- failure detection --------------------------------------------------------------------------


def test_a_confirmed_refusal_is_reported_at_once() -> None:
    detector = FailureDetector(suspect_after_ms=1000)
    detector.watch(["n2", "n3"], now_ms=0)
    detector.record("n2", Outcome.OK, now_ms=100)
    detector.record("n2", Outcome.REFUSED, now_ms=200)
    assert detector.reports(200) == {"n2": "refused"}


def test_a_refusal_before_the_first_answer_is_only_silence() -> None:
    # A node the view has just admitted may not serve yet: refusals then are not evidence.
    detector = FailureDetector(suspect_after_ms=1000)
    detector.watch(["n2"], now_ms=0)
    detector.record("n2", Outcome.REFUSED, now_ms=200)
    assert detector.reports(200) == {}
    detector.record("n2", Outcome.REFUSED, now_ms=1000)
    assert detector.reports(1000) == {"n2": "silent"}


def test_silence_is_reported_only_after_suspect_after() -> None:
    detector = FailureDetector(suspect_after_ms=1000)
    detector.watch(["n2"], now_ms=0)
    detector.record("n2", Outcome.OK, now_ms=100)
    detector.record("n2", Outcome.FAILED, now_ms=600)
    assert detector.reports(1099) == {}
    assert detector.probe_states(1099) == {"n2": "silent"}
    detector.record("n2", Outcome.FAILED, now_ms=1100)
    assert detector.reports(1100) == {"n2": "silent"}


def test_an_answer_clears_the_report() -> None:
    detector = FailureDetector(suspect_after_ms=1000)
    detector.watch(["n2"], now_ms=0)
    detector.record("n2", Outcome.OK, now_ms=50)
    detector.record("n2", Outcome.REFUSED, now_ms=100)
    detector.record("n2", Outcome.OK, now_ms=300)
    assert detector.reports(300) == {}
    assert detector.probe_states(300) == {"n2": "ok"}


def stall(detector: FailureDetector, node: str, start_ms: int, length_ms: int) -> bool:
    """It answers at `start_ms`, its probes fail every 200 ms for `length_ms`, then it answers
    again: whether it was reported meanwhile."""
    detector.record(node, Outcome.OK, now_ms=start_ms)
    reported = False
    for t in range(start_ms + 200, start_ms + length_ms, 200):
        detector.record(node, Outcome.FAILED, now_ms=t)
        reported = reported or node in detector.reports(t)
    detector.record(node, Outcome.OK, now_ms=start_ms + length_ms)
    assert detector.reports(start_ms + length_ms) == {}
    return reported


def test_after_a_false_alarm_a_peer_is_allowed_twice_the_silence() -> None:
    """A peer reported silent that answers again was stalled, not dead: its next stall of the
    same length must not get it reported again (a joiner stalled by its catch-up flapped)."""
    detector = FailureDetector(suspect_after_ms=1000)
    detector.watch(["n2"], now_ms=0)
    detector.record("n2", Outcome.OK, now_ms=0)
    assert stall(detector, "n2", 200, 1400)  # reported after 1 s
    assert not stall(detector, "n2", 2000, 1800)  # 2 s allowed now
    assert stall(detector, "n2", 4000, 2400)  # but not more
    assert not stall(detector, "n2", 7000, 3800)  # 4 s after a second false alarm
    # Forgiven after FORGIVE_MS of answers: back to --suspect-after.
    quiet = 11_000 + FORGIVE_MS
    detector.record("n2", Outcome.OK, now_ms=quiet)
    assert stall(detector, "n2", quiet + 200, 1400)


def test_a_refusal_is_no_false_alarm() -> None:
    detector = FailureDetector(suspect_after_ms=1000)
    detector.watch(["n2"], now_ms=0)
    detector.record("n2", Outcome.OK, now_ms=0)
    assert stall(detector, "n2", 200, 1400)
    detector.record("n2", Outcome.FAILED, now_ms=2000)
    detector.record("n2", Outcome.FAILED, now_ms=3700)
    assert detector.reports(3700) == {"n2": "silent"}
    detector.record("n2", Outcome.REFUSED, now_ms=3800)  # it was gone: restarted
    detector.record("n2", Outcome.OK, now_ms=4500)
    # One false alarm (the first stall) counts, the restart does not: 2 s allowed, not 4.
    assert stall(detector, "n2", 4600, 2400)


def test_a_peer_that_leaves_the_view_is_forgotten_with_its_report() -> None:
    detector = FailureDetector(suspect_after_ms=1000)
    detector.watch(["n2"], now_ms=0)
    detector.record("n2", Outcome.OK, now_ms=50)
    detector.record("n2", Outcome.REFUSED, now_ms=100)
    detector.watch(["n3"], now_ms=200)
    assert detector.reports(5000) == {}
    detector.record("n2", Outcome.REFUSED, now_ms=300)  # a late probe of a peer no longer watched
    assert detector.reports(5000) == {}
    # Silence of a new peer counts from when it was first watched.
    detector.record("n3", Outcome.FAILED, now_ms=1100)
    assert detector.reports(1100) == {}
    assert detector.reports(1200) == {"n3": "silent"}


def test_only_unavailable_looks_like_a_gone_process() -> None:
    assert looks_gone(grpc.StatusCode.UNAVAILABLE)
    assert not looks_gone(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert not looks_gone(grpc.StatusCode.UNIMPLEMENTED)


async def test_a_tcp_connect_confirms_a_refusal_only_when_nothing_listens() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert not await tcp_refused(f"127.0.0.1:{port}", 1.0)
    assert await tcp_refused(f"127.0.0.1:{port}", 1.0)


@pytest.mark.parametrize(
    ("errno", "gone"),
    [
        # No such name: a container engine's DNS dropped a stopped container's name (Docker,
        # podman), Kubernetes a deleted pod's: nothing is there, as when refused.
        (socket.EAI_NONAME, True),
        # No answer from the DNS server (down, cut off): silence, never strong evidence.
        (socket.EAI_AGAIN, False),
    ],
)
async def test_a_peer_whose_name_is_gone_is_refused_not_silent(
    monkeypatch: pytest.MonkeyPatch, errno: int, gone: bool
) -> None:
    looked_up: list[str] = []

    def lookup(host: str, *args: Any, **kwargs: Any) -> Any:
        looked_up.append(host)
        raise socket.gaierror(errno, "lookup failed")

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    assert await tcp_refused("partition-3:7001", 1.0) is gone
    assert looked_up == ["partition-3"]


async def test_a_health_probe_tells_an_answering_process_from_a_gone_one() -> None:
    server = grpc.aio.server()
    health = add_health(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = ProbeChannel("n2", ProbeTarget(f"127.0.0.1:{port}", tls=False), ClusterTLS.insecure())
    try:
        await health.set("", SERVING)
        assert await channel.check(1.0) is Outcome.OK
        await health.set("", NOT_SERVING)  # alive, answering: not a failure
        assert await channel.check(1.0) is Outcome.OK
        await server.stop(grace=None)
        assert await channel.check(1.0) is Outcome.REFUSED
        # Back on the same port: the next probe connects afresh (no reconnect backoff).
        server = grpc.aio.server()
        health = add_health(server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await health.set("", SERVING)
        assert await channel.check(1.0) is Outcome.OK
    finally:
        await channel.close()
        await server.stop(grace=None)


# --- local requests --------------------------------------------------------------------------


def test_propose_requests_become_planner_requests() -> None:
    msg = pb.ProposeRequest(
        incarnation=5,
        in_sync=[pb.InSyncChange(partition=0, epoch=1, add=["n2"])],
        handovers=[pb.Handover(partition=2, epoch=1, to="n1")],
    )
    assert requests_from_proto(msg, 3) == [
        InSyncRequest(0, 1, frozenset({"n2"}), frozenset()),
        HandoverRequest(2, 1, "n1"),
    ]


@pytest.mark.parametrize(
    ("msg", "error"),
    [
        (pb.ProposeRequest(), "asks for no change"),
        (
            pb.ProposeRequest(in_sync=[pb.InSyncChange(partition=3, add=["n2"])]),
            "in_sync change of partition 3: the view has partitions 0-2",
        ),
        (
            pb.ProposeRequest(in_sync=[pb.InSyncChange(partition=0)]),
            "adds and removes nothing",
        ),
        (
            pb.ProposeRequest(in_sync=[pb.InSyncChange(partition=0, add=["n2"], remove=["n2"])]),
            r"\['n2'\] both added and removed",
        ),
        (
            pb.ProposeRequest(handovers=[pb.Handover(partition=1)]),
            "handover of partition 1: no node to hand over to",
        ),
        (
            pb.ProposeRequest(handovers=[pb.Handover(partition=1, epoch=0, to="n2")]),
            "handover of partition 1: .*epoch 0 is not positive",
        ),
    ],
)
def test_a_malformed_proposal_is_named(msg: pb.ProposeRequest, error: str) -> None:
    with pytest.raises(ProposalError, match=error):
        requests_from_proto(msg, 3)


async def test_a_ticket_is_answered_once_every_request_holds() -> None:
    book = ProposalBook()
    add_n2 = InSyncRequest(0, 1, frozenset({"n2"}), frozenset())
    ticket = book.add([add_n2], view(1))
    assert not ticket.reply.done()
    assert book.pending() == [add_n2]
    agreed = view(2)
    agreed.partitions[0].in_sync.append("n2")
    assert book.settle(agreed) == 1
    assert ticket.reply.result() == pb.ProposeReply(view_epoch=2, rejected=[])
    assert book.pending() == []


async def test_moot_handovers_additions_and_removals_are_rejected() -> None:
    # A removal is moot only once the partition moved on: its master must not shrink the set
    # it counts acknowledgements from (seed 4086; tests/unit/test_replication_core.py).
    book = ProposalBook()
    handover = HandoverRequest(1, 1, "n3")
    add = InSyncRequest(0, 1, frozenset({"n2"}), frozenset())
    remove = InSyncRequest(2, 1, frozenset(), frozenset({"n1"}))
    ticket = book.add([handover, add, remove], view(1))
    moved_on = view(2)
    for pa in moved_on.partitions:
        pa.epoch = 2  # every partition changed master: all three requests are moot
    book.settle(moved_on)
    assert ticket.reply.result() == pb.ProposeReply(view_epoch=2, rejected=[0, 1, 2])


async def test_a_request_already_holding_is_answered_at_once() -> None:
    book = ProposalBook()
    ticket = book.add([InSyncRequest(1, 1, frozenset({"n3"}), frozenset())], view(4))
    assert ticket.reply.result() == pb.ProposeReply(view_epoch=4)
    assert len(book) == 0


async def test_the_same_request_from_two_calls_is_planned_once() -> None:
    book = ProposalBook()
    add = InSyncRequest(0, 1, frozenset({"n2"}), frozenset())
    first = book.add([add], view(1))
    book.add([add], view(1))
    assert book.pending() == [add]
    book.drop(first)
    assert book.pending() == [add]


# --- view changes, as operators see them --------------------------------------------------------


def test_a_partitions_master_is_its_first_replica_or_none() -> None:
    v = view()
    assert [master_of(pa) for pa in v.partitions] == ["n1", "n2", "n3"]
    assert master_of(pb.PartitionAssignment(partition=0, epoch=1)) == ""


def test_partition_health_counts_offline_and_under_replicated() -> None:
    v = view(members=("n1", "n3"))  # n2 gone: p1's master is not a member
    assert partition_health(v).offline == 1
    assert partition_health(v).under_replicated == 1  # p0 has one in-sync replica of rf 2


def test_a_view_change_is_described_in_one_line() -> None:
    old, new = view(4), view(5, members=("n1", "n3"))
    new.partitions[1].replicas[:] = ["n3"]
    new.partitions[1].in_sync[:] = ["n3"]
    new.partitions[1].epoch = 5
    records = [
        pb.FailoverRecord(partition=1, epoch=5, from_node="n2", to_node="n3", kind="failover")
    ]
    assert describe(old, new, records) == (
        "view 5 (was 4); members -n2 (n1, n3); failover p1 n2->n3 epoch 5; "
        "0 offline, 2 under-replicated"
    )
    assert describe(None, view(1), []) == (
        "view 1: first view, members n1, n2, n3, 3 partitions, rf 2"
    )


def test_many_failovers_are_summed_up_by_kind() -> None:
    records = [
        pb.FailoverRecord(partition=p, epoch=5, from_node="n2", to_node="n1", kind="failover")
        for p in range(10)
    ]
    line = describe(view(4), view(5), records)
    assert "failover p7 n2->n1 epoch 5" in line
    assert "and 2 more failover" in line


# --- the lease, Consul reachability ---------------------------------------------------------------


def test_the_lease_is_valid_for_a_ttl_after_the_last_renewal() -> None:
    assert lease_at(None, 10, now=100.0).valid is False
    lease = lease_at(100.0, 10, now=103.0)
    assert lease.valid
    assert lease.valid_for_ms == 7000
    assert lease_at(100.0, 10, now=110.0).valid is False


def test_consul_trouble_is_logged_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    reach = Reachability()
    caplog.set_level(logging.INFO, logger="hexmq.membership")
    for part in ("session", "view", "members"):
        reach.report(part, None)
    assert reach.ok
    for part in ("session", "view", "view", "members"):
        reach.report(part, OSError("connection refused"))
    assert not reach.ok
    for part in ("session", "view", "members"):
        reach.report(part, None)
    assert reach.ok
    messages = [r.getMessage() for r in caplog.records]
    assert [m.split(" (")[0].split(":")[0] for m in messages] == [
        "Consul reachable",
        "Consul unreachable",
        "Consul reachable",
    ]
    assert "session: OSError: connection refused" in messages[1]


# --- the command line ----------------------------------------------------------------------------


def parse(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    membership_main.add_arguments(parser)
    return parser.parse_args(
        [
            *("--node-id", "n1", "--listen", "127.0.0.1:7001"),
            *("--partition-addr", "127.0.0.1:7002", "--mqtt-addr", "127.0.0.1:1883"),
            *extra,
        ]
    )


def test_the_agent_options_default_as_documented() -> None:
    config = membership_main.agent_config(parse("--consul", "127.0.0.1:8501"))
    assert (config.cluster, config.expect, config.session_ttl_s) == ("hexmq", 1, 10)
    assert config.membership_addr == "127.0.0.1:7001"  # --advertise defaults to --listen
    assert (config.probe_interval_s, config.probe_timeout_s) == (0.2, 0.5)
    assert (config.suspect_after_s, config.rejoin_settle_s) == (1.0, 1.0)


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (("--session-ttl", "5"), "--session-ttl must be 10-86400 seconds"),
        (("--expect", "0"), "--expect must be at least 1"),
        (("--probe-interval", "0"), "--probe-interval must be more than 0"),
        (("--suspect-after", "-1"), "--suspect-after must be more than 0"),
        (("--rejoin-settle", "-1"), "--rejoin-settle must be 0 or more"),
        (("--cluster", "a/b"), "--cluster must be 1-63 letters"),
        (("--consul", "localhost"), "--consul: a Consul address is HOST:PORT"),
        (("--advertise", "x"), "--advertise must be HOST:PORT"),
        (("--rf", "0"), "--rf must be at least 1"),
    ],
)
def test_a_bad_agent_option_is_named(extra: tuple[str, ...], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        membership_main.agent_config(parse(*extra))


# --- the board and the watcher ------------------------------------------------------------------


async def test_the_board_serves_nothing_before_the_first_view_then_newer_ones_only() -> None:
    board = ViewBoard()
    assert board.view is None
    waiter = asyncio.create_task(board.newer_than(0))
    await asyncio.sleep(0)
    assert not waiter.done()
    board.publish(view(1))
    assert (await asyncio.wait_for(waiter, 1)).epoch == 1
    later = asyncio.create_task(board.newer_than(1))
    await asyncio.sleep(0)
    assert not later.done()
    board.publish(view(2))
    assert (await asyncio.wait_for(later, 1)).epoch == 2
    with pytest.raises(ValueError, match="not newer"):
        board.publish(view(1))


class ScriptedMembership(pb_grpc.MembershipServiceServicer):
    """Streams views 1..3 to every watcher and records what each asked for."""

    def __init__(self) -> None:
        self.requests: list[pb.WatchRequest] = []

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.View]:
        self.requests.append(request)
        for epoch in range(request.after_epoch + 1, 4):
            yield view(epoch)
        await asyncio.Event().wait()


async def test_a_failing_listener_does_not_stop_later_views() -> None:
    servicer = ScriptedMembership()
    server = grpc.aio.server()
    pb_grpc.add_MembershipServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen: list[int] = []
    third = asyncio.Event()

    async def listener(v: pb.View) -> None:
        seen.append(v.epoch)
        if v.epoch == 3:
            third.set()
        if v.epoch == 1:
            raise RuntimeError("a bug in the listener")

    target = f"127.0.0.1:{port}"
    watcher = ViewWatcher(
        target,
        listener,
        incarnation=42,
        dial=lambda: ClusterTLS.insecure().channel(target, peer=Identity(MEMBERSHIP, "n1")),
    )
    watcher.start()
    try:
        await asyncio.wait_for(third.wait(), 5)
    finally:
        await watcher.stop()
        await server.stop(grace=None)
    assert seen == [1, 2, 3]
    assert servicer.requests == [pb.WatchRequest(after_epoch=0, incarnation=42)]


def test_a_view_change_is_counted_and_traced(tmp_path: Path) -> None:
    tracing = telemetry.setup_tracing("membership", "n1", trace_dir=tmp_path)
    registry = telemetry.METRICS.registry

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return registry.get_sample_value(name, labels or {}) or 0.0

    before = (
        sample("hexmq_view_changes_total"),
        sample("hexmq_failovers_total", {"kind": "failover"}),
    )
    old, new = view(4), view(5, members=("n1", "n3"))
    records = [
        pb.FailoverRecord(partition=1, epoch=5, from_node="n2", to_node="n3", kind="failover")
    ]
    try:
        record_view_change(tracing, "n1", old, new, records)
    finally:
        tracing.shutdown()
    assert sample("hexmq_view_changes_total") == before[0] + 1
    assert sample("hexmq_failovers_total", {"kind": "failover"}) == before[1] + 1
    assert sample("hexmq_view_epoch") == 5
    assert sample("hexmq_partitions_offline") == 1  # p1's master n2 is not a member
    assert sample("hexmq_partitions_under_replicated") == 1
    lines = "".join(p.read_text() for p in tmp_path.glob("*.jsonl"))
    assert '"membership.view"' in lines
    assert '"hexmq.view.previous_epoch"' in lines


def _view_spans(trace_dir: Path) -> list[dict[str, object]]:
    """The membership.view spans written to trace_dir: their attributes, start and end."""
    spans = []
    for path in trace_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for sp in ss["spans"]:
                        if sp["name"] != "membership.view":
                            continue
                        attrs = {
                            a["key"]: next(iter(a["value"].values())) for a in sp["attributes"]
                        }
                        spans.append(
                            {
                                **attrs,
                                "start": int(sp["startTimeUnixNano"]),
                                "end": int(sp["endTimeUnixNano"]),
                            }
                        )
    return spans


def test_a_view_span_names_a_lost_node_only_when_it_follows_the_last_view(
    tmp_path: Path,
) -> None:
    """An agent that missed views (it was cut off from Consul: 4 -> 6) cannot say which one
    removed n2; naming it under 6 would file the loss under the wrong view in the Spark job's
    failover timeline (found by the fault suite's trace cross-check, seed 1218)."""
    tracing = telemetry.setup_tracing("membership", "n1", trace_dir=tmp_path)
    began = time.time_ns() - 2_000_000_000
    try:
        record_view_change(tracing, "n1", view(4), view(5, members=("n1", "n3")), [], began)
        record_view_change(tracing, "n1", view(4), view(6, members=("n1", "n3")), [], began)
    finally:
        tracing.shutdown()
    by_epoch = {span["hexmq.view.epoch"]: span for span in _view_spans(tmp_path)}
    assert by_epoch["5"]["hexmq.node.lost"] == "n2"
    assert by_epoch["5"]["start"] == began  # from the first doubt
    assert "hexmq.node.lost" not in by_epoch["6"]
    assert by_epoch["6"]["hexmq.view.previous_epoch"] == "4"
    assert by_epoch["6"]["start"] == by_epoch["6"]["end"]  # no doubt to vouch for


async def test_an_agent_whose_loop_dies_asks_to_stop(tmp_path: Path) -> None:
    config = membership_main.agent_config(parse())
    tracing = telemetry.setup_tracing("membership", "n1")
    stopped = asyncio.Event()
    agent = MembershipAgent(config, tracing, on_fatal=stopped.set, tls=ClusterTLS.insecure())

    async def broken_loop() -> None:
        raise RuntimeError("a bug")

    task = asyncio.create_task(broken_loop())
    task.add_done_callback(agent._task_ended)
    with pytest.raises(RuntimeError):
        await task
    await asyncio.sleep(0)
    assert stopped.is_set()
    assert agent.failed
    tracing.shutdown()


# --- join, leave and rebalance (docs/failover.md, "Join" and "Leave") ---------------------------


async def test_an_agent_asked_to_leave_before_any_view_has_left_at_once() -> None:
    # SIGTERM to an agent of a node that never got into a view (no cluster yet): nothing to
    # hand over, so it stops at once instead of waiting --leave-timeout for a view.
    config = membership_main.agent_config(parse())
    tracing = telemetry.setup_tracing("membership", "n1")
    agent = MembershipAgent(config, tracing, on_fatal=lambda: None, tls=ClusterTLS.insecure())
    reply = await asyncio.wait_for(agent.leave(60.0), 1.0)
    assert reply.left
    tracing.shutdown()


async def test_a_leave_stops_waiting_once_every_other_member_leaves_too() -> None:
    """`docker compose down` sends SIGTERM to every node's services together: every node
    leaves, nobody can take the partitions, and each leave waited its whole --leave-timeout
    (down took 43-51 s, issue 27). While another member stays, the leave waits as before."""
    config = membership_main.agent_config(parse())  # node n1
    tracing = telemetry.setup_tracing("membership", "n1")
    agent = MembershipAgent(config, tracing, on_fatal=lambda: None, tls=ClusterTLS.insecure())
    agent.partition_attached(7)
    agent._adopt(None, view(3))
    n2_leaving = replace(record("n2"), leaving=True)
    n1 = (replace(record(), leaving=True), 10)
    agent.registry.update({"n1": n1, "n2": (n2_leaving, 11), "n3": (record("n3"), 12)}, 0)
    leave = asyncio.create_task(agent.leave(60.0))
    await asyncio.sleep(3 * LEAVE_RECHECK_S)
    assert not leave.done(), "n3 stays: it can take n1's partitions"
    n3_leaving = replace(record("n3"), leaving=True)
    agent.registry.update({"n1": n1, "n2": (n2_leaving, 11), "n3": (n3_leaving, 12)}, 0)
    reply = await asyncio.wait_for(leave, 10)  # not the 60 s --leave-timeout
    assert not reply.left
    assert reply.nobody_stays
    assert reply.partitions_held == 2
    assert "nobody can take the 2 partitions held here" in describe_leave(reply, 60.0)
    tracing.shutdown()


def test_nobody_stays_when_every_other_member_leaves_or_is_gone() -> None:
    regs = {n: record(n).registration(0) for n in ("n1", "n2", "n3")}
    leaving = {n: replace(r, leaving=True) for n, r in regs.items()}
    assert not nobody_stays(view(3), regs, "n1")
    assert not nobody_stays(view(3), {**regs, "n2": leaving["n2"]}, "n1")
    assert nobody_stays(view(3), {**leaving, "n1": regs["n1"]}, "n1")
    assert nobody_stays(view(3), {"n1": regs["n1"], "n3": leaving["n3"]}, "n1")  # n2 gone
    # A registered node that is no member does not count: it holds no view's trust yet.
    assert nobody_stays(view(3, members=("n1",)), regs, "n1")
    # Before its own registration is seen, nothing is known of the others'.
    assert not nobody_stays(view(3), {}, "n1")
    assert not nobody_stays(view(3), {"n2": leaving["n2"], "n3": leaving["n3"]}, "n1")


async def test_a_node_that_has_left_registers_as_serving_nothing() -> None:
    """Between the view letting a leaving node go and its services stopping, its registration
    said it served: an agent of v0.2.0 (which reads no `leaving`) admitted it again as a joining
    node (the mixed-cluster leave test saw it). Once left, it registers incarnation 0."""
    config = membership_main.agent_config(parse())  # node n1
    tracing = telemetry.setup_tracing("membership", "n1")
    agent = MembershipAgent(config, tracing, on_fatal=lambda: None, tls=ClusterTLS.insecure())
    agent.partition_attached(7)
    holding = view(3)
    agent._adopt(None, holding)
    leave = asyncio.create_task(agent.leave(60.0))
    await asyncio.sleep(0)
    assert agent.record().leaving
    assert agent.record().incarnation == 7  # still holds p0 and p2: serving
    gone = view(4, members=("n2", "n3"))  # n1 no member, no target ...
    for pa in gone.partitions:  # ... and no replica
        pa.ClearField("replicas")
        pa.ClearField("in_sync")
        pa.replicas.extend(("n2", "n3"))
        pa.in_sync.extend(("n2", "n3"))
    agent._adopt(holding, gone)
    assert (await asyncio.wait_for(leave, 1.0)).left
    assert agent.record().incarnation == 0
    tracing.shutdown()


def test_a_leaving_member_record_says_so_and_others_read_as_before() -> None:
    leaving = replace(record(), leaving=True)
    doc = json.loads(leaving.to_json())
    assert doc["leaving"] is True
    assert parse_member_record("k", "n1", leaving.to_json()) == leaving
    assert parse_member_record("k", "n1", leaving.to_json()).registration(5).leaving
    assert "leaving" not in json.loads(record().to_json())
    doc["leaving"] = "yes"
    with pytest.raises(RecordError, match="leaving must be true or false, got 'yes'"):
        parse_member_record("k", "n1", json.dumps(doc).encode())


def test_partitions_moving_count_catching_up_handover_and_leaving_replicas() -> None:
    v = view()  # p0: n2 catching up (not in sync)
    assert partition_health(v).moving == 1
    v.partitions[1].handover_to = "n3"
    assert partition_health(v).moving == 2
    v.leaving.append("n1")
    v.target_members.remove("n1")
    assert partition_health(v).moving == 3  # p2 has a replica on n1


def test_a_node_has_left_once_no_partition_member_or_target_holds_it() -> None:
    v = view()
    assert not has_left(v, "n1")
    del v.members[0]
    v.target_members.remove("n1")
    assert not has_left(v, "n1")  # p0 and p2 still hold it
    for pa in v.partitions:
        if "n1" in pa.replicas:
            pa.replicas.remove("n1")
        if "n1" in pa.in_sync:
            pa.in_sync.remove("n1")
    assert has_left(v, "n1")


def test_a_rebalance_is_logged_when_it_starts_and_when_it_ends() -> None:
    log = RebalanceLog()
    settled = view()
    settled.partitions[0].in_sync.append("n2")
    assert log.observe(settled, 1_000) is None  # nothing moving, nothing started
    moving = view(epoch=2)
    moving.joining.append("n3")
    start = log.observe(moving, 2_000)
    assert start is not None
    assert start.startswith("rebalance started in view 2: 1 of 3 partitions moving (joining n3)")
    assert log.observe(view(epoch=3), 3_000) is None  # still moving: no line
    done = view(epoch=4)
    done.partitions[0].in_sync.append("n2")
    end = log.observe(done, 4_500)
    assert end is not None
    assert end.startswith("rebalance finished in view 4 after 2.5s (views 2-4")
    assert log.observe(done, 5_000) is None


async def test_a_service_stops_asking_to_leave_once_the_agent_says_nobody_stays() -> None:
    """The partition service asks its agent again until the reply says `left`: a reply that
    says `nobody_stays` ends it too (it asked again at once, for its whole --leave-timeout:
    the last node of a `docker compose down` took 60 s to stop)."""
    calls = []

    class Agent(pb_grpc.MembershipServiceServicer):
        async def Leave(self, request: pb.LeaveRequest, context: Any) -> pb.LeaveReply:
            calls.append(request.wait_ms)
            return pb.LeaveReply(view_epoch=9, partitions_held=5, nobody_stays=True)

    server = grpc.aio.server()
    pb_grpc.add_MembershipServiceServicer_to_server(Agent(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        target = f"127.0.0.1:{port}"
        reply = await asyncio.wait_for(
            leave_cluster(target, lambda: grpc.aio.insecure_channel(target), 60.0), 10
        )
    finally:
        await server.stop(None)
    assert reply is not None
    assert reply.nobody_stays
    assert len(calls) == 1
