"""`hexmq edge`: the node's MQTT listener."""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
from pathlib import Path

import grpc

from hexmq import telemetry
from hexmq.health import add_health
from hexmq.mqtt.reason_codes import ReasonCode as RC
from hexmq.netaddr import parse_hostport
from hexmq.node_protocol import ClusterProtocol
from hexmq.readiness import follow_in_health
from hexmq.service import (
    StopEvent,
    add_observability_arguments,
    cancel_and_wait,
    run_service,
    setup_logging,
    start_observability,
)
from services.edge import scram
from services.edge.access import AccessControl
from services.edge.acl import Acl
from services.edge.auth import PasswordFile
from services.edge.config import (
    DEFAULT_FAILOVER_HOLD,
    DEFAULT_MAX_INFLIGHT_V311,
    DEFAULT_MAX_OUTBOUND_TOPIC_ALIASES,
    DEFAULT_MAX_PACKET_SIZE,
    DEFAULT_RECEIVE_MAXIMUM,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_TOPIC_ALIAS_MAXIMUM,
    EdgeConfig,
)
from services.edge.enhanced_auth import AuthMethods, MethodFactory, PluginContext
from services.edge.limits import TopicLimits, connection_ceiling
from services.edge.listeners import PROXY_PROTOCOL_LISTENERS, tls_context
from services.edge.readiness import edge_readiness
from services.edge.server import Edge
from services.membership.client import add_leave_timeout, check_leave_timeout

log = logging.getLogger("hexmq.edge")

