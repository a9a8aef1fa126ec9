"""The membership agent's link to Consul after a network cut (found by the fault suite: seed
1218's cut-agreement run, docs/faults.md): when a cut between an agent and Consul heals, the
agent's blocking queries sent before it may sit on connections whose packets were dropped
(TCP retransmissions back off for many seconds), so the agent must read afresh once Consul
answers again, not wait for those queries. Between the agent and consul-dev sits a proxy
(tests/support/tcpproxy.py) whose frozen connections stay silent for good.

And the link's ACL token: agents given `--consul-token-file` agree through a consul-dev with
ACLs (`--acl-token-file`), and follow a rotation of the token without a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.trust.identity import PARTITION
from tests.support.agent_cluster import (
    ALL,
    AgentCluster,
    wait_until,
)
from tests.support.consuldev import start_consul_dev, write_token_file
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
    channel, stub = agents.node(2).stub(PARTITION)  # as node 2's partition service
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


@pytest.fixture
def acl_consul(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A consul-dev of the test's own with ACLs: (its address, its management token file)."""
    token_file = tmp_path / "consul-dev.token"
    write_token_file(token_file)
    server = start_consul_dev(tmp_path / "acl-consul.log", "--acl-token-file", str(token_file))
    try:
        yield server.addr, token_file
    finally:
        server.stop()


@pytest.mark.timeout(90)
def test_agents_with_a_token_file_agree_through_acls_and_follow_a_rotation(
    agents: AgentCluster, acl_consul: tuple[str, Path], tmp_path: Path
) -> None:
    addr, server_token = acl_consul
    agent_token = tmp_path / "agent.token"
    write_token_file(agent_token, server_token.read_text().strip())
    agents.consul = addr
    for i in (1, 2, 3):
        agents.start_agent(i, "--consul-token-file", str(agent_token))
    for i in (1, 2, 3):
        agents.start_standin(i, incarnation=1000 + i)
    agents.wait_members(1, ALL, timeout=15)
    # The server takes a new token: the agents, still sending the old one, are refused...
    new = write_token_file(server_token)
    wait_until(
        "n1 finds its token refused",
        lambda: not agents.node(1).status().consul_reachable,
        timeout=12,
        step=0.2,
    )
    # ... until their token file has it too: read again, no restart. (Within 2 x TTL of the
    # rotation, before their sessions lapse: nobody leaves the view.)
    write_token_file(agent_token, new)
    for i in (1, 2, 3):
        wait_until(
            f"n{i} reaches Consul again",
            lambda i=i: agents.node(i).status().consul_reachable,
            timeout=10,
            step=0.2,
        )
    agents.wait_members(1, ALL, timeout=5)
    log = (tmp_path / "n1-agent.log").read_text()
    assert "ACL not found" in log  # what Consul said, in the unreachable line
    assert new not in log  # the token itself never
