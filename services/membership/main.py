"""`hexmq membership`: serve the cluster view to the node's edge and partition services."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

import grpc

from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.hashring import DEFAULT_PARTITIONS
from hexmq.netaddr import parse_hostport
from hexmq.service import run_service, setup_logging
from services.membership.server import MembershipServicer, ViewBoard
from services.membership.view import MembersFileError, build_view, load_members

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
    view = build_view(members, partitions=args.partitions, rf=args.rf, epoch=1)

    async def main(stop: asyncio.Event) -> int:
        server = grpc.aio.server()
        pb_grpc.add_MembershipServiceServicer_to_server(MembershipServicer(ViewBoard(view)), server)
        try:
            server.add_insecure_port(args.listen)
        except RuntimeError as exc:
            log.error("cannot listen on %s: %s", args.listen, exc)
            return 1
        await server.start()
        log.info(
            "serving view epoch %d (%d members, %d partitions, rf %d) on %s",
            view.epoch,
            len(view.members),
            view.partition_count,
            view.replication_factor,
            args.listen,
        )
        await stop.wait()
        await server.stop(grace=1.0)
        return 0

    return run_service(main)
