"""The partition service's parts, built in the order they need each other (`assemble`), each
given its collaborators when built: nothing is wired afterwards by setting another object's
attributes.

1. `CommitQueue`, the group commit's core: the handlers gather their writes and effects in it.
2. `RedisStore`, the reads (a master loading a partition, snapshots, positions).
3. `Replicator`, the replication state machine, and `PartitionNode`, the command handlers,
   which gather into the queue and read the replicator (for spans).
4. `ReplicationDriver`, the replication's I/O: it hands the node its roles (`roles=node`) and
   releases the queue's batches once the followers have them (`release`: release_batches
   over the queue and the node's `carry_out`; this is what lets the driver come before the
   group commit).
5. `GroupCommit`, the commit's I/O: it writes each batch, hands the durable one to the
   driver (`on_durable`) and carries out the node's effects.
6. `ViewDoor`, the one way a view reaches the node and the driver (view_door.py).

Serving (the gRPC server, the view watcher, housekeeping.py's sweeps) is main.py's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio as redis

from hexmq import telemetry
from hexmq.pacing import FlushPacer
from hexmq.trust.grpc_tls import ClusterTLS
from services.partition.agreement import AgreementClient
from services.partition.commit_queue import FULL_COMMIT, CommitQueue
from services.partition.delivery import QueueLimits
from services.partition.group_commit import GroupCommit, release_batches
from services.partition.node import PartitionNode
from services.partition.peers import ReplicationDriver
from services.partition.qos2_seen import SeenOrigins
from services.partition.redis_tx import TransactionClient
from services.partition.replication import ReplicationLimits, Replicator
from services.partition.store import RedisStore
from services.partition.view_door import ViewDoor

# The replication state machine's clock (lag detection, gap retries).
TICK_S = 0.1


@dataclass(frozen=True, slots=True)
class ServiceParts:
    queue: CommitQueue
    store: RedisStore
    replicator: Replicator
    node: PartitionNode
    replication: ReplicationDriver
    commit: GroupCommit
    door: ViewDoor


def assemble(
    node_id: str,
    *,
    client: redis.Redis,
    writer: TransactionClient,
    write_timeout: float | None,
    limits: QueueLimits,
    replication_limits: ReplicationLimits,
    seen: SeenOrigins,
    tracing: telemetry.Tracing,
    incarnation: int,
    agent: AgreementClient | None,
    tls: ClusterTLS,
    on_failure: Callable[[BaseException], None],
) -> ServiceParts:
    """The parts of one partition service over `client` (reads) and `writer` (the group
    commit's and the follower's transactions); `on_failure` hears a storage failure (the
    service stops). Nothing is started: see `GroupCommit.start`, `ReplicationDriver.start`."""
    queue = CommitQueue(FlushPacer(full=FULL_COMMIT))
    store = RedisStore(client)
    replicator = Replicator(node_id, replication_limits)
    node = PartitionNode(
        node_id,
        store,
        queue,
        tracing,
        limits,
        replicator,
        seen,
        on_failure=on_failure,
    )
    replication = ReplicationDriver(
        replicator,
        store,
        on_failure,
        roles=node,
        release=functools.partial(release_batches, queue, node.carry_out),
        tick_s=TICK_S,
        incarnation=incarnation,
        agent=agent,
        writer=writer,
        write_timeout=write_timeout,
        tls=tls,
    )
    commit = GroupCommit(
        queue,
        writer,
        replicator,
        node.carry_out,
        on_failure,
        on_durable=replication.master_durable,
        write_timeout=write_timeout,
    )
    return ServiceParts(
        queue, store, replicator, node, replication, commit, ViewDoor(node, replication)
    )
