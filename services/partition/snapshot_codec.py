"""How a snapshot chunk carries its writes: plain (`SnapshotChunk.ops`, every release) or packed
(`SnapshotChunk.packed_ops`: a StorageOpList compressed with zlib, the "zlib-snapshots"
feature, hexmq/node_protocol.py).

A snapshot is the bulk transfer of a partition to a follower (one that was away for longer than
its master's log reaches back, or that joins); its writes are whole hashes of session state and
queued messages, which compress several times over. A follower of v0.2.0 does not know
`packed_ops` and would take a packed chunk as empty, which is why the master packs only while
the agreed view has the feature on (every member supports it).

Pure: no I/O.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from google.protobuf.message import DecodeError

from hexmq.api.partition.v1 import partition_pb2 as pb

# (kind, key, field, value), as services/partition/replication.py's Op.
Op = tuple[int, str, bytes, bytes]

# zlib's fastest level: most of the gain at a fraction of the CPU (a snapshot is read and sent
# on the master's event loop).
LEVEL: Final = 1
# A packed chunk that inflates past this is refused: a chunk holds SNAPSHOT_CHUNK_OPS writes
# (services/partition/peers.py), and gRPC's own message limit keeps a plain one far below it.
MAX_UNPACKED_BYTES: Final = 256 << 20


class SnapshotChunkError(ValueError):
    """A packed chunk that cannot be read (names the partition and what is wrong)."""


@dataclass(frozen=True, slots=True)
class ChunkSent:
    """A snapshot chunk on its way to a follower: whether its writes are packed, their size
    serialized (raw) and as sent (wire)."""

    packed: bool
    raw_bytes: int
    wire_bytes: int


def fill_chunk(chunk: pb.SnapshotChunk, ops: Sequence[Op], *, packed: bool) -> ChunkSent:
    """Put `ops` into `chunk`, packed or plain."""
    listed = [pb.StorageOp(kind=k, key=key, field=f, value=v) for k, key, f, v in ops]  # type: ignore[arg-type]
    if not packed:
        chunk.ops.extend(listed)
        size = pb.StorageOpList(ops=listed).ByteSize()
        return ChunkSent(False, size, size)
    raw = pb.StorageOpList(ops=listed).SerializeToString()
    chunk.packed_ops = zlib.compress(raw, LEVEL)
    return ChunkSent(True, len(raw), len(chunk.packed_ops))


def chunk_ops(chunk: pb.SnapshotChunk) -> list[Op]:
    """Every write of a chunk: `ops`, then those of `packed_ops`. Raises SnapshotChunkError."""
    ops: list[Op] = [(op.kind, op.key, op.field, op.value) for op in chunk.ops]
    if not chunk.packed_ops:
        return ops
    where = f"snapshot chunk of partition {chunk.partition} at seq {chunk.seq}"
    inflate = zlib.decompressobj()
    try:
        raw = inflate.decompress(chunk.packed_ops, MAX_UNPACKED_BYTES)
    except zlib.error as exc:
        raise SnapshotChunkError(f"{where}: packed_ops is not zlib data ({exc})") from exc
    if inflate.unconsumed_tail or not inflate.eof:
        raise SnapshotChunkError(
            f"{where}: packed_ops is truncated or inflates past {MAX_UNPACKED_BYTES} bytes"
        )
    try:
        listed = pb.StorageOpList.FromString(raw)
    except DecodeError as exc:
        raise SnapshotChunkError(f"{where}: packed_ops is not a StorageOpList ({exc})") from exc
    ops.extend((op.kind, op.key, op.field, op.value) for op in listed.ops)
    return ops