# Enhanced authentication methods built in (--auth-method); plugins add others (--auth-plugin).
BUILTIN_AUTH_METHODS: dict[str, MethodFactory] = {scram.NAME: scram.ScramSha512.from_context}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="this node's id, e.g. n1")
    parser.add_argument("--listen", required=True, help="MQTT HOST:PORT, e.g. 127.0.0.1:1883")
    parser.add_argument("--membership", required=True, help="the node's membership HOST:PORT")
    add_leave_timeout(parser)
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
        "--max-outbound-topic-aliases",
        type=int,
        default=DEFAULT_MAX_OUTBOUND_TOPIC_ALIASES,
        metavar="N",
        help="topic aliases the edge assigns to deliveries per 5.0 connection, at most the "
        "client's Topic Alias Maximum; least recently used replaced (0: none)",
    )
    parser.add_argument(
        "--sys-interval",
        type=float,
        default=10.0,
        help="seconds between $SYS/broker/nodes/<node>/... and $SYS/broker/cluster/... "
        "publications (0: none, and this node is left out of the cluster totals)",
    )
    parser.add_argument("--startup-timeout", type=float, default=30.0)
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time from opening a connection to CONNACK: the CONNECT and any enhanced "
        "authentication exchange (default %(default)s)",
    )
    parser.add_argument(
        "--failover-hold",
        type=float,
        default=DEFAULT_FAILOVER_HOLD,
        metavar="SECONDS",
        help="how long a command for a partition without a reachable master (a failover, a "
        "restart, a link down) is held before it is refused: PUBACK/PUBREC 0x80 (5.0) or a "
        "closed connection (3.1.1), CONNACK 0x88 / 3 (default %(default)s)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=DEFAULT_SHUTDOWN_GRACE,
        metavar="SECONDS",
        help="on stop, how long to wait for clients' sockets to close and for the partitions' "
        "answers to what the connections sent (their sessions' closes, QoS 2 routings) before "
        "cancelling what is left (default %(default)s)",
    )
    parser.add_argument(
        "--fault-stall-qos2-routing",
        default="",
        metavar="TOPIC_PREFIX",
        help="FAULT INJECTION, for tests only: a QoS 2 PUBLISH without DUP on a topic starting "
        "with TOPIC_PREFIX is sent to its first target node only and never answered, as if "
        "this edge died mid-routing",
    )
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
    group.add_argument(
        "--proxy-protocol",
        action="append",
        default=[],
        choices=sorted(PROXY_PROTOCOL_LISTENERS),
        metavar="LISTENER",
        help="connections on this listener (tcp: --listen, ws: --ws-listen; repeatable) start "
        "with a PROXY protocol v1 or v2 header from the load balancer, whose client address "
        "the edge then uses; a connection without a valid header is closed",
    )
    group.add_argument(
        "--health-listen",
        metavar="HOST:PORT",
        help="serve the gRPC health checking protocol here (SERVING when the edge is ready: "
        "/readyz on --metrics-listen says the same over HTTP)",
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
    group.add_argument(
        "--max-connection-rate",
        type=float,
        default=0,
        metavar="N",
        help="new connections a second (bursts of N); more get CONNACK 0x9F (5.0) or 3 "
        "(3.1.1) (default 0: no limit)",
    )
    group.add_argument(
        "--server-reference",
        metavar="REF",
        help="where 5.0 clients should go instead when this edge is full or shutting down "
        "(e.g. another node's or the load balancer's host:port): sent with 0x9C Use another "
        "server in place of 0x97/0x9F and 0x8B",
    )
    group.add_argument(
        "--max-keepalive",
        type=int,
        default=0,
        metavar="SECONDS",
        help="longest Keep Alive granted; 5.0 clients asking for more or none are told this "
        "one (Server Keep Alive), 3.1.1 clients are refused with return code 2 (default 0: "
        "no maximum)",
    )
    group.add_argument(
        "--max-topic-length",
        type=int,
        default=65535,
        metavar="BYTES",
        help="longest topic name or filter; longer ones are refused with 0x90 (publish) or "
        "0x8F (subscribe); 3.1.1: dropped / SUBACK 0x80 (default 65535)",
    )
    group.add_argument(
        "--max-topic-levels",
        type=int,
        default=0,
        metavar="N",
        help="most levels in a topic name or filter, refused like --max-topic-length "
        "(default 0: no limit)",
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
    group.add_argument(
        "--acl-deny-reason-code",
        type=_suback_failure_code,
        default=RC.NOT_AUTHORIZED,
        metavar="CODE",
        help="SUBACK reason code for a subscription the ACL denies, for 5.0 clients "
        "(0x80, 0x83 or 0x87; default 0x87; 3.1.1 clients always get 0x80)",
    )
    group.add_argument(
        "--auth-method",
        action="append",
        default=[],
        choices=sorted(BUILTIN_AUTH_METHODS),
        help="offer this MQTT 5.0 enhanced authentication method (repeatable); SCRAM-SHA-512 "
        "checks the $7$ entries of --password-file",
    )
    group.add_argument(
        "--auth-plugin",
        action="append",
        default=[],
        metavar="MODULE:FACTORY",
        help="offer the enhanced authentication method FACTORY(context) returns, from the "
        "Python module MODULE (repeatable; see docs/operations.md)",
    )


# The SUBACK failure codes that say "not allowed" (MQTT 5.0 section 3.9.3).
_ACL_DENY_CODES = (RC.UNSPECIFIED_ERROR, RC.IMPLEMENTATION_SPECIFIC_ERROR, RC.NOT_AUTHORIZED)


def _suback_failure_code(text: str) -> int:
    try:
        code = int(text, 0)
    except ValueError:
        code = -1
    if code not in _ACL_DENY_CODES:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not one of {', '.join(f'0x{c:02X}' for c in _ACL_DENY_CODES)}"
        )
    return code


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
    methods = AuthMethods.build(
        BUILTIN_AUTH_METHODS,
        args.auth_method,
        args.auth_plugin,
        PluginContext(node_id=args.node_id, passwords=passwords),
    )
    log.info(
        "authentication: %s; anonymous clients %s; %s; enhanced authentication: %s",
        f"{len(passwords.users)} users from {passwords.source}" if passwords else "none",
        "allowed" if allow_anonymous else "refused",
        f"ACL from {acl.source}" if acl else "no ACL",
        ", ".join(methods.names) or "none",
    )
    return AccessControl(passwords, allow_anonymous=allow_anonymous, acl=acl, methods=methods)


def run(args: argparse.Namespace) -> int:
    setup_logging("edge", args.node_id, args.log_level)
    try:
        host, port = parse_hostport(args.listen, what="--listen")
        tls_listen = _hostport(args.tls_listen, "--tls-listen")
        ws_listen = _hostport(args.ws_listen, "--ws-listen")
        wss_listen = _hostport(args.wss_listen, "--wss-listen")
        _hostport(args.health_listen, "--health-listen")
        if "ws" in args.proxy_protocol and ws_listen is None:
            raise ValueError("--proxy-protocol ws needs --ws-listen")
        ceiling = connection_ceiling()
        if args.max_connections < 0 or args.max_connections > ceiling:
            raise ValueError(
                f"--max-connections must be 1-{ceiling} (0: {ceiling}, what the open-file "
                "limit leaves after the edge's own files)"
            )
        parse_hostport(args.membership, what="--membership")
        check_leave_timeout(args.leave_timeout)
        for name in ("max_packet_size", "receive_maximum", "max_inflight_v311"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if args.connect_timeout <= 0:
            raise ValueError("--connect-timeout must be more than 0")
        if not 0 < args.failover_hold <= 3600:
            raise ValueError(
                f"--failover-hold must be more than 0 and at most 3600 seconds, not "
                f"{args.failover_hold:g}"
            )
        if not 0 <= args.shutdown_grace <= 3600:
            raise ValueError(
                f"--shutdown-grace must be 0-3600 seconds, not {args.shutdown_grace:g}"
            )
        if not 0 <= args.topic_alias_maximum <= 65535:
            raise ValueError("--topic-alias-maximum must be 0-65535")
        if not 0 <= args.max_outbound_topic_aliases <= 65535:
            raise ValueError("--max-outbound-topic-aliases must be 0-65535")
        if args.receive_maximum > 65535 or args.max_inflight_v311 > 65535:
            raise ValueError("--receive-maximum and --max-inflight-v311 must be at most 65535")
        if args.max_connection_rate < 0:
            raise ValueError("--max-connection-rate must be at least 0")
        if not 0 <= args.max_keepalive <= 65535:
            raise ValueError("--max-keepalive must be 0-65535")
        if not 1 <= args.max_topic_length <= 65535:
            raise ValueError("--max-topic-length must be 1-65535")
        if args.max_topic_levels < 0:
            raise ValueError("--max-topic-levels must be at least 0")
        tls = _tls(args)
        access = _access(args)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if args.fault_stall_qos2_routing:
        log.warning(
            "FAULT INJECTION on: QoS 2 publishes on %r* stall mid-routing",
            args.fault_stall_qos2_routing,
        )
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
        max_outbound_topic_aliases=args.max_outbound_topic_aliases,
        tls_listen=tls_listen,
        ws_listen=ws_listen,
        wss_listen=wss_listen,
        proxy_protocol=frozenset(args.proxy_protocol),
        max_connections=args.max_connections,
        max_connection_rate=args.max_connection_rate,
        max_keepalive=args.max_keepalive,
        topic_limits=TopicLimits(args.max_topic_length, args.max_topic_levels),
        server_reference=args.server_reference,
        acl_deny_reason_code=args.acl_deny_reason_code,
        connect_timeout=args.connect_timeout,
        failover_hold=args.failover_hold,
        shutdown_grace=args.shutdown_grace,
        fault_stall_qos2_routing=args.fault_stall_qos2_routing,
    )

    async def main(stop: StopEvent) -> int:
        try:
            obs = start_observability("edge", args.node_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        edge = Edge(config, obs.tracing, access=access, tls=tls)
        obs.ready_when(lambda: edge_readiness(args.node_id, edge.router.view, edge.router.links))
        health_server = None
        if args.health_listen:
            health_server = grpc.aio.server()
            health = add_health(health_server)
            try:
                health_server.add_insecure_port(args.health_listen)
            except RuntimeError as exc:
                log.error(
                    "cannot serve gRPC health on --health-listen %s: %s", args.health_listen, exc
                )
                await obs.close()
                return 1
            await health_server.start()
            health_follower = asyncio.create_task(follow_in_health(obs.readiness, health))
        try:
            await edge.start(args.startup_timeout)
        except TimeoutError:
            log.error("no view from membership at %s", args.membership)
            await _stop_health(health_server)
            await obs.close()
            return 1
        except OSError as exc:
            log.error("cannot listen on %s", exc.strerror)
            await _stop_health(health_server)
            await obs.close()
            return 1
        log.info(
            "MQTT on %s:%d%s%s%s%s; at most %d connections",
            host,
            port,
            f"; TLS on {args.tls_listen}" if tls_listen else "",
            f"; WebSocket on {args.ws_listen}" if ws_listen else "",
            f"; WebSocket over TLS on {args.wss_listen}" if wss_listen else "",
            f"; PROXY protocol on {', '.join(sorted(config.proxy_protocol))}"
            if config.proxy_protocol
            else "",
            edge.limit.maximum,
        )
        metrics = asyncio.create_task(_report_metrics(edge))
        await stop.wait()
        if stop.leave:
            # SIGTERM: if the node is leaving, its clients stay connected (and served) while
            # its partitions move, then go to another node (docs/operations.md, "Leaving").
            left = await edge.follow_leave(args.leave_timeout, stop.plain)
            if left is None:
                log.info("the node is not leaving; stopping")
            elif left:
                log.info("the node left the cluster; stopping")
            else:
                log.warning(
                    "the node's leave did not finish within %gs; stopping anyway",
                    args.leave_timeout,
                )
        log.info("shutting down")
        metrics.cancel()
        await edge.stop(leaving=stop.leave)
        if health_server is not None:
            await cancel_and_wait(health_follower)
            await _stop_health(health_server)
        await obs.close()
        return 0

    return run_service(main)


async def _stop_health(server: grpc.aio.Server | None) -> None:
    if server is not None:
        await server.stop(grace=0.5)


async def _report_metrics(edge: Edge) -> None:
    """Copy the edge's counters into Prometheus once a second, so that the per-message path
    only bumps plain integers."""
    m = telemetry.METRICS
    stats = edge.stats
    sent_in = [0, 0, 0]
    sent_out = [0, 0, 0]
    sent_rejected: dict[tuple[str, int], int] = {}
    no_master = m.dropped_messages.labels("no_master")
    sent_no_master = 0
    while True:
        m.connections.set(edge.connected_clients())
        m.queue_depth.labels("partition_link").set(edge.link_backlog())
        m.queue_depth.labels("failover_hold").set(edge.dispatcher.held)
        dropped = edge.dispatcher.core.dropped_qos0
        no_master.inc(dropped - sent_no_master)
        sent_no_master = dropped
        if edge.router.view is not None:
            m.view_epoch.set(edge.router.view.epoch)
            m.show_protocol(ClusterProtocol.of_view(edge.router.view))
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
