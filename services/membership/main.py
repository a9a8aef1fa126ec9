"""`hexmq membership`: serve the cluster view to the node's edge and partition services."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.hashring import DEFAULT_PARTITIONS
from hexmq.health import add_health
from hexmq.netaddr import parse_hostport
from hexmq.readiness import Readiness, follow_in_health
from hexmq.service import (
    Observability,
    add_observability_arguments,
    cancel_and_wait,
    run_service,
    setup_logging,
    start_observability,
)
from services.membership.backend import (
    MembershipBackend,
    MembershipEvent,
    StaticMembership,
    ViewBuilder,
)
from services.membership.server import MembershipServicer, ViewBoard
from services.membership.view import MembersFileError, load_members

log = logging.getLogger("hexmq.membership")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="this node's id, e.g. n1")
    parser.add_argument("--listen", required=True, help="gRPC HOST:PORT to serve on")
    parser.add_argument(
        "--members",
        required=True,
        type=Path,
        help="JSON file listing every member (static membership, the embedded default)",
    )
    parser.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS)
    parser.add_argument("--rf", type=int, default=1, help="replication factor")
    parser.add_argument("--log-level", default="INFO")
    add_observability_arguments(parser)


def run(args: argparse.Namespace) -> int:
    setup_logging("membership", args.node_id, args.log_level)
    try:
        parse_hostport(args.listen, what="--listen")
        members = load_members(args.members)
        if args.partitions < 1 or args.rf < 1:
            raise ValueError("--partitions and --rf must be at least 1")
    except (ValueError, MembersFileError) as exc:
        log.error("%s", exc)
        return 2
    if args.node_id not in {m.node_id for m in members}:
        log.error("--node-id %s is not in %s", args.node_id, args.members)
        return 2
    backend: MembershipBackend = StaticMembership(members)
    builder = ViewBuilder(partitions=args.partitions, rf=args.rf)

    async def main(stop: asyncio.Event) -> int:
        try:
            obs = start_observability("membership", args.node_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        changes = aiter(backend.events())
        view = None
        while view is None:
            view = builder.apply(await anext(changes))
        _record_view(obs, view)
        board = ViewBoard(view)
        obs.ready_when(lambda: membership_readiness(board))
        server = grpc.aio.server()
        pb_grpc.add_MembershipServiceServicer_to_server(MembershipServicer(board), server)
        health = add_health(server)
        try:
            server.add_insecure_port(args.listen)
        except RuntimeError as exc:
            log.error("cannot listen on %s: %s", args.listen, exc)
            await obs.close()
            return 1
        await server.start()
        health_follower = asyncio.create_task(follow_in_health(obs.readiness, health))
        log.info(
            "serving view epoch %d (%d members, %d partitions, rf %d) on %s",
            view.epoch,
            len(view.members),
            view.partition_count,
            view.replication_factor,
            args.listen,
        )
        follow = asyncio.create_task(_follow(changes, builder, board, obs))
        await stop.wait()
        follow.cancel()
        await cancel_and_wait(health_follower)
        await server.stop(grace=1.0)
        await obs.close()
        return 0

    return run_service(main)


def membership_readiness(board: ViewBoard) -> Readiness:
    """Ready once it has a view to serve (the static backend builds it before serving; the
    Consul-backed agent refines this to an agreed view)."""
    view = board.view
    return Readiness(True, f"view {view.epoch}: {len(view.members)} members")


async def _follow(
    changes: AsyncIterator[list[MembershipEvent]],
    builder: ViewBuilder,
    board: ViewBoard,
    obs: Observability,
) -> None:
    """Publish a new view for every change the backend reports."""
    async for events in changes:
        view = builder.apply(events)
        if view is not None:
            log.info("view %d: %d members", view.epoch, len(view.members))
            _record_view(obs, view)
            await board.publish(view)


def _record_view(obs: Observability, view: pb.View) -> None:
    """A membership.view span and the view epoch gauge."""
    telemetry.METRICS.view_epoch.set(view.epoch)
    with obs.tracing.span(telemetry.SpanName.MEMBERSHIP_VIEW) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    telemetry.Attr.VIEW_EPOCH: view.epoch,
                    telemetry.Attr.NODE: obs.node_id,
                    "hexmq.view.members": len(view.members),
                }
            )
