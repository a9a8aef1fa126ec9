"""The membership agent as processes: real `hexmq membership` agents agreeing through a real
`hexmq consul-dev`, each with a stand-in partition service (tests/support/partition_standin.py:
a real process serving the gRPC health check and watching its agent with an incarnation),
since only the agent is under test here. Full nodes run in test_cluster_cli.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import grpc
import pytest

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.trust.identity import PARTITION
from hexmq_cli import procs
from services.membership.consul_client import make_consul
from tests.conftest import HEXMQ
from tests.support.agent_cluster import (
    ALL,
    AgentCluster,
    end,
    spawn,
    wait_until,
)
from tests.support.ports import free_ports


@pytest.mark.timeout(60)
def test_three_agents_form_the_first_view_once_three_nodes_serve(agents: AgentCluster) -> None:
    for i in (1, 2, 3):
        agents.start_agent(i)
    agents.start_standin(1, 1001)
    agents.start_standin(2, 1002)
    time.sleep(1.0)  # with --expect 3, two serving nodes make no view
    assert agents.node(1).view() is None
    agents.start_standin(3, 1003)
    for i in (1, 2, 3):
        agents.wait_members(i, ALL, timeout=10)
    views = [agents.node(i).view() for i in (1, 2, 3)]
    assert all(v is not None and v.epoch == views[0].epoch for v in views)
    first = views[0]
    assert first is not None
    assert first.partition_count == 16
    assert first.replication_factor == 2
    assert sorted(first.target_members) == ["n1", "n2", "n3"]
    assert all(
        len(pa.replicas) == 2 and set(pa.in_sync) == set(pa.replicas) for pa in first.partitions
    )


@pytest.mark.timeout(60)
def test_a_partition_service_refusing_probes_is_removed_within_two_seconds(
    agents: AgentCluster,
) -> None:
    agents.start()
    agents.wait_members(1, ALL, timeout=15)
    standin = agents.node(3).standin
    assert standin is not None
    # Its health server stops while its watch of its own agent stays open: only the peers'
    # probes ("refused", confirmed by a TCP connect) can remove it.
    standin.send_signal(signal.SIGUSR1)
    took = agents.wait_members(1, {"n1": 1001, "n2": 1002}, timeout=5)
    assert took < 2.0, f"removal took {took:.2f} s"
    status = agents.node(1).status()
    n3 = next(m for m in status.members if m.node_id == "n3")
    assert not n3.in_view
    assert n3.registered  # its agent and session are alive: the probes removed it


@pytest.mark.timeout(60)
def test_a_killed_partition_service_is_removed_and_its_restart_readmitted(
    agents: AgentCluster,
) -> None:
    agents.start()
    agents.wait_members(1, ALL, timeout=15)
    before = agents.node(1).view()
    assert before is not None
    standin = agents.node(2).standin
    assert standin is not None
    standin.kill()
    standin.wait(timeout=5)
    took = agents.wait_members(1, {"n1": 1001, "n3": 1003}, timeout=5)
    assert took < 2.0, f"removal took {took:.2f} s"
    lost = agents.node(1).view()
    assert lost is not None
    # Partitions n2 mastered changed hands at the new view's epoch; the others kept theirs.
    for a, b in zip(before.partitions, lost.partitions, strict=True):
        if a.replicas[0] == "n2":
            assert b.replicas[0] != "n2"
            assert b.epoch > a.epoch
        else:
            assert b.epoch == a.epoch
    # A new incarnation of n2's partition service: admitted again (after --rejoin-settle).
    agents.start_standin(2, 2002)
    agents.wait_members(1, {"n1": 1001, "n2": 2002, "n3": 1003}, timeout=10)
    status = agents.node(1).status()
    kinds = {r.kind for r in status.recent}
    assert "failover" in kinds


@pytest.mark.timeout(60)
def test_a_paused_partition_service_is_removed_by_a_majority_and_rejoins(
    agents: AgentCluster,
) -> None:
    agents.start()
    agents.wait_members(1, ALL, timeout=15)
    standin = agents.node(3).standin
    assert standin is not None
    os.kill(standin.pid, signal.SIGSTOP)
    try:
        # Silence: probe timeouts (0.5 s), reported after --suspect-after (1 s) by n1 and n2,
        # a majority of the three members.
        agents.wait_members(1, {"n1": 1001, "n2": 1002}, timeout=8)
        status = agents.node(1).status()
    finally:
        os.kill(standin.pid, signal.SIGCONT)
    assert next(m for m in status.members if m.node_id == "n3").registered
    agents.wait_members(1, ALL, timeout=10)  # nobody suspects it any more: rejoined


@pytest.mark.timeout(60)
def test_propose_changes_the_in_sync_set_and_answers_with_the_view(agents: AgentCluster) -> None:
    agents.start()
    agents.wait_members(1, ALL, timeout=15)
    view = agents.node(1).view()
    assert view is not None
    pa = next(pa for pa in view.partitions if pa.replicas[0] == "n1")
    follower = pa.replicas[1]
    # As node 1's partition service: only it may ask for changes to its node's partitions.
    channel, stub = agents.node(1).stub(PARTITION)
    with channel:
        remove = pb.ProposeRequest(
            incarnation=1001,
            in_sync=[pb.InSyncChange(partition=pa.partition, epoch=pa.epoch, remove=[follower])],
        )
        reply = stub.Propose(remove, timeout=10)
        assert reply.view_epoch > view.epoch
        assert list(reply.rejected) == []
        after = agents.node(1).view()
        assert after is not None
        assert follower not in after.partitions[pa.partition].in_sync
        add = pb.ProposeRequest(
            incarnation=1001,
            in_sync=[pb.InSyncChange(partition=pa.partition, epoch=pa.epoch, add=[follower])],
        )
        reply = stub.Propose(add, timeout=10)
        assert list(reply.rejected) == []
        again = agents.node(1).view()
        assert again is not None
        assert follower in again.partitions[pa.partition].in_sync
        # A handover at an epoch the partition has left is moot: answered, and rejected.
        stale = pb.ProposeRequest(
            incarnation=1001,
            handovers=[pb.Handover(partition=pa.partition, epoch=pa.epoch + 100, to=follower)],
        )
        assert list(stub.Propose(stale, timeout=10).rejected) == [pa.partition]
        # Only the node's own partition service (its current incarnation) may propose.
        with pytest.raises(grpc.RpcError) as info:
            stub.Propose(pb.ProposeRequest(incarnation=7, in_sync=remove.in_sync), timeout=10)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        bad = pb.ProposeRequest(incarnation=1001, in_sync=[pb.InSyncChange(partition=99)])
        with pytest.raises(grpc.RpcError) as info:
            stub.Propose(bad, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "partition 99" in (info.value.details() or "")


@pytest.mark.timeout(60)
def test_lease_and_status_tell_what_the_agent_holds(agents: AgentCluster) -> None:
    agents.start()
    agents.wait_members(1, ALL, timeout=15)
    channel, stub = agents.node(2).stub()
    with channel:
        stream = stub.Lease(pb.LeaseRequest(), timeout=8)
        first = next(stream)
        assert first.valid
        assert 0 < first.valid_for_ms <= 10_000
        second = next(stream)  # the next renewal (every TTL/3)
        assert second.valid
        stream.cancel()
    status = agents.node(2).status()
    assert status.node_id == "n2"
    assert status.consul_reachable
    assert status.lease_valid
    assert status.view.epoch >= 1
    health = {m.node_id: m for m in status.members}
    assert set(health) == {"n1", "n2", "n3"}
    assert all(m.in_view and m.registered for m in health.values())
    assert health["n2"].probe == ""  # itself
    assert health["n1"].probe == health["n3"].probe == "ok"
    assert health["n3"].incarnation == 1003


@pytest.mark.timeout(60)
def test_an_agent_keeps_its_view_while_consul_is_away(agents: AgentCluster, tmp_path: Path) -> None:
    """A second consul-dev of its own (this test stops it), so the module's stays up."""
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    argv = [str(HEXMQ), "consul-dev", "--listen", addr, "--data-dir", str(tmp_path / "data")]
    server = spawn(argv, tmp_path / "own-consul.log")
    try:
        wait_until("consul-dev serving", lambda: procs.tcp_accepts(port), 15)
        agents.consul = addr
        agents.start()
        agents.wait_members(1, ALL, timeout=15)
        epoch = agents.node(1).view().epoch
        end(server)
        wait_until("n1 sees Consul gone", lambda: not agents.node(1).status().consul_reachable, 10)
        assert agents.node(1).view().epoch == epoch
        server = spawn(argv, tmp_path / "own-consul.log")
        wait_until("n1 reaches Consul again", lambda: agents.node(1).status().consul_reachable, 15)
        assert agents.node(1).view().epoch >= epoch
    finally:
        end(server)


