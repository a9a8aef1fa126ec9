"""`hexmq partition`: the node's partition service over its own Redis."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import ssl
import time
from pathlib import Path

import grpc
import redis.asyncio as redis

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.grpc_options import CLUSTER_CHANNEL_OPTIONS, LINK_OPTIONS
from hexmq.health import NOT_SERVING, SERVING, add_health
from hexmq.membership.client import (
    ViewWatcher,
    add_leave_timeout,
    check_leave_timeout,
    describe_leave,
    leave_cluster,
)
from hexmq.netaddr import parse_hostport
from hexmq.node_protocol import THIS_RELEASE
from hexmq.pacing import (
    FlushPacer,
    add_batch_interval_argument,
    apply_batch_interval,
    follow_contention,
)
from hexmq.service import (
    StopEvent,
    add_observability_arguments,
    run_service,
    setup_logging,
    start_observability,
)
from hexmq.trust.grpc_tls import ClusterTLS, RenewingChannel, add_cluster_tls_arguments
from hexmq.trust.guard import Guard
from hexmq.trust.identity import MEMBERSHIP, PARTITION, Identity
from services.partition import redis_access
from services.partition.agreement import AgreementClient
from services.partition.commit_queue import FULL_COMMIT, CommitQueue
from services.partition.delivery import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_RETAINED_BYTES,
    DEFAULT_MAX_RETAINED_MESSAGES,
    DEFAULT_MAX_SUBSCRIPTIONS,
    QueueLimits,
)
from services.partition.group_commit import GroupCommit, release_batches
from services.partition.node import PartitionNode
from services.partition.peers import ReplicationDriver
from services.partition.qos2_seen import DEFAULT_RETENTION_S, SeenOrigins
from services.partition.redis_access import PASSWORD_VARIABLE, RedisAccess, redacted
from services.partition.redis_tx import RedisTransactions
from services.partition.replication import DEFAULT_LOG_ENTRIES, ReplicationLimits, Replicator
from services.partition.roles import WAIT_S
from services.partition.server import PartitionServicer
from services.partition.store import RedisStore, redis_client

log = logging.getLogger("hexmq.partition")

# The replication state machine's clock (lag detection, gap retries).
TICK_S = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="this node's id, e.g. n1")
    parser.add_argument("--listen", required=True, help="gRPC HOST:PORT to serve edges on")
    parser.add_argument(
        "--redis",
        required=True,
        help="the node's Redis, redis://HOST:PORT/DB (rediss:// for TLS, or unix://PATH?db=N)",
    )
    parser.add_argument(
        "--redis-user",
        metavar="NAME",
        help="the Redis ACL user to authenticate as (default: Redis's `default` user)",
    )
    parser.add_argument(
        "--redis-password-file",
        type=Path,
        metavar="FILE",
        help=f"the Redis password is this file's content (or give it in {PASSWORD_VARIABLE}; "
        "never on a command line)",
    )
    parser.add_argument(
        "--redis-ca",
        metavar="FILE",
        help="rediss://: Redis's certificate must be signed by this CA (PEM) (default: the "
        "system's CAs) and name the URL's host",
    )
    parser.add_argument(
        "--redis-cert",
        metavar="FILE",
        help="rediss://: this client's certificate (PEM), for a Redis with tls-auth-clients",
    )
    parser.add_argument(
        "--redis-key", metavar="FILE", help="rediss://: the key of --redis-cert (PEM)"
    )
    parser.add_argument("--membership", required=True, help="the node's membership HOST:PORT")
    add_leave_timeout(parser)
    parser.add_argument("--startup-timeout", type=float, default=30.0)
    parser.add_argument(
        "--max-queued-messages",
        type=int,
        default=DEFAULT_MAX_QUEUED,
        help="QoS 1/2 messages one session may hold; past it see --queue-overflow "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--max-queued-bytes",
        type=int,
        default=DEFAULT_MAX_QUEUED_BYTES,
        metavar="BYTES",
        help="payload and topic bytes of the QoS 1/2 messages one session may hold; past it "
        "see --queue-overflow (default %(default)s, 16 MiB)",
    )
    parser.add_argument(
        "--max-subscriptions",
        type=int,
        default=DEFAULT_MAX_SUBSCRIPTIONS,
        metavar="N",
        help="subscriptions one session may hold; a SUBSCRIBE's further filters get SUBACK "
        "0x97 (5.0) / 0x80 (3.1.1) (default %(default)s)",
    )
    parser.add_argument(
        "--max-retained-messages",
        type=int,
        default=DEFAULT_MAX_RETAINED_MESSAGES,
        metavar="N",
        help="retained messages the whole cluster holds (each node its share of the "
        "partitions it masters); a retained PUBLISH for a new topic past it is delivered but "
        "not retained, and a 5.0 publisher gets 0x97 (default %(default)s)",
    )
    parser.add_argument(
        "--max-retained-bytes",
        type=int,
        default=DEFAULT_MAX_RETAINED_BYTES,
        metavar="BYTES",
        help="payload and topic bytes of the cluster's retained messages, shared like "
        "--max-retained-messages (default %(default)s, 1 GiB)",
    )
    parser.add_argument(
        "--queue-overflow",
        choices=("drop-newest", "drop-oldest"),
        default="drop-newest",
        help="a full session queue does not take the new message (drop-newest) or drops its "
        "oldest to make room (drop-oldest); either is counted in hexmq_dropped_messages_total",
    )
    parser.add_argument(
        "--replication-log-entries",
        type=int,
        default=DEFAULT_LOG_ENTRIES,
        help="recent log entries kept per mastered partition for followers to catch up from; "
        "a follower further behind gets a snapshot of the partition",
    )
    parser.add_argument(
        "--replica-lag-timeout",
        type=float,
        default=5.0,
        help="seconds an in-sync follower may stay behind before writes stop waiting for it",
    )
    parser.add_argument(
        "--qos2-dedupe-retention",
        type=float,
        default=DEFAULT_RETENTION_S,
        metavar="SECONDS",
        help="how long a target partition remembers a QoS 2 routing whose end it was never told "
        "of (its edge died); a retry of that routing later than this is stored again "
        "(default %(default)g: 24 h)",
    )
    parser.add_argument(
        "--redis-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a Redis command (or connect) that takes longer fails, and the service stops: its "
        "partitions fail over (default %(default)g)",
    )
    add_batch_interval_argument(parser)
    parser.add_argument("--log-level", default="INFO")
    add_observability_arguments(parser)
    add_cluster_tls_arguments(parser)


def run(args: argparse.Namespace) -> int:
    setup_logging("partition", args.node_id, args.log_level)
    try:
        parse_hostport(args.listen, what="--listen")
        parse_hostport(args.membership, what="--membership")
        for name in (
            "max_queued_messages",
            "max_queued_bytes",
            "max_subscriptions",
            "max_retained_messages",
            "max_retained_bytes",
        ):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if args.replication_log_entries < 1:
            raise ValueError("--replication-log-entries must be at least 1")
        if not args.redis_timeout > 0:
            raise ValueError("--redis-timeout must be positive")
        if args.replica_lag_timeout <= 0:
            raise ValueError("--replica-lag-timeout must be positive")
        if not args.qos2_dedupe_retention > 0:
            raise ValueError("--qos2-dedupe-retention must be positive")
        check_leave_timeout(args.leave_timeout)
        access, warnings = redis_access.from_options(
            args.redis,
            user=args.redis_user,
            password_file=args.redis_password_file,
            ca=args.redis_ca,
            cert=args.redis_cert,
            key=args.redis_key,
            environ=os.environ,
        )
        apply_batch_interval(args)
        tls = ClusterTLS.from_args(args, Identity(PARTITION, args.node_id))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    tls.warn_if_insecure()
    # The node's own membership agent serves as this process does.
    dial_agent = functools.partial(
        tls.channel,
        args.membership,
        peer=Identity(MEMBERSHIP, args.node_id),
        # Pings: a watch only receives, and would not notice a dead connection.
        options=CLUSTER_CHANNEL_OPTIONS,
    )
    for warning in warnings:
        log.warning("%s", warning)
    redis_at = redacted(args.redis)

    async def main(stop: StopEvent) -> int:
        try:
            obs = start_observability("partition", args.node_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        # Reads and snapshots go through redis-py; the hot path's two writers (group commit,
        # follower writes) share a lean transaction writer (services/partition/redis_tx.py),
        # each MULTI/EXEC with --redis-timeout in all. Both as the same user, over the same TLS.
        client = redis_client(args.redis, args.redis_timeout, access=access)
        writer = RedisTransactions(args.redis, connect_timeout=args.redis_timeout, access=access)
        refused = await _check_redis(client, writer, access, args.startup_timeout)
        if refused is not None:
            log.error("redis at %s %s", redis_at, refused)
            await client.aclose()
            await writer.aclose()
            return 1
        exit_code = 0

        def storage_failed(exc: BaseException) -> None:
            nonlocal exit_code
            log.critical("%s; stopping so that state reloads from Redis on restart", exc)
            exit_code = 1
            stop.set()

        replicator = Replicator(
            args.node_id,
            ReplicationLimits(
                log_entries=args.replication_log_entries,
                lag_ticks=max(1, round(args.replica_lag_timeout / TICK_S)),
            ),
        )
        # This process's incarnation: the view admits the node only with the partition service
        # that runs now (a restart is a new incarnation, docs/failover.md).
        incarnation = time.time_ns()
        # Built in the order they need each other, each given its collaborators when built:
        # the handlers gather into the group commit's core (queue), the replication driver
        # hands the node its roles and releases the queue's batches once the followers have
        # them, and the group commit carries out the node's effects and hands durable batches
        # to the driver.
        queue = CommitQueue(FlushPacer(full=FULL_COMMIT))
        store = RedisStore(client)
        limits = QueueLimits(
            args.max_queued_messages,
            args.queue_overflow == "drop-oldest",
            max_queued_bytes=args.max_queued_bytes,
            max_subscriptions=args.max_subscriptions,
            max_retained_messages=args.max_retained_messages,
            max_retained_bytes=args.max_retained_bytes,
        )
        seen = SeenOrigins(int(args.qos2_dedupe_retention * 1000))
        node = PartitionNode(
            args.node_id,
            store,
            queue,
            obs.tracing,
            limits,
            replicator,
            seen,
            on_failure=storage_failed,
        )
        agent = AgreementClient(args.membership, incarnation, RenewingChannel(dial_agent, tls))
        replication = ReplicationDriver(
            replicator,
            store,
            storage_failed,
            roles=node,
            release=functools.partial(release_batches, queue, node.carry_out),
            tick_s=TICK_S,
            incarnation=incarnation,
            agent=agent,
            writer=writer,
            write_timeout=args.redis_timeout,
            tls=tls,
        )
        commit = GroupCommit(
            queue,
            writer,
            replicator,
            node.carry_out,
            storage_failed,
            on_durable=replication.master_durable,
            write_timeout=args.redis_timeout,
        )
        ready = asyncio.Event()

        async def on_view(view: mpb.View) -> None:
            node.apply_view(view)
            await replication.apply_view(view)
            if not ready.is_set():
                ready.set()
                await health.set("", SERVING)
            if not replication.admitted(view):
                log.info(
                    "view %d does not admit this partition service (incarnation %d): no roles",
                    view.epoch,
                    incarnation,
                )

        watcher = ViewWatcher(
            args.membership,
            on_view,
            incarnation=incarnation,
            protocol=THIS_RELEASE,
            dial=dial_agent,
            node_id=args.node_id,
        )
        server = grpc.aio.server(options=LINK_OPTIONS)
        guard = Guard(tls, "partition")
        pb_grpc.add_PartitionServiceServicer_to_server(
            PartitionServicer(node, replication, ready, guard), server
        )
        health = add_health(server)
        try:
            tls.add_port(server, args.listen)
        except RuntimeError as exc:
            log.error("cannot listen on %s: %s", args.listen, exc)
            return 1
        # Serving (health first) before the first view: the membership agents probe this
        # process from the start, and edges wait on `ready` for their links.
        await health.set("", NOT_SERVING)
        await server.start()
        commit.start()
        replication.start()
        watcher.start()
        try:
            async with asyncio.timeout(args.startup_timeout):
                await watcher.wait_ready()
        except TimeoutError:
            log.error(
                "no view from membership at %s within %.0fs", args.membership, args.startup_timeout
            )
            return 1
        log.info(
            "serving edges on %s (pid %d, %s); speaks protocol %s",
            args.listen,
            os.getpid(),
            tls.describe(),
            THIS_RELEASE.describe(),
        )
        sweeper = asyncio.create_task(_sweep(node))
        metrics = asyncio.create_task(_report_metrics(node, queue, replicator))
        pacing = asyncio.create_task(follow_contention(telemetry.METRICS.batch_interval.set))
        await stop.wait()
        if stop.leave and exit_code == 0:
            # SIGTERM: the node leaves first, serving on while its master roles are handed over
            # and its replicas are copied elsewhere (docs/operations.md, "Leaving").
            reply = await leave_cluster(args.membership, dial_agent, args.leave_timeout, stop.plain)
            log.info("%s", describe_leave(reply, args.leave_timeout))
        log.info("shutting down")
        sweeper.cancel()
        metrics.cancel()
        pacing.cancel()
        await server.stop(grace=2.0)
        await commit.stop()
        await replication.stop()
        await watcher.stop()
        await agent.close()
        await client.aclose()
        await writer.aclose()
        await obs.close()
        return exit_code

    return run_service(main)


async def _check_redis(
    client: redis.Redis, writer: RedisTransactions, access: RedisAccess, within: float
) -> str | None:
    """None once Redis answers PING and the transaction writer holds a connection; else why
    not. A Redis still starting (refusing connections, loading its append-only file) is waited
    for, up to `within` seconds; a refused password or permission, or a TLS failure, is not
    (waiting would not change it)."""
    last: BaseException | None = None
    try:
        async with asyncio.timeout(within):
            while True:
                try:
                    await client.ping()
                    await writer.connect()
                    return None
                except redis.AuthenticationError as exc:
                    return (
                        f"refused user {access.who}: {exc} (the password: --redis-password-file "
                        f"or {PASSWORD_VARIABLE}; the user: --redis-user)"
                    )
                except redis.ResponseError as exc:
                    return f"refused user {access.who}: {exc}"
                except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                    if _tls_failure(exc):
                        return f"failed TLS: {exc} (--redis-ca, --redis-cert, --redis-key)"
                    last = exc
                    await asyncio.sleep(0.05)
    except TimeoutError:
        why = f" (last: {last})" if last is not None else ""
        return f"did not answer within {within:.0f}s{why}"


def _tls_failure(exc: BaseException) -> bool:
    """A TLS handshake refused by either side (not a connection cut during one)."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if isinstance(cause, ssl.SSLError) and not isinstance(
            cause, ssl.SSLEOFError | ssl.SSLZeroReturnError
        ):
            return True
    return False


