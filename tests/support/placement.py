"""Client ids placed on a chosen node: a session lives in partition(client id), mastered by the
first replica the hashring gives it (hexmq.hashring.assign over the members n1..nN)."""

from __future__ import annotations

import functools

from hexmq.hashring import assign, partition_of
from hexmq_cli import clusterstate
from tests.support.unique import uid


@functools.cache
def _masters(nodes: int, partitions: int, rf: int) -> tuple[str, ...]:
    table = assign([f"n{i}" for i in range(1, nodes + 1)], partitions, rf)
    return tuple(replicas[0] for replicas in table)


def client_id_on(
    node_id: str,
    nodes: int,
    prefix: str = "c",
    *,
    rf: int = 1,
    partitions: int = clusterstate.DEFAULT_PARTITIONS,
) -> str:
    """A fresh client id whose session a `hexmq cluster up --nodes N --rf R` cluster places on
    `node_id`."""
    masters = _masters(nodes, partitions, rf)
    while True:
        cid = f"{prefix}-{uid()}"
        if masters[partition_of(cid, partitions)] == node_id:
            return cid
