"""The group commit's failure handling (services/partition/store.py): whatever stops a batch
from being made durable stops the partition service (fail-stop), so its memory is never ahead
of its Redis while it goes on taking writes."""

from __future__ import annotations

import asyncio

from services.partition.replication import HSET
from services.partition.store import GroupCommit, StorageFailed


class BrokenReplicator:
    """A replicator whose propose fails with a bug, not a Redis error."""

    def propose(self, ops: object, origins: object) -> object:
        raise ValueError("a bug in the replication core")


async def test_a_non_redis_exception_in_the_commit_task_stops_the_service() -> None:
    failures: list[BaseException] = []
    commit = GroupCommit(None, BrokenReplicator(), failures.append)
    answered: list[int] = []
    commit.start()
    commit.batch.add(3, (HSET, "hx:{3}:k", b"f", b"v"))
    commit.after_ok(answered.append, 1)
    for _ in range(20):
        await asyncio.sleep(0)
        if failures:
            break
    assert len(failures) == 1
    assert isinstance(failures[0], StorageFailed)
    assert "a bug in the replication core" in str(failures[0])
    assert answered == []  # nothing acknowledged
    # The task ended: it takes no further batch.
    assert commit._task is not None
    assert commit._task.done()
