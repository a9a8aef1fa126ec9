"""A WRONG_MASTER or STALE_EPOCH answer makes the edge send the command once more to the master
the partition node named, at the epoch it named; a second such answer reaches the caller."""

from __future__ import annotations

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.links import PartitionLink
from services.edge.server import Edge, EdgeConfig

SC = pb.StatusCode


@pytest.fixture
def edge() -> Edge:
    edge = Edge(EdgeConfig(node_id="n1", host="127.0.0.1", port=0, membership="127.0.0.1:1"))
    hello = pb.Hello(edge_id="n1", edge_incarnation=1)
    for node in ("n1", "n2"):
        link = PartitionLink(node, f"{node}:0", hello, edge)
        link.connected = link.ready = True  # as after its stream opened and indexed
        edge.router.links[node] = link
    return edge


def misrouted(request_id: int, status: int, master: str, epoch: int) -> pb.PartitionFrame:
    result = pb.Result(
        request_id=request_id, status=status, current_master=master, current_epoch=epoch
    )
    return pb.PartitionFrame(events=[pb.PartitionEvent(result=result)])


def subscribe_command() -> pb.EdgeCommand:
    return pb.EdgeCommand(
        partition=5,
        partition_epoch=1,
        subscribe=pb.Subscribe(client_id="c", connection_id="k", subscriptions=[]),
    )


async def test_a_wrong_master_answer_re_sends_to_the_named_master(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    results: list[pb.Result] = []
    cmd = subscribe_command()
    n1.request(cmd, results.append)
    n1._dispatch(misrouted(cmd.request_id, SC.STATUS_CODE_WRONG_MASTER, "n2", 3))
    assert results == []
    (resent,) = n2._outgoing
    assert (resent.partition, resent.partition_epoch) == (5, 3)
    assert resent.WhichOneof("command") == "subscribe"
    n2._dispatch(pb.PartitionFrame(ok_request_ids=[resent.request_id]))
    assert [r.status for r in results] == [SC.STATUS_CODE_OK]
    assert edge.rerouted == 1


async def test_only_once_then_the_caller_hears_it(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    results: list[pb.Result] = []
    cmd = subscribe_command()
    n1.request(cmd, results.append)
    n1._dispatch(misrouted(cmd.request_id, SC.STATUS_CODE_STALE_EPOCH, "n2", 4))
    (resent,) = n2._outgoing
    n2._dispatch(misrouted(resent.request_id, SC.STATUS_CODE_WRONG_MASTER, "n1", 5))
    assert [r.status for r in results] == [SC.STATUS_CODE_WRONG_MASTER]
    assert n1._outgoing == [cmd]  # nothing sent a third time


async def test_publishes_to_several_partitions_are_not_re_routed(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    results: list[pb.Result] = []
    cmd = pb.EdgeCommand()
    cmd.publish.targets.extend(
        [pb.PartitionTarget(partition=1, epoch=1), pb.PartitionTarget(partition=2, epoch=1)]
    )
    n1.request(cmd, results.append)
    n1._dispatch(misrouted(cmd.request_id, SC.STATUS_CODE_WRONG_MASTER, "n2", 2))
    assert [r.status for r in results] == [SC.STATUS_CODE_WRONG_MASTER]
    assert edge.router.links["n2"]._outgoing == []
    single = pb.EdgeCommand()
    single.publish.targets.append(pb.PartitionTarget(partition=1, epoch=1))
    n1.request(single, results.append)
    n1._dispatch(misrouted(single.request_id, SC.STATUS_CODE_WRONG_MASTER, "n2", 2))
    (resent,) = edge.router.links["n2"]._outgoing
    assert resent.publish.targets[0].epoch == 2


async def test_no_re_route_to_an_unknown_or_unlinked_master(edge: Edge) -> None:
    n1 = edge.router.links["n1"]
    edge.router.links["n2"].ready = False
    results: list[pb.Result] = []
    for master in ("n2", "n9", ""):
        cmd = subscribe_command()
        n1.request(cmd, results.append)
        n1._dispatch(misrouted(cmd.request_id, SC.STATUS_CODE_WRONG_MASTER, master, 2))
    assert [r.status for r in results] == [SC.STATUS_CODE_WRONG_MASTER] * 3
