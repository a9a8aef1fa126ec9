"""`hexmq edge`: the node's MQTT listener."""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
from pathlib import Path

from hexmq import telemetry
from hexmq.netaddr import parse_hostport
from hexmq.service import (
    add_observability_arguments,
    run_service,
    setup_logging,
    start_observability,
)
from services.edge.acl import Acl
from services.edge.auth import AccessControl, PasswordFile
from services.edge.limits import connection_ceiling
from services.edge.listeners import tls_context
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
        help="seconds between $SYS/broker/nodes/<node>/... and $SYS/broker/cluster/... "
        "publications (0: none, and this node is left out of the cluster totals)",
    )
    parser.add_argument("--startup-timeout", type=float, default=30.0)
    _add_transport_arguments(parser)
    _add_access_arguments(parser)
    parser.add_argument("--log-level", default="INFO")
    add_observability_arguments(parser)


def _add_transport_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("listeners and limits")
    group.add_argument("--tls-listen", metavar="HOST:PORT", help="also serve MQTT over TLS here")
    group.add_argument(
        "--ws-listen", metavar="HOST:PORT", help="also serve MQTT over WebSocket here (path /mqtt)"
    )
    group.add_argument(
        "--wss-listen",
        metavar="HOST:PORT",
        help="also serve MQTT over WebSocket over TLS here (path /mqtt)",
    )
    group.add_argument("--tls-cert", type=Path, metavar="FILE", help="PEM certificate (chain)")
    group.add_argument("--tls-key", type=Path, metavar="FILE", help="PEM private key")
    group.add_argument(
        "--tls-ca", type=Path, metavar="FILE", help="PEM CA certificates for client certificates"
    )
    group.add_argument(
        "--tls-require-client-cert",
        action="store_true",
        help="refuse TLS clients without a certificate signed by --tls-ca",
    )
    group.add_argument(
        "--max-connections",
        type=int,
        default=0,
        metavar="N",
        help="client connections open at once, across listeners; more get CONNACK 0x97 (5.0) "
        "or 3 (3.1.1) (default: what the open-file limit allows)",
    )


def _add_access_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("authentication and authorization")
    group.add_argument(
        "--password-file",
        type=Path,
        metavar="FILE",
        help="users and password hashes, as mosquitto_passwd writes them",
    )
    group.add_argument(
        "--allow-anonymous",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let clients without a user name in (default: yes without --password-file, "
        "no with it)",
    )
    group.add_argument(
        "--acl-file", type=Path, metavar="FILE", help="topic access rules, in mosquitto's format"
    )


def _hostport(text: str | None, what: str) -> tuple[str, int] | None:
    return None if text is None else parse_hostport(text, what=what)


def _tls(args: argparse.Namespace) -> ssl.SSLContext | None:
    wanted = args.tls_listen or args.wss_listen
    if not wanted:
        if args.tls_cert or args.tls_key or args.tls_ca or args.tls_require_client_cert:
            raise ValueError("--tls-* options need --tls-listen or --wss-listen")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise ValueError("--tls-listen and --wss-listen need --tls-cert and --tls-key")
    return tls_context(args.tls_cert, args.tls_key, args.tls_ca, args.tls_require_client_cert)


def _access(args: argparse.Namespace) -> AccessControl:
    passwords = PasswordFile.load(args.password_file) if args.password_file else None
    allow_anonymous = args.allow_anonymous
    if allow_anonymous is None:
        allow_anonymous = passwords is None
    if not allow_anonymous and passwords is None:
        raise ValueError("--no-allow-anonymous needs --password-file (else no client gets in)")
    acl = Acl.load(args.acl_file) if args.acl_file else None
    log.info(
        "authentication: %s; anonymous clients %s; %s",
        f"{len(passwords.users)} users from {passwords.source}" if passwords else "none",
        "allowed" if allow_anonymous else "refused",
        f"ACL from {acl.source}" if acl else "no ACL",
    )
    return AccessControl(passwords, allow_anonymous=allow_anonymous, acl=acl)


def run(args: argparse.Namespace) -> int:
    setup_logging("edge", args.node_id, args.log_level)
    try:
        host, port = parse_hostport(args.listen, what="--listen")
        tls_listen = _hostport(args.tls_listen, "--tls-listen")
        ws_listen = _hostport(args.ws_listen, "--ws-listen")
        wss_listen = _hostport(args.wss_listen, "--wss-listen")
        ceiling = connection_ceiling()
        if args.max_connections < 0 or args.max_connections > ceiling:
            raise ValueError(
                f"--max-connections must be 1-{ceiling} (0: {ceiling}, what the open-file "
                "limit leaves after the edge's own files)"
            )
        parse_hostport(args.membership, what="--membership")
        for name in ("max_packet_size", "receive_maximum", "max_inflight_v311"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if not 0 <= args.topic_alias_maximum <= 65535:
            raise ValueError("--topic-alias-maximum must be 0-65535")
        if args.receive_maximum > 65535 or args.max_inflight_v311 > 65535:
            raise ValueError("--receive-maximum and --max-inflight-v311 must be at most 65535")
        tls = _tls(args)
        access = _access(args)
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
        tls_listen=tls_listen,
        ws_listen=ws_listen,
        wss_listen=wss_listen,
        max_connections=args.max_connections,
    )

    async def main(stop: asyncio.Event) -> int:
        try:
            obs = start_observability("edge", args.node_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        edge = Edge(config, obs.tracing, access=access, tls=tls)
        try:
            await edge.start(args.startup_timeout)
        except TimeoutError:
            log.error("no view from membership at %s", args.membership)
            await obs.close()
            return 1
        except OSError as exc:
            log.error("cannot listen on %s", exc.strerror)
            await obs.close()
            return 1
        log.info(
            "MQTT on %s:%d%s%s%s; at most %d connections",
            host,
            port,
            f"; TLS on {args.tls_listen}" if tls_listen else "",
            f"; WebSocket on {args.ws_listen}" if ws_listen else "",
            f"; WebSocket over TLS on {args.wss_listen}" if wss_listen else "",
            edge.limit.maximum,
        )
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
