"""`hexmq edge`: the node's MQTT listener."""

from __future__ import annotations

import argparse
import asyncio
import logging

from hexmq import telemetry
from hexmq.netaddr import parse_hostport
from hexmq.service import (
    add_observability_arguments,
    run_service,
    setup_logging,
    start_observability,
)
from services.edge.server import (
    DEFAULT_MAX_INFLIGHT_V311,
    DEFAULT_MAX_PACKET_SIZE,
    DEFAULT_RECEIVE_MAXIMUM,
    DEFAULT_TOPIC_ALIAS_MAXIMUM,
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
        "--topic-alias-maximum",
        type=int,
        default=DEFAULT_TOPIC_ALIAS_MAXIMUM,
        help="inbound topic aliases a 5.0 client may use (0: none)",
    )
    parser.add_argument(
        "--sys-interval",
        type=float,
        default=10.0,
        help="seconds between $SYS/broker/nodes/<node>/... publications (0: none)",
    )
    parser.add_argument("--startup-timeout", type=float, default=30.0)
    parser.add_argument("--log-level", default="INFO")
    add_observability_arguments(parser)


def run(args: argparse.Namespace) -> int:
    setup_logging("edge", args.node_id, args.log_level)
    try:
        host, port = parse_hostport(args.listen, what="--listen")
        parse_hostport(args.membership, what="--membership")
        for name in ("max_packet_size", "receive_maximum", "max_inflight_v311"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if not 0 <= args.topic_alias_maximum <= 65535:
            raise ValueError("--topic-alias-maximum must be 0-65535")
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
        topic_alias_maximum=args.topic_alias_maximum,
    )

    async def main(stop: asyncio.Event) -> int:
        try:
            obs = start_observability("edge", args.node_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        edge = Edge(config, obs.tracing)
        try:
            await edge.start(args.startup_timeout)
        except TimeoutError:
            log.error("no view from membership at %s", args.membership)
            await obs.close()
            return 1
        except OSError as exc:
            log.error("cannot listen on %s: %s", args.listen, exc.strerror)
            await obs.close()
            return 1
        log.info("MQTT on %s:%d", host, port)
        metrics = asyncio.create_task(_report_metrics(edge))
        await stop.wait()
        log.info("shutting down")
        metrics.cancel()
        await edge.stop()
        await obs.close()
        return 0

    return run_service(main)


async def _report_metrics(edge: Edge) -> None:
    """Copy the edge's counters into Prometheus once a second, so that the per-message path
    only bumps plain integers."""
    m = telemetry.METRICS
    stats = edge.stats
    sent_in = [0, 0, 0]
    sent_out = [0, 0, 0]
    sent_rejected: dict[tuple[str, int], int] = {}
    while True:
        m.connections.set(edge.connected_clients())
        m.queue_depth.labels("partition_link").set(edge.link_backlog())
        if edge.router.view is not None:
            m.view_epoch.set(edge.router.view.epoch)
        for qos in (0, 1, 2):
            m.messages_in_by_qos[qos].inc(stats.messages_in[qos] - sent_in[qos])
            m.messages_out_by_qos[qos].inc(stats.messages_out[qos] - sent_out[qos])
            sent_in[qos] = stats.messages_in[qos]
            sent_out[qos] = stats.messages_out[qos]
        for (packet, code), count in list(stats.rejected.items()):
            delta = count - sent_rejected.get((packet, code), 0)
            if delta:
                m.rejected_packets.labels(packet, f"0x{code:02x}").inc(delta)
                sent_rejected[packet, code] = count
        await asyncio.sleep(1.0)