def node_sessions(consul: str, cluster: str, node: str) -> tuple[list[str], str | None]:
    """The ids of the live sessions named for the node's agent, and the session holding the
    node's members/ key."""

    async def ask() -> tuple[list[str], str | None]:
        client = make_consul(consul)
        try:
            _, sessions = await client.session.list()
            _, entry = await client.kv.get(f"hexmq/{cluster}/members/{node}")
        finally:
            await client.close()
        named = [s["ID"] for s in sessions or [] if s.get("Name") == f"hexmq/{cluster}/{node}"]
        return named, (entry or {}).get("Session")

    return asyncio.run(ask())


@pytest.mark.timeout(60)
def test_a_restarted_agent_takes_over_at_once_from_its_killed_predecessor(
    agents: AgentCluster,
) -> None:
    agents.start()
    agents.wait_members(1, ALL, timeout=15)
    (old,), holder = node_sessions(agents.consul, agents.name, "n3")
    assert holder == old
    agent = agents.node(3).agent
    assert agent is not None
    agent.kill()
    agent.wait(timeout=5)
    agents.start_agent(3)

    # The old session would hold n3's keys for up to 2 x TTL (20 s): the new agent ends it,
    # writes the keys with its own, and n3 is back in the view (its partition service's watch
    # reconnects to the new agent meanwhile).
    def taken_over() -> bool:
        named, holder = node_sessions(agents.consul, agents.name, "n3")
        return len(named) == 1 and named[0] != old and holder == named[0]

    wait_until("the new agent holds n3's key with the only session of n3", taken_over, 5)
    agents.wait_members(1, ALL, timeout=8)


