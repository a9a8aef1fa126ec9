"""How the partition service's adapters are put together: each is given its collaborators when
built (services/partition/main.py builds them in the order they need each other), and the one
link back, the replication driver releasing the group commit's batches, is a function of the
commit queue and the node alone (group_commit.release_batches), given to the driver when built."""

from __future__ import annotations

import argparse
import asyncio
import functools
from types import SimpleNamespace
from typing import Any, cast

import pytest

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.pacing import FlushPacer
from hexmq.trust.grpc_tls import ClusterTLS
from services.partition.commit_queue import CommitQueue
from services.partition.delivery import QueueLimits
from services.partition.effects import Effect, HandoffReady
from services.partition.group_commit import release_batches
from services.partition.options import (
    add_arguments,
    check_options,
    queue_limits,
    replication_limits,
)
from services.partition.peers import ReplicationDriver
from services.partition.qos2_seen import SeenOrigins
from services.partition.replication import HSET, Entry, Ready, ReplicationLimits
from services.partition.store import redis_client
from services.partition.wiring import ServiceParts, assemble


def test_the_driver_releases_batches_through_the_release_it_was_built_with() -> None:
    released: list[tuple[object, frozenset[int]]] = []
    committed = [("first", frozenset[int]()), ("second", frozenset({3}))]
    core = SimpleNamespace(ready=lambda: Ready(committed=list(committed)))
    driver = ReplicationDriver(
        cast(Any, core),
        cast(Any, SimpleNamespace()),
        lambda exc: None,
        release=released.extend,
        tls=ClusterTLS.insecure(),
    )
    driver.process()
    assert released == committed


def test_release_batches_carries_out_a_released_batch_in_order() -> None:
    queue = CommitQueue(FlushPacer(interval=0.001, full=8))
    done: list[Effect] = []
    answered: list[int] = []
    queue.batch.add(3, (HSET, "hx:3:k", b"f", b"v"))
    queue.after(HandoffReady(1))
    queue.after_ok(answered.append, 7)
    queue.after(HandoffReady(2))
    batch = queue.seal()
    token = queue.durable(batch, [Entry(3, 1, 1, [], 0)], frozenset(), 0)
    assert token is not None
    release = functools.partial(release_batches, queue, done.append)
    driver = ReplicationDriver(
        cast(Any, SimpleNamespace(ready=lambda: Ready(committed=[(token, frozenset())]))),
        cast(Any, SimpleNamespace()),
        lambda exc: None,
        release=release,
        tls=ClusterTLS.insecure(),
    )
    assert (done, answered) == ([], [])
    driver.process()
    assert done == [HandoffReady(1), HandoffReady(2)]
    assert answered == [7]


# ----- the parts, as main builds them -------------------------------------------------------


async def test_assembled_parts_release_an_answer_through_commit_driver_and_queue() -> None:
    """What assemble wires: an answer gathered in the queue is committed by the group commit,
    handed durable to the replication driver and released by it to the edge, with nothing
    set afterwards. (A batch without writes touches no Redis.)"""
    parts = _assemble()
    answered: list[int] = []
    released = asyncio.Event()

    def answer(request_id: int) -> None:
        answered.append(request_id)
        released.set()

    parts.commit.start()
    try:
        parts.queue.after_ok(answer, 7)
        await asyncio.wait_for(released.wait(), 10)
    finally:
        await parts.commit.stop()
    assert answered == [7]
    assert parts.replication.roles is parts.node


async def test_a_view_reaches_the_assembled_node_and_driver_through_the_door() -> None:
    parts = _assemble()
    view = mpb.View(
        epoch=3,
        partition_count=1,
        members=[mpb.Member(node_id="n2", partition_addr="127.0.0.1:1")],
        partitions=[mpb.PartitionAssignment(partition=0, epoch=3, replicas=["n2"])],
    )
    # Not a member of the view: not admitted, no roles (and nothing read from Redis).
    assert not await parts.door.enter(view)
    assert parts.node.view is view
    assert parts.replication.members() == {"n2"}
    assert not parts.replicator.mastered
    assert not parts.replicator.followed


def _assemble() -> ServiceParts:
    client = redis_client("redis://127.0.0.1:1/0", 1.0)  # never connected: nothing is read
    return assemble(
        "n1",
        client=client,
        writer=cast(Any, SimpleNamespace()),
        write_timeout=1.0,
        limits=QueueLimits(),
        replication_limits=ReplicationLimits(),
        seen=SeenOrigins(1000),
        tracing=telemetry.Tracing.disabled(),
        incarnation=1,
        agent=None,
        tls=ClusterTLS.insecure(),
        on_failure=lambda exc: pytest.fail(f"storage failed: {exc}"),
    )


# ----- options ------------------------------------------------------------------------------


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(
        [
            *("--node-id", "n1", "--listen", "127.0.0.1:7000"),
            *("--redis", "redis://127.0.0.1:6379/0", "--membership", "127.0.0.1:7100"),
            *extra,
        ]
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--max-queued-messages", "0"),
        ("--max-retained-bytes", "0"),
        ("--replication-log-entries", "0"),
        ("--redis-timeout", "0"),
        ("--replica-lag-timeout", "0"),
        ("--qos2-dedupe-retention", "0"),
    ],
)
def test_options_that_cannot_work_are_refused_naming_the_option(option: str, value: str) -> None:
    with pytest.raises(ValueError, match=option):
        check_options(_args(option, value))


def test_options_configure_the_limits() -> None:
    args = _args(
        "--max-queued-messages",
        "5",
        "--queue-overflow",
        "drop-oldest",
        "--max-subscriptions",
        "9",
        "--replica-lag-timeout",
        "2.5",
    )
    access, warnings = check_options(args)
    assert (access.who, warnings) == ("default", [])
    limits = queue_limits(args)
    assert (limits.max_queued_messages, limits.drop_oldest, limits.max_subscriptions) == (
        5,
        True,
        9,
    )
    assert replication_limits(args, 0.1).lag_ticks == 25
    assert replication_limits(args, 10.0).lag_ticks == 1  # at least one tick
