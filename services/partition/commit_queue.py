"""The group commit's core, sans I/O: the writes being gathered and the effects waiting on
them, when a batch is due, and what to carry out when batches are released. No clock of its
own (the adapter passes `now`), no asyncio, no Redis: services/partition/group_commit.py carries
its decisions out.

The life of a batch:
- gather: handlers put storage ops on `batch` (or `lazy_batch`: writes nothing waits on; or
  `deferred_batch`: writes nothing waits on whose loss at a failover costs only a redelivery)
  and what may happen only once those are durable and replicated on `after` (effects,
  services/partition/effects.py) and `after_ok` (plain OK answers);
- due: `next(now, linger, deferral)` says what the committer does now: wait for something to be
  gathered (IDLE), wait for company (a batch of lazy writes alone waits up to the lazy linger
  for a write someone waits on, hexmq/pacing.py; a batch of deferred writes alone up to the
  removal linger, so that they go with the next write instead of a MULTI/EXEC and a replication
  round of their own), wait out the pacing interval (one MULTI/EXEC per interval at most,
  unless the batch is full), or commit the batch it hands over (`Sealed`: the finishers have
  added their last writes);
- durable: once the sealed batch is in Redis, `durable` makes it a DurableBatch, the token the
  replication driver hands back once every in-sync follower has it; `fail` if it could not be
  written (nothing more is then);
- released: `release(tokens)` yields, batch after batch and in the order they were added, each
  effect to carry out and each answer to send, except those of commands that wrote a partition
  aborted before the release: each such command is answered MOVED instead, once. Then the
  release hooks run.

So the order in which commands were handled is the order in which edges hear of them, and
nothing a command leaves leaves before its writes are stored and replicated ("persist before
you acknowledge" lives here, in the adapter's order of write then hand-on, and in
Replicator.master_durable).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeAlias, cast

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.write_batch import WriteBatch

if TYPE_CHECKING:
    from services.partition.effects import Effect
    from services.partition.replication import Entry

# Writes that make a group-commit batch worth sending without waiting out the pacing interval.
FULL_COMMIT = 1024


class StorageFailed(RuntimeError):
    """A batch could not be made durable. The partition stops (fail-stop) so that its memory
    never runs ahead of what Redis holds; on restart it reloads from Redis."""


class Scope(NamedTuple):
    """What an action or acknowledgement added while handling one command belongs to: the
    partitions the command wrote and how to answer it. Should one of those partitions be
    aborted (this node stopped mastering it before the batch was released), the action is
    dropped and the command is answered MOVED instead, once."""

    partitions: frozenset[int]
    reply: Callable[[pb.PartitionEvent], None]
    request_id: int


class Pacer(Protocol):
    """When a batch may go (hexmq/pacing.py FlushPacer)."""

    def delay(self, now: float, queued: int) -> float: ...

    def sent(self, now: float) -> None: ...


# ----- what the committer does next (`next`) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing gathered: wait until something is."""


IDLE = Idle()


@dataclass(frozen=True, slots=True)
class AwaitCompany:
    """Only lazy writes are gathered: wait until something someone waits on joins them, or
    until `until`."""

    until: float


@dataclass(frozen=True, slots=True)
class AwaitPacing:
    """Wait until `until` (the pacing interval since the last batch): commands handled
    meanwhile join the batch."""

    until: float


@dataclass(frozen=True, slots=True)
class Sealed:
    """A batch taken for commit: its writes (None: it has effects only) and what waits on them.
    `lazy`: nothing in it is waited on; `gathered`: its writes when it was taken, before the
    finishers' own; `lingered`: the seconds it waited for company and pacing."""

    batch: WriteBatch | None
    actions: list[tuple[Effect, Scope | None]]
    oks: list[tuple[Callable[[int], None], int, Scope | None]]
    lazy: bool
    gathered: int
    lingered: float


Step = Idle | AwaitCompany | AwaitPacing | Sealed


@dataclass(slots=True)
class DurableBatch:
    """A batch durable here, on its way to the followers: the release token."""

    actions: list[tuple[Effect, Scope | None]]
    oks: list[tuple[Callable[[int], None], int, Scope | None]]
    # When the batch was durable here (unix ns), and the seq it got per partition.
    durable_ns: int
    seqs: dict[int, int]


# ----- what a release carries out (`release`), besides the effects themselves ---------------


@dataclass(frozen=True, slots=True)
class AnswerOks:
    """Answer each of these requests OK: `sink(request_id)` (their scopes aside)."""

    oks: list[tuple[Callable[[int], None], int, Scope | None]]


@dataclass(frozen=True, slots=True)
class AnswerMoved:
    """Answer `event` (a MOVED result) through `reply`."""

    reply: Callable[[pb.PartitionEvent], None]
    event: pb.PartitionEvent


# What `release` yields: an answer, or an effect to carry out.
Released: TypeAlias = "AnswerOks | AnswerMoved | Effect"


def _asleep(company: bool) -> None:
    """Nobody waits for the queue (no adapter listens)."""