@pytest.mark.fault
@pytest.mark.timeout(90)
def test_a_killed_agent_is_removed_when_its_session_lapses(agents: AgentCluster) -> None:
    agents.start()
    agents.wait_members(1, ALL, timeout=15)
    agent = agents.node(3).agent
    assert agent is not None
    agent.kill()  # its partition service stays: only the session's lapse removes n3
    took = agents.wait_members(1, {"n1": 1001, "n2": 1002}, timeout=35, step=0.2)
    # Consul invalidates a session between TTL and 2 x TTL after its last renewal.
    assert 5 < took < 30, f"removal took {took:.1f} s"


@pytest.mark.timeout(90)
def test_agents_and_standins_take_the_plain_stop_when_started_with_sigint_ignored(
    agents: AgentCluster,
) -> None:
    # A shell starts a background job (`make test &`, a CI runner's) with SIGINT ignored, and
    # its children inherit that: the plain stop (SIGINT) must still end every process rather
    # than wait out end()'s grace and kill it.
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        agents.start()
    finally:
        signal.signal(signal.SIGINT, ignored)
    agents.wait_members(1, ALL, timeout=15)
    processes = [p for n in agents.nodes for p in (n.agent, n.standin) if p is not None]
    assert len(processes) == 6

    agents.stop()

    killed = [p.args for p in processes if p.returncode == -signal.SIGKILL]
    assert killed == [], f"ended only by SIGKILL after the grace: {killed}"
