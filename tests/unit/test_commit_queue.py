"""The group commit's core (services/partition/commit_queue.py), sans I/O: plain functions on a
hand-moved clock. When a batch is due (company for lazy writes, pacing, full batches), batch
sizes that follow the load, what a release carries out and in which order (MOVED for commands
that wrote an aborted partition), and that nothing more is committed after a failure. Its
adapter: test_group_commit.py and test_batching.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.pacing import FlushPacer
from services.partition.commit_queue import (
    IDLE,
    AnswerMoved,
    AnswerOks,
    AwaitCompany,
    AwaitPacing,
    CommitQueue,
    DurableBatch,
    Scope,
    Sealed,
    StorageFailed,
)
from services.partition.effects import HandoffReady
from services.partition.replication import HDEL, HSET, Entry, Op
from services.partition.write_batch import WriteBatch

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 0.001
LINGER = 0.010
FULL = 8
WRITE: Op = (HSET, "hx:3:k", b"f", b"v")
ACK: Op = (HDEL, "hx:3:q:c", b"1", b"")


def make_queue(interval: float = INTERVAL, full: int = FULL) -> CommitQueue:
    return CommitQueue(FlushPacer(interval=interval, full=full))


def sealed(step: object) -> Sealed:
    assert isinstance(step, Sealed), step
    return step


def entries_of(batch: Sealed, first_seq: int = 1) -> list[Entry]:
    """The batch's writes as a replicator sequences them: one entry per partition."""
    assert batch.batch is not None
    return [
        Entry(p, 1, first_seq + i, list(ops), 0)
        for i, (p, ops) in enumerate(sorted(batch.batch.ops.items()))
    ]


def durable(queue: CommitQueue, batch: Sealed, aborted: frozenset[int] = frozenset()) -> object:
    token = queue.durable(batch, entries_of(batch) if batch.batch else [], aborted, 0)
    assert token is not None
    return token


class Edge:
    """What one edge heard, as the adapter carries a release out."""

    def __init__(self) -> None:
        self.heard: list[object] = []

    def reply(self, event: pb.PartitionEvent) -> None:
        self.heard.append(("event", event.result.request_id, event.result.status))

    def ok(self, request_id: int) -> None:
        self.heard.append(("ok", request_id))


def carry(released: Iterable[object]) -> list[object]:
    """A release carried out in order: answers sent, effects listed."""
    done: list[object] = []
    for item in released:
        if isinstance(item, AnswerOks):
            for sink, request_id, _scope in item.oks:
                sink(request_id)
                done.append(("ok", request_id))
        elif isinstance(item, AnswerMoved):
            item.reply(item.event)
            done.append(("moved", item.event.result.request_id))
        else:
            done.append(item)
    return done


# ----- purity -------------------------------------------------------------------------------


