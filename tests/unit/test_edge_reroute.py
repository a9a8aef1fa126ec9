"""WRONG_MASTER, STALE_EPOCH and MOVED answers at the edge, through its links and dispatcher:
a command is never sent to the node an answer names, only where the edge's view routes it; an
answer naming a newer epoch than the view holds the command until the view has it, one naming
an older (or the same) epoch sends it again by the view (docs/failover.md)."""

from __future__ import annotations

import pytest

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.trust.grpc_tls import ClusterTLS
from services.edge.config import EdgeConfig
from services.edge.links import PartitionLink
from services.edge.partition_hold import RETRY_PAUSE
from services.edge.server import Edge
from services.edge.tickets import refused_by_hold
from tests.support.edge_harness import never_dialled

SC = pb.StatusCode
HOLD = 10.0


def view(epoch: int, masters: dict[int, tuple[str, int]]) -> mpb.View:
    return mpb.View(
        epoch=epoch,
        partition_count=8,
        members=[mpb.Member(node_id=n) for n in ("n1", "n2")],
        partitions=[
            mpb.PartitionAssignment(
                partition=p,
                epoch=masters.get(p, ("n1", 1))[1],
                replicas=[masters.get(p, ("n1", 1))[0]],
            )
            for p in range(8)
        ],
    )


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def edge(clock: Clock) -> Edge:
    edge = Edge(
        EdgeConfig(
            node_id="n1", host="127.0.0.1", port=0, membership="127.0.0.1:1", failover_hold=HOLD
        ),
        cluster_tls=ClusterTLS.insecure(),
    )
    edge.dispatcher.clock = clock
    hello = pb.Hello(edge_id="n1", edge_incarnation=1)
    for node in ("n1", "n2"):
        edge.router.links[node] = PartitionLink(node, f"{node}:0", hello, edge, never_dialled)
    edge.apply_view(view(1, {}))
    for link in edge.router.links.values():
        up(link)
    return edge


def up(link: PartitionLink) -> None:
    """As after its stream opened and its index snapshot arrived."""
    link.connected = True
    link._dispatch(
        pb.PartitionFrame(
            events=[pb.PartitionEvent(index_update=pb.IndexUpdate(reset=True, snapshot_done=True))]
        )
    )


def answer(link: PartitionLink, request_id: int, status: int, master: str, epoch: int) -> None:
    result = pb.Result(
        request_id=request_id, status=status, current_master=master, current_epoch=epoch
    )
    link._dispatch(pb.PartitionFrame(events=[pb.PartitionEvent(result=result)]))


def subscribe_command() -> pb.EdgeCommand:
    return pb.EdgeCommand(subscribe=pb.Subscribe(client_id="c", connection_id="k"))


def taken(link: PartitionLink) -> list[pb.EdgeCommand]:
    """The commands queued on the link (as the next frame would carry them), then cleared."""
    out, link._outgoing = link._outgoing, []
    return out


async def test_a_wrong_master_answer_naming_a_newer_epoch_waits_for_the_view(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    results: list[pb.Result] = []
    edge.dispatcher.request(5, subscribe_command(), results.append)
    (cmd,) = taken(n1)
    assert (cmd.partition, cmd.partition_epoch) == (5, 1)
    answer(n1, cmd.request_id, SC.STATUS_CODE_WRONG_MASTER, "n2", 3)
    assert results == []
    assert taken(n2) == []
    edge.apply_view(view(3, {5: ("n2", 3)}))
    (resent,) = taken(n2)
    assert (resent.partition, resent.partition_epoch) == (5, 3)
    assert resent.command_id == cmd.command_id
    assert resent.WhichOneof("command") == "subscribe"
    n2._dispatch(pb.PartitionFrame(ok_request_ids=[resent.request_id]))
    assert [r.status for r in results] == [SC.STATUS_CODE_OK]


async def test_an_answer_naming_an_older_epoch_sends_again_by_the_view(
    edge: Edge, clock: Clock
) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    edge.apply_view(view(4, {5: ("n2", 4)}))
    results: list[pb.Result] = []
    edge.dispatcher.request(5, subscribe_command(), results.append)
    (cmd,) = taken(n2)
    # n2 has not seen view 4 yet and names n1 at epoch 1: ignored, n2 is asked again.
    answer(n2, cmd.request_id, SC.STATUS_CODE_STALE_EPOCH, "n1", 1)
    assert taken(n1) == []
    assert taken(n2) == []
    clock.now += RETRY_PAUSE
    edge.dispatcher._tick()
    (again,) = taken(n2)
    assert (again.partition_epoch, again.command_id) == (4, cmd.command_id)
    n2._dispatch(pb.PartitionFrame(ok_request_ids=[again.request_id]))
    assert [r.status for r in results] == [SC.STATUS_CODE_OK]


async def test_a_publish_to_several_partitions_goes_again_split_by_the_view(edge: Edge) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    results: list[pb.Result] = []
    cmd = pb.EdgeCommand()
    cmd.publish.targets.extend(
        [pb.PartitionTarget(partition=1, epoch=1), pb.PartitionTarget(partition=2, epoch=1)]
    )
    edge.dispatcher.publish(cmd, results.append)
    (whole,) = taken(n1)
    edge.apply_view(view(2, {2: ("n2", 2)}))  # a handover of partition 2: n1 answers MOVED
    answer(n1, whole.request_id, SC.STATUS_CODE_MOVED, "", 1)
    (part1,) = taken(n1)
    (part2,) = taken(n2)
    assert [(t.partition, t.epoch) for t in part1.publish.targets] == [(1, 1)]
    assert [(t.partition, t.epoch) for t in part2.publish.targets] == [(2, 2)]
    assert part1.command_id == part2.command_id == whole.command_id
    n1._dispatch(pb.PartitionFrame(ok_request_ids=[part1.request_id]))
    assert results == []
    n2._dispatch(pb.PartitionFrame(ok_request_ids=[part2.request_id]))
    assert [r.status for r in results] == [SC.STATUS_CODE_OK]


async def test_no_jump_to_an_unknown_or_unlinked_master_and_a_refusal_past_the_bound(
    edge: Edge, clock: Clock
) -> None:
    n1, n2 = edge.router.links["n1"], edge.router.links["n2"]
    n2._fail("test")
    results: list[pb.Result] = []
    for p, master in ((5, "n2"), (6, "n9"), (7, "")):
        edge.dispatcher.request(p, subscribe_command(), results.append)
        (cmd,) = taken(n1)
        answer(n1, cmd.request_id, SC.STATUS_CODE_WRONG_MASTER, master, 2)
    assert results == []
    assert taken(n2) == []
    clock.now += HOLD
    edge.dispatcher._tick()
    assert len(results) == 3
    assert all(refused_by_hold(r) for r in results)
    assert sorted(r.message.split(" ")[1] for r in results) == ["5", "6", "7"]
