"""Snapshot chunks packed with zlib (the zlib-snapshots feature) and plain: what goes in comes
out, and a packed chunk that cannot be read is refused with a message naming it."""

from __future__ import annotations

import zlib

import pytest

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition import snapshot_codec
from services.partition.snapshot_codec import (
    SnapshotChunkError,
    chunk_ops,
    fill_chunk,
)

HSET = pb.StorageOp.KIND_HSET
OPS = [(HSET, f"hexmq:s:client-{i}", b"will", b"x" * 200) for i in range(50)]


def test_packed_chunk_round_trips_and_is_smaller() -> None:
    chunk = pb.SnapshotChunk(partition=3, seq=9)
    sent = fill_chunk(chunk, OPS, packed=True)
    assert sent.packed
    assert not chunk.ops  # a reader that ignores packed_ops sees no writes at all
    assert sent.wire_bytes == len(chunk.packed_ops) < sent.raw_bytes / 4
    wire = pb.SnapshotChunk.FromString(chunk.SerializeToString())
    assert chunk_ops(wire) == OPS


def test_plain_chunk_round_trips_without_packed_ops() -> None:
    chunk = pb.SnapshotChunk(partition=3, seq=9)
    sent = fill_chunk(chunk, OPS, packed=False)
    assert not sent.packed
    assert sent.raw_bytes == sent.wire_bytes
    assert not chunk.packed_ops
    assert chunk_ops(chunk) == OPS


def test_empty_packed_chunk_round_trips() -> None:
    chunk = pb.SnapshotChunk(partition=1, last=True)
    fill_chunk(chunk, [], packed=True)
    assert chunk_ops(chunk) == []


def test_not_zlib_is_refused_naming_the_chunk() -> None:
    chunk = pb.SnapshotChunk(partition=4, seq=17, packed_ops=b"not zlib at all")
    with pytest.raises(SnapshotChunkError, match="partition 4 at seq 17: packed_ops is not zlib"):
        chunk_ops(chunk)


def test_truncated_is_refused() -> None:
    chunk = pb.SnapshotChunk(partition=2)
    fill_chunk(chunk, OPS, packed=True)
    chunk.packed_ops = chunk.packed_ops[:-8]
    with pytest.raises(SnapshotChunkError, match="truncated"):
        chunk_ops(chunk)


def test_not_a_storage_op_list_is_refused() -> None:
    chunk = pb.SnapshotChunk(partition=2, packed_ops=zlib.compress(b"\xff\xff\xff\xff"))
    with pytest.raises(SnapshotChunkError, match="not a StorageOpList"):
        chunk_ops(chunk)


def test_inflating_past_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real limit (256 MiB) would make the test allocate that much: a smaller one, same path.
    monkeypatch.setattr(snapshot_codec, "MAX_UNPACKED_BYTES", 1024)
    bomb = zlib.compress(b"\0" * 1025, 9)
    chunk = pb.SnapshotChunk(partition=2, packed_ops=bomb)
    with pytest.raises(SnapshotChunkError, match="inflates past"):
        chunk_ops(chunk)
