"""The replicated log's own vocabulary: storage writes (Op), positions and epoch histories,
log entries, and the recent log every replica keeps for catch-up (services/partition/replication.py
describes how they are used)."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hexmq.api.partition.v1 import partition_pb2 as pb

HSET = pb.StorageOp.KIND_HSET
HDEL = pb.StorageOp.KIND_HDEL
DEL = pb.StorageOp.KIND_DEL
# (kind, key, field, value): one storage write. Tuples on the hot path; protobuf only on the wire.
Op = tuple[int, str, bytes, bytes]
# (epoch, seq): where a replica of a partition stands. (0, 0) is "holds nothing".
Position = tuple[int, int]
NOWHERE: Position = (0, 0)
# (epoch, first seq) per master tenure, oldest first.
History = tuple[tuple[int, int], ...]

DEFAULT_LOG_ENTRIES = 50_000


@dataclass(frozen=True, slots=True)
class ReplicationLimits:
    """log_entries/log_bytes: how much of each partition's recent history a replica keeps for
    catch-up; window: entries sent to one follower of one partition and not yet acknowledged;
    lag_ticks: how long a counted follower may stay behind before the master asks the view to
    drop it; down_ticks: how long a counted follower's stream may be down before that;
    need_retry_ticks: how long a follower waits before asking for a gap, or joining, again."""

    log_entries: int = DEFAULT_LOG_ENTRIES
    log_bytes: int = 16 << 20
    window: int = 512
    lag_ticks: int = 50
    down_ticks: int = 2
    need_retry_ticks: int = 10


def op_size(op: Op) -> int:
    return len(op[1]) + len(op[2]) + len(op[3]) + 8


def ops_to_pb(ops: Iterable[Op]) -> list[pb.StorageOp]:
    return [pb.StorageOp(kind=k, key=key, field=f, value=v) for k, key, f, v in ops]  # type: ignore[arg-type]


def ops_from_pb(ops: Iterable[pb.StorageOp]) -> list[Op]:
    return [(op.kind, op.key, op.field, op.value) for op in ops]


def history_of(position: Position, history: Sequence[tuple[int, int]] = ()) -> History:
    """A stored history, or for data stored before histories existed, one epoch from seq 1."""
    if history:
        return tuple((int(e), int(s)) for e, s in history)
    return ((position[0], 1),) if position[1] else ()


def on_history(history: History, last_seq: int, pos: Position) -> bool:
    """True if the entry at pos[1] of this history (whose last entry is last_seq) has epoch
    pos[0]: a replica standing at pos holds a prefix of this history. (0, 0) always is."""
    epoch, seq = pos
    if seq == 0:
        return epoch == 0
    if seq > last_seq:
        return False
    for i, (e, start) in enumerate(history):
        if e == epoch:
            end = history[i + 1][1] - 1 if i + 1 < len(history) else last_seq
            return start <= seq <= end
    return False


def history_to_pb(history: History) -> list[pb.PartitionPosition]:
    return [pb.PartitionPosition(epoch=e, seq=s) for e, s in history]


@dataclass(slots=True)
class Entry:
    partition: int
    epoch: int
    seq: int
    ops: list[Op]
    size: int
    _item: pb.ReplicationItem | None = None
    # Set on the first entry a master writes in its epoch: the history to store with it.
    history: History | None = None
    # The QoS 1 publishes written by this entry, by origin (LogEntry.origins).
    origins: Sequence[bytes] = ()

    def item(self) -> pb.ReplicationItem:
        """The wire form, built once and shared by every follower."""
        if self._item is None:
            self._item = pb.ReplicationItem(
                entry=pb.LogEntry(
                    partition=self.partition,
                    epoch=self.epoch,
                    seq=self.seq,
                    ops=ops_to_pb(self.ops),
                    origins=self.origins,
                )
            )
        return self._item


@dataclass(slots=True)
class RecentLog:
    """The recent entries of one partition, for followers to catch up from:
    entries[i].seq == start + i; `base_epoch` is the epoch of the entry at start - 1."""

    entries: deque[Entry] = field(default_factory=deque)
    size: int = 0
    start: int = 1
    base_epoch: int = 0
    # Origin of each QoS 1 publish the entries hold -> the seq of its entry.
    by_origin: dict[bytes, int] = field(default_factory=dict)

    def reset(self, position: Position) -> None:
        self.entries.clear()
        self.by_origin.clear()
        self.size = 0
        self.start = position[1] + 1
        self.base_epoch = position[0]

    def append(self, entry: Entry, limits: ReplicationLimits, pinned: int) -> None:
        if not self.entries:
            self.start = entry.seq
        self.entries.append(entry)
        self.size += entry.size
        if entry.origins:
            by_origin = self.by_origin
            for origin in entry.origins:
                by_origin[origin] = entry.seq
        entries = self.entries
        while entries and (len(entries) > limits.log_entries or self.size > limits.log_bytes):
            if entries[0].seq >= pinned:
                break
            gone = entries.popleft()
            self.size -= gone.size
            self.base_epoch = gone.epoch
            self.start = gone.seq + 1
            for origin in gone.origins:
                if self.by_origin.get(origin) == gone.seq:
                    del self.by_origin[origin]

    def reaches(self, seq: int) -> bool:
        """The log holds every entry from seq on (up to its end)."""
        return seq >= self.start

    def bytes_after(self, seq: int) -> int | None:
        """The size of the entries after seq (None: the log no longer reaches back to them)."""
        if not self.reaches(seq + 1):
            return None
        return sum(e.size for e in itertools.islice(self.entries, seq + 1 - self.start, None))
