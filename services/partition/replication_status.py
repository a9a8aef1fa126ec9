"""What a node reports of the followers of the partitions it masters, read from the
replication state machine and changing nothing: each follower's progress (the Status RPC,
`hexmq cluster status`), the followers a write waits for and their lag (the append spans),
and each follower node's lag (the gauges)."""

from __future__ import annotations

from collections.abc import Callable

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.replication_state import (
    FollowerProgress,
    FollowerState,
    InSync,
    MasteredPartition,
    ReplicaState,
)


def follower_status(
    rep: ReplicaState, p: int, state_bytes: Callable[[], int] = lambda: 0
) -> list[pb.FollowerStatus]:
    """Each follower of p mastered here; `state_bytes` estimates the size of p's state,
    asked only when some follower needs or takes a snapshot."""
    m = rep.mastered.get(p)
    if m is None:
        return []
    size: list[int] = []

    def state() -> int:
        if not size:
            size.append(state_bytes())
        return size[0]

    return [
        pb.FollowerStatus(
            node_id=fp.node,
            acknowledged=fp.acked,
            lag=m.lag(fp),
            in_sync=fp.isr == InSync.IN,
            state=fp.state.value,
            bytes_left=_bytes_left(m, fp, state),
        )
        for fp in m.followers.values()
    ]


def in_sync_followers(rep: ReplicaState, p: int) -> list[FollowerProgress]:
    """The followers a write of p waits for now."""
    m = rep.mastered.get(p)
    return [fp for fp in m.followers.values() if fp.counted] if m is not None else []


def lag(rep: ReplicaState, p: int, fp: FollowerProgress) -> int:
    m = rep.mastered.get(p)
    return m.lag(fp) if m is not None else 0


def lag_by_follower(rep: ReplicaState) -> dict[str, int]:
    """Entries each follower node has not acknowledged, over the partitions mastered here."""
    lags: dict[str, int] = {}
    for m in rep.mastered.values():
        for fp in m.followers.values():
            lags[fp.node] = lags.get(fp.node, 0) + m.lag(fp)
    return lags


def _bytes_left(m: MasteredPartition, fp: FollowerProgress, state: Callable[[], int]) -> int:
    """About what the follower still lacks, in bytes of storage ops (Entry.size's measure)."""
    if fp.state == FollowerState.SNAPSHOT:
        return max(state() - fp.snapshot_sent, 0) + (m.log.bytes_after(fp.snapshot_at[1]) or 0)
    lacking = m.log.bytes_after(fp.acked) if fp.state != FollowerState.WAITING else None
    return state() if lacking is None else lacking  # None: it needs a snapshot
