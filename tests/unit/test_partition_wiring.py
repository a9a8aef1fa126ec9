"""How the partition service's adapters are put together: each is given its collaborators when
built (services/partition/main.py builds them in the order they need each other), and the one
link back, the replication driver releasing the group commit's batches, is a function of the
commit queue and the node alone (group_commit.release_batches), given to the driver when built."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, cast

from hexmq.pacing import FlushPacer
from hexmq.trust.grpc_tls import ClusterTLS
from services.partition.commit_queue import CommitQueue
from services.partition.effects import Effect, HandoffReady
from services.partition.group_commit import release_batches
from services.partition.peers import ReplicationDriver
from services.partition.replication import HSET, Entry, Ready


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