class CommitQueue:
    """The writes being gathered and the effects waiting on them, the batch under way and the
    pacing of the next one (see the module's docstring)."""

    def __init__(self, pacer: Pacer) -> None:
        self._pacer = pacer
        self._batch: WriteBatch | None = None
        self._actions: list[tuple[Effect, Scope | None]] = []
        # (sink, request id) pairs answered OK once durable: cheaper than an action each.
        self._oks: list[tuple[Callable[[int], None], int, Scope | None]] = []
        # Set once the batch being gathered has a write or an effect someone waits on.
        self._company = False
        # Set once it has a lazy write or answer that may wait only the lazy linger, not the
        # removal linger (`next`).
        self._hurried = False
        self._finishers: list[Callable[[WriteBatch], None]] = []
        self._release_hooks: list[Callable[[], None]] = []
        self._wake: Callable[[bool], None] = _asleep
        # The round under way: since when it waits for company (None: it does not), until
        # when it waits out the pacing interval (None: it does not) and what it waited so far.
        self._company_since: float | None = None
        self._paced_until: float | None = None
        self._lingered = 0.0
        # A batch could not be made durable: nothing more is written (the service stops).
        self.failed = False
        # The command being handled (`handling`).
        self.scope: Scope | None = None
        # The batch whose effects are being released (for spans that cover its replication).
        self.releasing: DurableBatch | None = None
        # Commands answered MOVED because a partition they wrote was aborted.
        self.moved = 0

    # ----- wiring -------------------------------------------------------------------------

    def listen(self, wake: Callable[[bool], None]) -> None:
        """`wake(company)` is called whenever something is gathered (`company`: something
        someone waits on, or a lazy write that ends a wait for company sooner): the committer
        (group_commit.py) waits for it."""
        self._wake = wake

    def add_finisher(self, finisher: Callable[[WriteBatch], None]) -> None:
        """`finisher(batch)` adds its last writes to every batch as it is sealed (e.g. one
        session record per batch instead of one per message)."""
        self._finishers.append(finisher)

    def add_release_hook(self, hook: Callable[[], None]) -> None:
        """`hook()` runs after each `release`, once the effects of every batch it released
        were carried out (e.g. each session pumped once for all the messages those batches
        made durable)."""
        self._release_hooks.append(hook)

    # ----- gather -------------------------------------------------------------------------

    def handling(self, scope: Scope | None) -> None:
        """The command being handled from now on (None: none): what is added meanwhile is its
        own (dropped, and the command answered MOVED, if a partition it wrote is aborted)."""
        self.scope = scope

    @property
    def batch(self) -> WriteBatch:
        """The batch being gathered; writes added now commit together."""
        self._company = True
        return self.lazy_batch

    @property
    def lazy_batch(self) -> WriteBatch:
        """The batch being gathered, for writes nothing waits on: alone, they may wait up to
        the lazy linger for company."""
        batch = self.deferred_batch
        self._hurry()
        return batch

    @property
    def deferred_batch(self) -> WriteBatch:
        """The batch being gathered, for writes nothing waits on and whose loss at a failover
        costs only a redelivery the protocol allows (a QoS 1 message's removal once its client
        acknowledged it): alone, they may wait up to the removal linger for company."""
        if self._batch is None:
            self._batch = WriteBatch()
        self._wake(self._company)
        return self._batch

    def _hurry(self) -> None:
        """Something gathered may wait only the lazy linger; a longer wait under way for
        deferred writes ends sooner (the committer is woken to ask `next` again)."""
        if not self._hurried:
            self._hurried = True
            if self._company_since is not None:
                self._wake(True)

    def after(self, effect: Effect) -> None:
        """Carry `effect` out once everything written so far is durable and replicated."""
        self._actions.append((effect, self.scope))
        self._company = True
        self._wake(True)

    def after_ok(
        self,
        sink: Callable[[int], None],
        request_id: int,
        *,
        lazy: bool = False,
        deferred: bool = False,
    ) -> None:
        """Call `sink(request_id)` once everything written so far is durable (after the
        batch's actions). `lazy`: the edge does not wait on it; `deferred` too, and it may
        wait as long as deferred writes (the answer to a removal of `deferred_batch`)."""
        self._oks.append((sink, request_id, self.scope))
        if not (lazy or deferred):
            self._company = True
        self._wake(self._company)
        if not (self._company or deferred):
            self._hurry()

    def pending(self) -> list[Effect]:
        """The effects added since the last batch was sealed, in order (not the OKs)."""
        return [effect for effect, _scope in self._actions]

    @property
    def gathering(self) -> int:
        """Writes in the batch being gathered (not yet sealed)."""
        return self._batch.size if self._batch is not None else 0

    @property
    def company(self) -> bool:
        """Something gathered is waited on."""
        return self._company

    # ----- due ----------------------------------------------------------------------------

    def next(self, now: float, linger: float, deferral: float = 0.0) -> Step:
        """What the committer does at `now` (seconds, its clock): wait for something to be
        gathered, wait for company (from when it first looked, up to `linger` seconds, or up to
        `deferral` if that is longer and only deferred writes are gathered), wait out the
        pacing, or commit the batch it gets. One batch at a time: the committer asks again once
        the last one is durable (or failed)."""
        if self.failed:
            return IDLE
        if self._paced_until is not None:
            if now < self._paced_until:
                return AwaitPacing(self._paced_until)
            return self._take(now, self._lingered)
        wait = linger if self._hurried else max(linger, deferral)
        if self._company_since is None:
            if self._batch is None and not self._actions and not self._oks:
                return IDLE
            if self._company or wait <= 0:
                return self._pace(now, 0.0)
            self._company_since = now
            return AwaitCompany(now + wait)
        until = self._company_since + wait
        if not self._company and now < until:
            return AwaitCompany(until)
        waited = now - self._company_since
        self._company_since = None
        return self._pace(now, waited)

    def _pace(self, now: float, waited: float) -> Step:
        delay = self._pacer.delay(now, self.gathering)
        if delay:
            self._paced_until = now + delay
            self._lingered = waited + delay
            return AwaitPacing(self._paced_until)
        return self._take(now, waited)

    def _take(self, now: float, lingered: float) -> Sealed:
        self._paced_until = None
        self._pacer.sent(now)
        return self.seal(lingered)

    def seal(self, lingered: float = 0.0) -> Sealed:
        """Take what is gathered for commit now, whatever the pacing (at a stop, or in tests;
        `next` does when it is due). The finishers add their last writes to its batch."""
        batch, actions, oks = self._batch, self._actions, self._oks
        self._batch, self._actions, self._oks = None, [], []
        gathered = batch.size if batch is not None else 0
        lazy = not self._company
        self._company = self._hurried = False
        self._company_since = self._paced_until = None
        if batch is not None:
            for finisher in self._finishers:
                finisher(batch)
        return Sealed(batch, actions, oks, lazy, gathered, lingered)

    # ----- durable, or not ----------------------------------------------------------------

    def durable(
        self, sealed: Sealed, entries: list[Entry], aborted: frozenset[int], durable_ns: int
    ) -> DurableBatch | None:
        """`sealed` is durable here (at `durable_ns`, unix ns) as `entries` (its writes as the
        replicator sequenced them; it could not write the partitions `aborted`): the token to
        release it by once replicated, or None if nothing waits on it."""
        if not (sealed.actions or sealed.oks or entries or aborted):
            return None
        seqs = {entry.partition: entry.seq for entry in entries}
        return DurableBatch(sealed.actions, sealed.oks, durable_ns, seqs)

    def fail(self, reason: str) -> StorageFailed:
        """A batch could not be made durable: nothing more is (later batches must not be
        written, nor their entries sent after the lost one); what to stop the service with."""
        self.failed = True
        return StorageFailed(reason)

    # ----- released -----------------------------------------------------------------------

    def release(self, tokens: Iterable[tuple[object, frozenset[int]]]) -> Iterator[Released]:
        """What to carry out for batches that are now replicated (their tokens, each with the
        partitions aborted meanwhile), in order: each batch's effects, then its OKs
        (AnswerOks), and for a command that wrote an aborted partition one AnswerMoved instead
        of its effects and OK. While a batch's are taken, `releasing` is that batch. The
        release hooks run once the last is taken."""
        for token, aborted in tokens:
            batch = cast("DurableBatch", token)
            self.releasing = batch
            if not aborted:  # (nearly always: one item for all the batch's OKs)
                for action, _scope in batch.actions:
                    yield action
                if batch.oks:
                    yield AnswerOks(batch.oks)
                continue
            moved: set[tuple[int, int]] = set()
            for action, scope in batch.actions:
                if scope is not None and not aborted.isdisjoint(scope.partitions):
                    answer = self._answer_moved(scope, aborted, moved)
                    if answer is not None:
                        yield answer
                    continue
                yield action
            for ok in batch.oks:
                scope = ok[2]
                if scope is not None and not aborted.isdisjoint(scope.partitions):
                    answer = self._answer_moved(scope, aborted, moved)
                    if answer is not None:
                        yield answer
                    continue
                yield AnswerOks([ok])
        self.releasing = None
        for hook in self._release_hooks:
            hook()

    def _answer_moved(
        self, scope: Scope, aborted: frozenset[int], answered: set[tuple[int, int]]
    ) -> AnswerMoved | None:
        key = (id(scope.reply), scope.request_id)
        if not scope.request_id or key in answered:
            return None
        answered.add(key)
        self.moved += 1
        p = min(aborted & scope.partitions)
        event = pb.PartitionEvent(
            result=pb.Result(
                request_id=scope.request_id,
                status=pb.StatusCode.STATUS_CODE_MOVED,
                message=f"partition {p} moved before this was acknowledged; send it again",
            )
        )
        return AnswerMoved(scope.reply, event)
