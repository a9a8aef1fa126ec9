"""`hexmq partition`: the node's partition service over its own Redis. This module runs it:
the options checked (options.py), the parts built (wiring.py), then serving until stopped:
the gRPC server and its health, the view watcher (each view through the parts' ViewDoor),
the sweeps (housekeeping.py), and a shutdown in stages."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import time

import grpc

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.grpc_options import CLUSTER_CHANNEL_OPTIONS, LINK_OPTIONS
from hexmq.health import NOT_SERVING, SERVING, add_health
from hexmq.inproc import NodeServers, stop_servers
from hexmq.membership.client import ViewWatcher, describe_leave, leave_cluster
from hexmq.node_protocol import THIS_RELEASE
from hexmq.pacing import follow_contention
from hexmq.service import (
    ServiceMain,
    StopEvent,
    run_service,
    setup_logging,
    start_observability,
)
from hexmq.streams import Dial
from hexmq.trust.grpc_tls import ClusterTLS, RenewingChannel
from hexmq.trust.guard import Guard
from hexmq.trust.identity import MEMBERSHIP, PARTITION, Identity
from services.partition.agreement import AgreementClient
from services.partition.housekeeping import report_metrics, sweep
from services.partition.options import (
    add_arguments,
    check_options,
    queue_limits,
    replication_limits,
)
from services.partition.qos2_seen import SeenOrigins
from services.partition.redis_access import redacted
from services.partition.redis_check import check_redis
from services.partition.redis_tx import RedisTransactions
from services.partition.server import PartitionServicer
from services.partition.store import redis_client
from services.partition.wiring import TICK_S, assemble

__all__ = ["add_arguments", "run"]

log = logging.getLogger("hexmq.partition")


def run(args: argparse.Namespace) -> int:
    setup_logging("partition", args.node_id, args.log_level)
    main = prepare(args)
    return main if isinstance(main, int) else run_service(main)


def prepare(args: argparse.Namespace, colocated: NodeServers | None = None) -> ServiceMain | int:
    """The service's `main(stop)`, or the exit code when the options are wrong (logged).
    `colocated`: the co-located node (`hexmq node`): the service calls its agent in process, and
    serves the node's edge in process too."""
    try:
        access, warnings = check_options(args)
        tls = ClusterTLS.from_args(args, Identity(PARTITION, args.node_id))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    tls.warn_if_insecure()
    dial_agent: Dial
    if colocated is not None:
        dial_agent = functools.partial(colocated.to_membership, PARTITION, tls.trust_domain)
    else:
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
        # Whichever way it ends, it gives back what it took (ports, connections, tasks): a
        # co-located node starts it again in the same process (hexmq_cli/node.py).
        async with contextlib.AsyncExitStack() as later:
            return await serve(stop, later)

    async def serve(stop: StopEvent, later: contextlib.AsyncExitStack) -> int:
        try:
            obs = start_observability("partition", args.node_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        later.push_async_callback(obs.close)
        # Reads and snapshots go through redis-py; the hot path's two writers (group commit,
        # follower writes) share a lean transaction writer (services/partition/redis_tx.py),
        # each MULTI/EXEC with --redis-timeout in all. Both as the same user, over the same TLS.
        client = redis_client(args.redis, args.redis_timeout, access=access)
        writer = RedisTransactions(args.redis, connect_timeout=args.redis_timeout, access=access)
        later.push_async_callback(writer.aclose)
        later.push_async_callback(client.aclose)
        refused = await check_redis(client, writer, access, args.startup_timeout)
        if refused is not None:
            log.error("redis at %s %s", redis_at, refused)
            return 1
        exit_code = 0

        def storage_failed(exc: BaseException) -> None:
            nonlocal exit_code
            log.critical("%s; stopping so that state reloads from Redis on restart", exc)
            exit_code = 1
            stop.set()

        # This process's incarnation: the view admits the node only with the partition service
        # that runs now (a restart is a new incarnation, docs/failover.md).
        incarnation = time.time_ns()
        agent = AgreementClient(args.membership, incarnation, RenewingChannel(dial_agent, tls))
        later.push_async_callback(agent.close)

        parts = assemble(
            args.node_id,
            client=client,
            writer=writer,
            write_timeout=args.redis_timeout,
            limits=queue_limits(args),
            replication_limits=replication_limits(args, TICK_S),
            seen=SeenOrigins(int(args.qos2_dedupe_retention * 1000)),
            tracing=obs.tracing,
            incarnation=incarnation,
            agent=agent,
            tls=tls,
            on_failure=storage_failed,
        )
        node, replication, commit = parts.node, parts.replication, parts.commit
        ready = asyncio.Event()

        async def on_view(view: mpb.View) -> None:
            admitted = await parts.door.enter(view)
            if not ready.is_set():
                ready.set()
                await health.set("", SERVING)
            if not admitted:
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
        servicer = PartitionServicer(node, replication, ready, guard)
        pb_grpc.add_PartitionServiceServicer_to_server(servicer, server)
        if colocated is not None:
            pb_grpc.add_PartitionServiceServicer_to_server(servicer, colocated.partition)
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
        if colocated is not None:
            await colocated.partition.start()
        commit.start()
        replication.start()
        watcher.start()

        async def stop_serving() -> None:
            await stop_servers(2.0, server, colocated.partition if colocated else None)
            await commit.stop()
            await replication.stop()
            await watcher.stop()

        later.push_async_callback(stop_serving)
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
        sweeper = asyncio.create_task(sweep(node))
        metrics = asyncio.create_task(report_metrics(node, parts.queue, parts.replicator))
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
        # Then `later`: the servers, the commit, replication and the watcher, the agent's
        # client, Redis, tracing and metrics.
        return exit_code

    return main