async def _sweep(node: PartitionNode) -> None:
    while True:
        await asyncio.sleep(1.0)
        waited = node.expire_waiting(node.monotonic())
        if waited:
            log.warning(
                "%d commands waited %.0f s for partitions this node was to serve; answered "
                "UNAVAILABLE (their edges ask again)",
                waited,
                WAIT_S,
            )
        now = node.clock()
        node.settle_takeovers(now)
        expired = node.expire_sessions(now)
        node.hand_out_wills(now)
        node.hand_out_shared(now)
        if expired:
            log.info("expired %d sessions", expired)
        swept = node.sweep_qos2_seen(now)
        if swept:
            log.info(
                "forgot %d QoS 2 origin ids after --qos2-dedupe-retention without a forget from "
                "their edge (a retry of those routings would be stored again)",
                swept,
            )


async def _report_metrics(node: PartitionNode, queue: CommitQueue, replicator: Replicator) -> None:
    """Copy the node's state into its gauges once a second (nothing on the hot path)."""
    m = telemetry.METRICS
    queue_full = m.dropped_messages.labels("queue_full")
    reported = resent = 0
    limits_reported: dict[str, int] = {}
    while True:
        for key, count in node.limit_counts.counters().items():
            limit = key.removeprefix("limits/")
            delta = count - limits_reported.get(limit, 0)
            if delta:
                m.limit_refusals.labels(limit).inc(delta)
                limits_reported[limit] = count
        queue_full.inc(node.dropped_queue_full - reported)
        reported = node.dropped_queue_full
        m.resent_publishes.inc(node.resent_publishes - resent)
        resent = node.resent_publishes
        if node.view is not None:
            m.view_epoch.set(node.view.epoch)
        m.partition_roles.labels("master").set(len(node.mastered))
        m.partition_roles.labels("follower").set(len(replicator.followed))
        m.partition_roles.labels("catching_up").set(
            sum(1 for fd in replicator.followed.values() if fd.loading)
        )
        for follower, lag in replicator.lag_by_follower().items():
            m.replication_lag.labels(follower).set(lag)
        m.queue_depth.labels("queued_messages").set(node.queued_messages())
        m.queue_depth.labels("sessions").set(len(node.sessions))
        m.queue_depth.labels("storage_batch").set(queue.gathering)
        m.queue_depth.labels("qos2_seen").set(len(node.seen))
        await asyncio.sleep(1.0)
