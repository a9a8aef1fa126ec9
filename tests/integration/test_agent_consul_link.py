"""The membership agent's link to Consul after a network cut (found by the fault suite: seed
1218's cut-agreement run, docs/faults.md): when a cut between an agent and Consul heals, the
agent's blocking queries sent before it may sit on connections whose packets were dropped
(TCP retransmissions back off for many seconds), so the agent must read afresh once Consul
answers again, not wait for those queries. Between the agent and consul-dev sits a proxy
(tests/support/tcpproxy.py) whose frozen connections stay silent for good."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hexmq.api.membership.v1 import membership_pb2 as pb
from tests.support.agent_cluster import (
    ALL,
    AgentCluster,
    wait_until,
)
from tests.support.tcpproxy import FreezableProxy


@pytest.fixture
def proxy(consul_dev: str) -> Iterator[FreezableProxy]:
    host, port = consul_dev.rsplit(":", 1)
    p = FreezableProxy((host, int(port)))
    try:
        yield p
    finally:
        p.close()


@pytest.mark.timeout(90)
def test_an_agent_reads_afresh_when_consul_answers_again_after_a_cut(
    agents: AgentCluster,
    proxy: FreezableProxy,
) -> None:
    # n1 reaches Consul through the proxy; n2 and n3 directly.
    consul = agents.consul
    agents.consul = proxy.addr
    agents.start_agent(1)
    agents.consul = consul
    agents.start_agent(2)
    agents.start_agent(3)
    for i in (1, 2, 3):
        agents.start_standin(i, incarnation=1000 + i)
    agents.wait_members(1, ALL, timeout=15)
    # The cut: long enough for n1's session renewal (every TTL/3, itself timing out after
    # TTL/3) to fail, shorter than the session's lapse (2 x TTL in consul-dev).
    proxy.freeze()
    wait_until(
        "n1 finds Consul unreachable",
        lambda: not agents.node(1).status().consul_reachable,
        timeout=12,
        step=0.2,
    )
    proxy.thaw()
    wait_until("n1 finds Consul again", lambda: agents.node(1).status().consul_reachable, 15, 0.2)
    # A change only n2's agent makes (its partition's in-sync set): n1 can learn it only
    # from its watch of the view.
    before = agents.node(2).view()
    assert before is not None
    assignment = next(pa for pa in before.partitions if pa.replicas[0] == "n2")
    follower = next(r for r in assignment.replicas if r != "n2")
    change = pb.InSyncChange(partition=assignment.partition, epoch=assignment.epoch)
    if follower in assignment.in_sync:
        change.remove.append(follower)
    else:
        change.add.append(follower)
    channel, stub = agents.node(2).stub()
    with channel:
        reply = stub.Propose(pb.ProposeRequest(incarnation=1002, in_sync=[change]), timeout=10)
    assert list(reply.rejected) == []
    assert reply.view_epoch > before.epoch
    took = wait_until(
        f"n1's view reaches epoch {reply.view_epoch}",
        lambda: (v := agents.node(1).view()) is not None and v.epoch >= reply.view_epoch,
        timeout=10,
    )
    assert took < 3.0, f"n1 saw the view {took:.1f} s after it was agreed"