def test_the_core_and_the_storage_layout_import_neither_asyncio_nor_redis() -> None:
    probe = (
        "import sys; import services.partition.commit_queue, services.partition.write_batch, "
        "services.partition.keys; "
        "print(sorted(m for m in ('asyncio', 'redis', 'grpc') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"


# ----- when a batch is due ------------------------------------------------------------------


def test_nothing_gathered_is_idle() -> None:
    queue = make_queue()
    assert queue.next(100.0, LINGER) is IDLE
    queue.seal()
    assert queue.next(100.0, LINGER) is IDLE


def test_a_lone_write_someone_waits_on_goes_at_once() -> None:
    queue = make_queue()
    queue.batch.add(3, WRITE)
    queue.after_ok(Edge().ok, 1)
    batch = sealed(queue.next(100.0, LINGER))
    assert batch.gathered == 1
    assert not batch.lazy
    assert batch.lingered == 0.0
    assert batch.batch is not None
    assert batch.batch.ops == {3: [WRITE]}
    assert queue.gathering == 0
    assert queue.next(100.0, LINGER) is IDLE


def test_lazy_writes_alone_wait_for_company_up_to_the_linger() -> None:
    queue = make_queue()
    queue.lazy_batch.add(3, ACK)
    queue.after_ok(Edge().ok, 1, lazy=True)
    assert queue.next(100.0, LINGER) == AwaitCompany(100.0 + LINGER)
    # Woken before the linger passed, with no company: it waits on, to the same deadline.
    assert queue.next(100.004, LINGER) == AwaitCompany(100.0 + LINGER)
    batch = sealed(queue.next(100.0 + LINGER, LINGER))
    assert batch.lazy
    assert batch.lingered == pytest.approx(LINGER)


def test_company_ends_the_wait_and_the_batch_is_not_lazy() -> None:
    queue = make_queue()
    queue.lazy_batch.add(3, ACK)
    assert isinstance(queue.next(100.0, LINGER), AwaitCompany)
    queue.batch.add(4, WRITE)
    batch = sealed(queue.next(100.003, LINGER))
    assert not batch.lazy
    assert batch.gathered == 2
    assert batch.lingered == pytest.approx(0.003)


def test_a_linger_of_zero_never_waits_for_company() -> None:
    queue = make_queue()
    queue.lazy_batch.add(3, ACK)
    assert sealed(queue.next(100.0, 0.0)).lazy


DEFERRAL = 0.100


def test_deferred_writes_alone_wait_up_to_the_removal_linger_even_with_no_lazy_linger() -> None:
    queue = make_queue()
    queue.deferred_batch.add(3, ACK)
    queue.after_ok(Edge().ok, 1, lazy=True, deferred=True)
    assert queue.next(100.0, 0.0, DEFERRAL) == AwaitCompany(100.0 + DEFERRAL)
    assert queue.next(100.05, 0.0, DEFERRAL) == AwaitCompany(100.0 + DEFERRAL)
    batch = sealed(queue.next(100.0 + DEFERRAL, 0.0, DEFERRAL))
    assert batch.lazy
    assert batch.lingered == pytest.approx(DEFERRAL)


def test_deferred_writes_go_with_the_next_write_in_one_batch_with_their_answers() -> None:
    queue = make_queue()
    edge = Edge()
    queue.deferred_batch.add(3, ACK)
    queue.after_ok(edge.ok, 1, lazy=True, deferred=True)
    assert isinstance(queue.next(100.0, 0.0, DEFERRAL), AwaitCompany)
    queue.batch.add(4, WRITE)
    queue.after_ok(edge.ok, 2)
    batch = sealed(queue.next(100.04, 0.0, DEFERRAL))
    assert not batch.lazy
    assert batch.batch is not None
    assert batch.batch.ops == {3: [ACK], 4: [WRITE]}
    assert carry(queue.release([(durable(queue, batch), frozenset())])) == [("ok", 1), ("ok", 2)]


def test_a_hurried_lazy_write_shortens_the_wait_and_wakes_the_committer() -> None:
    queue = make_queue()
    told: list[bool] = []
    queue.listen(told.append)
    queue.deferred_batch.add(3, ACK)
    assert queue.next(100.0, LINGER, DEFERRAL) == AwaitCompany(100.0 + DEFERRAL)
    assert told == [False]
    queue.lazy_batch.add(3, ACK)  # (a PUBCOMP's removal: the lazy linger only)
    assert told[-1] is True  # asked again: the deadline moved
    assert not queue.company
    assert queue.next(100.001, LINGER, DEFERRAL) == AwaitCompany(100.0 + LINGER)
    assert sealed(queue.next(100.0 + LINGER, LINGER, DEFERRAL)).lazy
    # The next batch of deferred writes alone waits the removal linger again.
    queue.deferred_batch.add(3, ACK)
    assert queue.next(101.0, LINGER, DEFERRAL) == AwaitCompany(101.0 + DEFERRAL)


def test_a_lazy_answer_hurries_deferred_writes_and_a_deferred_one_does_not() -> None:
    queue = make_queue()
    queue.deferred_batch.add(3, ACK)
    queue.after_ok(Edge().ok, 1, lazy=True, deferred=True)
    assert queue.next(100.0, LINGER, DEFERRAL) == AwaitCompany(100.0 + DEFERRAL)
    queue.after_ok(Edge().ok, 2, lazy=True)
    assert queue.next(100.0, LINGER, DEFERRAL) == AwaitCompany(100.0 + LINGER)


def test_a_removal_linger_under_the_lazy_linger_waits_the_lazy_linger() -> None:
    queue = make_queue()
    queue.deferred_batch.add(3, ACK)
    assert queue.next(100.0, LINGER, 0.001) == AwaitCompany(100.0 + LINGER)
    queue.seal()
    queue.deferred_batch.add(3, ACK)
    assert sealed(queue.next(101.0, 0.0, 0.0)).lazy  # both 0: at once


def test_a_batch_soon_after_the_last_waits_out_the_pacing_interval() -> None:
    queue = make_queue()
    queue.batch.add(3, WRITE)
    sealed(queue.next(100.0, LINGER))
    queue.batch.add(3, WRITE)
    assert queue.next(100.0004, LINGER) == AwaitPacing(pytest.approx(100.0 + INTERVAL))
    # Commands handled meanwhile join it.
    queue.batch.add(3, WRITE)
    queue.after(HandoffReady(1))
    assert isinstance(queue.next(100.0008, LINGER), AwaitPacing)
    batch = sealed(queue.next(100.0 + INTERVAL, LINGER))
    assert batch.gathered == 2
    assert batch.lingered == pytest.approx(INTERVAL - 0.0004)
    assert [effect for effect, _scope in batch.actions] == [HandoffReady(1)]


def test_a_full_batch_does_not_wait_out_the_interval() -> None:
    queue = make_queue()
    queue.batch.add(3, WRITE)
    sealed(queue.next(100.0, LINGER))
    for _ in range(FULL):
        queue.batch.add(3, WRITE)
    assert sealed(queue.next(100.0001, LINGER)).gathered == FULL


def simulate(gap: float, commit_s: float, count: int) -> list[int]:
    """`count` writes arriving every `gap` seconds, each waited on; a committer that does what
    the queue says, each MULTI/EXEC taking `commit_s` (writes arriving meanwhile join the next
    batch). The writes of each batch."""
    queue = make_queue(interval=INTERVAL, full=1000)
    arrivals = [i * gap for i in range(count)]
    now, i, sizes = 0.0, 0, []
    while True:
        while i < count and arrivals[i] <= now:
            queue.batch.add(3, WRITE)
            i += 1
        step = queue.next(now, LINGER)
        if isinstance(step, Sealed):
            sizes.append(step.gathered)
            now += commit_s
        elif isinstance(step, AwaitPacing):
            now = step.until
        elif i < count:
            assert step is IDLE
            now = arrivals[i]
        else:
            return sizes


@pytest.mark.parametrize(
    ("gap", "commit_s", "low", "high"),
    [
        (0.010, 0.0002, 1, 1),  # 100 writes/s: each alone, at once
        (0.0002, 0.0002, 4, 6),  # 5,000/s: the pacing interval gathers about 5
        (0.00002, 0.0002, 45, 55),  # 50,000/s: about 50
        (0.00002, 0.004, 190, 210),  # and more while a slow Redis holds the last batch
    ],
)
def test_batch_sizes_follow_the_load(gap: float, commit_s: float, low: int, high: int) -> None:
    count = round(1.0 / gap)  # a second's writes
    sizes = simulate(gap, commit_s, count)
    assert sum(sizes) == count
    steady = sizes[1:-1] or sizes
    assert low <= min(steady)
    assert max(steady) <= high
    # At most one batch per pacing interval (or per commit, when that is longer).
    assert len(sizes) <= 1.0 / max(INTERVAL, commit_s) + 2


# ----- durable, failed ----------------------------------------------------------------------


def test_finishers_add_their_writes_as_the_batch_is_sealed() -> None:
    queue = make_queue()
    seen: list[int] = []

    def finish(batch: WriteBatch) -> None:
        seen.append(batch.size)
        batch.add(3, (HSET, "hx:3:sessions", b"c", b"record"))

    queue.add_finisher(finish)
    queue.batch.add(3, WRITE)
    batch = queue.seal()
    assert seen == [1]
    assert batch.gathered == 1
    assert batch.batch is not None
    assert batch.batch.size == 2
    # A batch of effects alone has no writes for them.
    queue.after(HandoffReady(1))
    assert queue.seal().batch is None
    assert seen == [1]


def test_a_durable_batch_carries_its_seqs_and_nothing_waits_on_an_empty_one() -> None:
    queue = make_queue()
    assert queue.durable(queue.seal(), [], frozenset(), 5) is None
    queue.batch.add(3, WRITE)
    queue.batch.add(4, WRITE)
    batch = queue.seal()
    token = queue.durable(batch, entries_of(batch, first_seq=41), frozenset(), 1234)
    assert isinstance(token, DurableBatch)
    assert (token.seqs, token.durable_ns) == ({3: 41, 4: 42}, 1234)


def test_after_a_failure_nothing_more_is_committed() -> None:
    queue = make_queue()
    edge = Edge()
    queue.batch.add(3, WRITE)
    queue.after_ok(edge.ok, 1)
    sealed(queue.next(100.0, LINGER))
    failure = queue.fail("redis write failed: gone")
    assert isinstance(failure, StorageFailed)
    assert "gone" in str(failure)
    assert queue.failed
    queue.batch.add(3, WRITE)
    queue.after_ok(edge.ok, 2)
    assert queue.next(200.0, LINGER) is IDLE
    assert edge.heard == []


# ----- released -----------------------------------------------------------------------------


def test_releases_come_in_order_effects_then_oks_then_the_hooks() -> None:
    queue = make_queue()
    edge = Edge()
    log: list[object] = []
    queue.add_release_hook(lambda: log.append("hook"))
    queue.batch.add(3, WRITE)
    queue.after(HandoffReady(1))
    queue.after_ok(edge.ok, 1)
    queue.after(HandoffReady(2))
    first = durable(queue, queue.seal())
    # Added after the first batch was sealed: the second batch's.
    queue.after_ok(edge.ok, 2)
    queue.after(HandoffReady(3))
    second = durable(queue, queue.seal())
    assert edge.heard == []  # nothing before the release
    releasing: list[object] = []
    for item in queue.release([(first, frozenset()), (second, frozenset())]):
        releasing.append(queue.releasing)
        log += carry([item])
    assert log == [
        HandoffReady(1),
        HandoffReady(2),
        ("ok", 1),
        HandoffReady(3),
        ("ok", 2),
        "hook",
    ]
    assert releasing == [first, first, first, second, second]
    assert queue.releasing is None
    assert edge.heard == [("ok", 1), ("ok", 2)]


def test_a_release_of_nothing_runs_the_hooks() -> None:
    queue = make_queue()
    log: list[str] = []
    queue.add_release_hook(lambda: log.append("hook"))
    assert carry(queue.release([])) == []
    assert log == ["hook"]


def test_commands_that_wrote_an_aborted_partition_are_answered_moved_once() -> None:
    queue = make_queue()
    edge, other = Edge(), Edge()
    # Command 1 wrote partitions 3 and 5, with two effects and an OK.
    queue.handling(Scope(frozenset({3, 5}), edge.reply, 1))
    queue.batch.add(3, WRITE)
    queue.after(HandoffReady(1))
    queue.after(HandoffReady(2))
    queue.after_ok(edge.ok, 1)
    # Command 2, another edge's, wrote partition 4 only.
    queue.handling(Scope(frozenset({4}), other.reply, 2))
    queue.after(HandoffReady(3))
    queue.after_ok(other.ok, 2)
    # Command 3 wrote partition 5, wanting no answer (request id 0).
    queue.handling(Scope(frozenset({5}), edge.reply, 0))
    queue.after(HandoffReady(4))
    # Not a command's (tracing's spans): carried out whatever was aborted.
    queue.handling(None)
    queue.after(HandoffReady(5))
    aborted = frozenset({5})
    token = durable(queue, queue.seal(), aborted)
    done = carry(queue.release([(token, aborted)]))
    assert done == [("moved", 1), HandoffReady(3), HandoffReady(5), ("ok", 2)]
    assert queue.moved == 1
    moved = pb.StatusCode.STATUS_CODE_MOVED
    assert edge.heard == [("event", 1, moved)]
    assert other.heard == [("ok", 2)]


def test_the_committer_is_told_what_is_gathered_and_whether_it_is_waited_on() -> None:
    queue = make_queue()
    told: list[bool] = []
    queue.listen(told.append)
    queue.lazy_batch.add(3, ACK)
    queue.after_ok(Edge().ok, 1, lazy=True)
    assert told == [False, False]
    assert not queue.company
    queue.after(HandoffReady(1))
    assert told[-1] is True
    assert queue.company
    queue.seal()
    assert not queue.company
    queue.batch.add(3, WRITE)
    assert told[-1] is True
