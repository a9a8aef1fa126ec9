"""Partition keys and replica placement: a consistent hashring with virtual nodes.

Pure and deterministic: every node computes the same table from the same members, so the only
thing the cluster has to agree on is the member list (DESIGN.md, "Keys, partitions, hashring").
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Sequence

DEFAULT_PARTITIONS = 256
DEFAULT_VNODES = 128
# No member masters more than this multiple of its fair share of partitions.
LOAD_BOUND = 1.1


def _hash64(data: str) -> int:
    return int.from_bytes(hashlib.blake2b(data.encode(), digest_size=8).digest(), "big")


def partition_of(key: str, partitions: int) -> int:
    """The partition that owns `key` (a client id for sessions, a topic for retained messages)."""
    return _hash64(key) % partitions


def _ring(names: Sequence[str], vnodes: int) -> tuple[list[tuple[int, str]], list[int]]:
    ring = sorted((_hash64(f"{name}#{v}"), name) for name in names for v in range(vnodes))
    return ring, [point for point, _ in ring]


def assign(
    members: Iterable[str], partitions: int, rf: int, *, vnodes: int = DEFAULT_VNODES
) -> list[tuple[str, ...]]:
    """Replica lists for partitions 0..partitions-1; the first replica of each is its master.

    A partition's replicas are the first min(rf, len(members)) distinct members clockwise from the
    partition's point on a ring where each member stands at `vnodes` points.
    """
    names = sorted(set(members))
    if not names:
        raise ValueError("assign needs at least one member")
    if partitions < 1 or rf < 1:
        raise ValueError("partitions and rf must be positive")
    ring, points = _ring(names, vnodes)
    want = min(rf, len(names))
    # Consistent hashing with bounded loads (Mirrokni et al.): a member already at its cap is
    # passed over, so no member masters (or holds) more than ~LOAD_BOUND of its fair share,
    # while a join still moves only about 1/N of the partitions.
    master_cap = math.ceil(partitions / len(names) * LOAD_BOUND)
    replica_cap = math.ceil(partitions * want / len(names) * LOAD_BOUND)
    masters: dict[str, int] = dict.fromkeys(names, 0)
    held: dict[str, int] = dict.fromkeys(names, 0)
    table: list[tuple[str, ...]] = []
    for p in range(partitions):
        start = bisect.bisect(points, _hash64(f"partition#{p}"))
        replicas: list[str] = []
        for i in range(len(ring)):
            name = ring[(start + i) % len(ring)][1]
            if name in replicas or held[name] >= replica_cap:
                continue
            if not replicas and masters[name] >= master_cap:
                continue
            replicas.append(name)
            if len(replicas) == want:
                break
        if len(replicas) < want:
            # The caps can exclude every member left (those under the master cap already
            # hold their replica cap): fill from the ring without them, as plain consistent
            # hashing would. Inputs that never hit this place as before.
            for _, name in ring[start:] + ring[:start]:
                if name not in replicas:
                    replicas.append(name)
                    if len(replicas) == want:
                        break
        masters[replicas[0]] += 1
        for name in replicas:
            held[name] += 1
        table.append(tuple(replicas))
    return table


def ring_order(
    members: Iterable[str], partitions: int, *, vnodes: int = DEFAULT_VNODES
) -> list[tuple[str, ...]]:
    """Per partition, every member once, in the order met clockwise from the partition's point.

    The ring's preference list without assign()'s load bound: who is next for a partition when
    the nodes before it are gone (docs/failover.md, "Placement").
    """
    names = sorted(set(members))
    if not names:
        raise ValueError("ring_order needs at least one member")
    if partitions < 1:
        raise ValueError("partitions must be positive")
    ring, points = _ring(names, vnodes)
    orders: list[tuple[str, ...]] = []
    for p in range(partitions):
        start = bisect.bisect(points, _hash64(f"partition#{p}"))
        seen: dict[str, None] = {}
        for i in range(len(ring)):
            seen.setdefault(ring[(start + i) % len(ring)][1])
            if len(seen) == len(names):
                break
        orders.append(tuple(seen))
    return orders


def masters_per_member(table: Sequence[tuple[str, ...]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for replicas in table:
        counts[replicas[0]] = counts.get(replicas[0], 0) + 1
    return counts
