"""`hexmq edge`: the node's MQTT listener."""

from __future__ import annotations

import argparse
import asyncio
import logging

from hexmq.netaddr import parse_hostport
from hexmq.service import run_service, setup_logging
from services.edge.server import (
    DEFAULT_MAX_INFLIGHT_V311,
    DEFAULT_MAX_PACKET_SIZE,
    DEFAULT_RECEIVE_MAXIMUM,
    Edge,
    EdgeConfig,
)

log = logging.getLogger("hexmq.edge")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="this node's id, e.g. n1")
    parser.add_argument("--listen", required=True, help="MQTT HOST:PORT, e.g. 127.0.0.1:1883")
    parser.add_argument("--membership", required=True, help="the node's membership HOST:PORT")
    parser.add_argument(
        "--max-packet-size",
        type=int,
        default=DEFAULT_MAX_PACKET_SIZE,
        help="largest MQTT packet accepted, in bytes (announced to 5.0 clients)",
    )
    parser.add_argument(
        "--receive-maximum",
        type=int,
        default=DEFAULT_RECEIVE_MAXIMUM,
        help="unacknowledged QoS 1 publishes a client may have in flight",
    )
    parser.add_argument(
        "--max-inflight-v311",
        type=int,
        default=DEFAULT_MAX_INFLIGHT_V311,
        help="QoS 1 deliveries in flight to a 3.1.1 client",
    )
    parser.add_argument(
        "--sys-interval",
        type=float,
        default=10.0,
        help="seconds between $SYS/broker/nodes/<node>/... publications (0: none)",
    )
    parser.add_argument("--startup-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="INFO")


def run(args: argparse.Namespace) -> int:
    setup_logging("edge", args.node_id, args.log_level)
    try:
        host, port = parse_hostport(args.listen, what="--listen")
        parse_hostport(args.membership, what="--membership")
        for name in ("max_packet_size", "receive_maximum", "max_inflight_v311"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if args.receive_maximum > 65535 or args.max_inflight_v311 > 65535:
            raise ValueError("--receive-maximum and --max-inflight-v311 must be at most 65535")
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    config = EdgeConfig(
        node_id=args.node_id,
        host=host,
        port=port,
        membership=args.membership,
        max_packet_size=args.max_packet_size,
        receive_maximum=args.receive_maximum,
        max_inflight_v311=args.max_inflight_v311,
        sys_interval=args.sys_interval,
    )

    async def main(stop: asyncio.Event) -> int:
        edge = Edge(config)
        try:
            await edge.start(args.startup_timeout)
        except TimeoutError:
            log.error("no view from membership at %s", args.membership)
            return 1
        except OSError as exc:
            log.error("cannot listen on %s: %s", args.listen, exc.strerror)
            return 1
        log.info("MQTT on %s:%d", host, port)
        await stop.wait()
        log.info("shutting down")
        await edge.stop()
        return 0

    return run_service(main)
