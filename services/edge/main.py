"""`hexmq edge`: the node's MQTT listener."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl

import grpc

from hexmq import telemetry
from hexmq.health import add_health
from hexmq.inproc import NodeServers
from hexmq.membership.client import check_leave_timeout
from hexmq.netaddr import parse_hostport
from hexmq.node_protocol import ClusterProtocol
from hexmq.pacing import apply_batch_interval, follow_contention
from hexmq.readiness import follow_in_health
from hexmq.service import (
    ServiceMain,
    StopEvent,
    cancel_and_wait,
    run_service,
    setup_logging,
    start_observability,
)
from hexmq.trust.grpc_tls import ClusterTLS
from hexmq.trust.identity import EDGE, Identity
from services.edge.access import AccessControl, ClientIdRules
from services.edge.acl import Acl
from services.edge.auth import PasswordFile
from services.edge.config import NEVER_EXPIRES, EdgeConfig
from services.edge.enhanced_auth import AuthMethods, PluginContext
from services.edge.limits import TopicLimits, connection_ceiling
from services.edge.listeners import tls_context
from services.edge.options import BUILTIN_AUTH_METHODS, add_arguments
from services.edge.readiness import edge_readiness
from services.edge.server import Edge
from services.edge.unreachable import check_bound, default_bound

log = logging.getLogger("hexmq.edge")


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
    client_ids = ClientIdRules(
        use_username=args.use_username_as_clientid, prefixes=tuple(args.clientid_prefixes)
    )
    methods = AuthMethods.build(
        BUILTIN_AUTH_METHODS,
        args.auth_method,
        args.auth_plugin,
        PluginContext(
            node_id=args.node_id, passwords=passwords, scram_from_pbkdf2=args.scram_from_pbkdf2
        ),
    )
    log.info(
        "authentication: %s; anonymous clients %s; %s; enhanced authentication: %s",
        f"{len(passwords.users)} users from {passwords.source}" if passwords else "none",
        "allowed" if allow_anonymous else "refused",
        f"ACL from {acl.source}" if acl else "no ACL",
        ", ".join(methods.names) or "none",
    )
    if client_ids.active:
        log.info(
            "client ids: %s%s",
            "the user name" if client_ids.use_username else "as sent",
            f", starting with one of {', '.join(client_ids.prefixes)}"
            if client_ids.prefixes
            else "",
        )
    return AccessControl(
        passwords,
        allow_anonymous=allow_anonymous,
        acl=acl,
        methods=methods,
        acl_path=args.acl_file,
        client_ids=client_ids,
    )


def _reload_acl(access: AccessControl) -> None:
    """SIGHUP: read the ACL file again, as mosquitto does; connections use it from their next
    check, and so does every will published from now on. A bad file keeps the ACL in force."""
    if access.acl_path is None:
        log.info("SIGHUP: no --acl-file to read again")
        return
    try:
        acl = access.reload_acl()
    except ValueError as exc:
        log.error("SIGHUP: %s; the ACL in force is kept", exc)
        return
    assert acl is not None
    log.info("SIGHUP: ACL from %s read again (generation %d)", acl.source, access.acl_generation)


__all__ = ["add_arguments", "run"]


def edge_id_of(args: argparse.Namespace, *, colocated: bool = False) -> str:
    """This edge process's own id: --edge-id, else the node's. `colocated`: the edge of a
    co-located node (`hexmq node`), which is the node's own edge and keeps its id."""
    if args.edge_id is None:
        return str(args.node_id)
    if args.standalone:
        raise ValueError(
            "--edge-id is for a node's further edges: a --standalone edge's id is --node-id"
        )
    if colocated:
        raise ValueError(
            "--edge-id is for a node's further edge processes: the edge section of `hexmq "
            "node` is the node's own edge, whose id is --node-id"
        )
    if not args.edge_id or args.edge_id.strip() != args.edge_id:
        raise ValueError(f"--edge-id {args.edge_id!r}: empty or with spaces")
    return str(args.edge_id)


def run(args: argparse.Namespace) -> int:
    # By the edge's own id (checked in prepare): each edge of a node logs as itself.
    setup_logging("edge", args.node_id if args.edge_id is None else args.edge_id, args.log_level)
    main = prepare(args)
    return main if isinstance(main, int) else run_service(main)


def prepare(args: argparse.Namespace, colocated: NodeServers | None = None) -> ServiceMain | int:
    """The edge's `main(stop)`, or the exit code when the options are wrong (logged).
    `colocated`: the co-located node (`hexmq node`): the edge calls its node's agent and
    partition service in process."""
    try:
        edge_id = edge_id_of(args, colocated=colocated is not None)
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
        if args.unreachable_disconnect is None:
            args.unreachable_disconnect = default_bound(args.failover_hold)
        check_bound(args.unreachable_disconnect, args.failover_hold)
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
        if not 1 <= args.max_inflight_messages <= 65535:
            raise ValueError("--max-inflight-messages must be 1-65535")
        if not 0 <= args.max_session_expiry <= NEVER_EXPIRES:
            raise ValueError(f"--max-session-expiry must be 0-{NEVER_EXPIRES} (that one: never)")
        tls = _tls(args)
        access = _access(args)
        apply_batch_interval(args)
        cluster_tls = ClusterTLS.from_args(args, Identity(EDGE, edge_id))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    cluster_tls.warn_if_insecure()
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
        edge_id=edge_id,
        reuse_port=args.reuse_port,
        max_packet_size=args.max_packet_size,
        receive_maximum=args.receive_maximum,
        max_inflight_v311=args.max_inflight_v311,
        max_inflight=args.max_inflight_messages,
        max_session_expiry=args.max_session_expiry,
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
        unreachable_disconnect=args.unreachable_disconnect,
        shutdown_grace=args.shutdown_grace,
        fault_stall_qos2_routing=args.fault_stall_qos2_routing,
    )

    async def main(stop: StopEvent) -> int:
        try:
            # By the edge's own id: each edge of a node writes its own trace file.
            obs = start_observability("edge", edge_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        edge = Edge(
            config,
            obs.tracing,
            access=access,
            tls=tls,
            cluster_tls=cluster_tls,
            colocated=colocated,
        )
        obs.ready_when(
            lambda: edge_readiness(
                args.node_id, edge.router.view, edge.router.links, standalone=args.standalone
            )
        )
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
            "MQTT on %s:%d%s%s%s%s%s; at most %d connections",
            host,
            port,
            " (shared: SO_REUSEPORT)" if config.reuse_port else "",
            f"; TLS on {args.tls_listen}" if tls_listen else "",
            f"; WebSocket on {args.ws_listen}" if ws_listen else "",
            f"; WebSocket over TLS on {args.wss_listen}" if wss_listen else "",
            f"; PROXY protocol on {', '.join(sorted(config.proxy_protocol))}"
            if config.proxy_protocol
            else "",
            edge.limit.maximum,
        )
        log.info("cluster links: %s", cluster_tls.describe())
        if edge_id != args.node_id:
            log.info("edge %s of node %s", edge_id, args.node_id)
        if args.standalone:
            log.info("standalone edge: %s belongs to no node (its stop is no leave)", args.node_id)
        metrics = asyncio.create_task(_report_metrics(edge))
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload_acl, access)
        pacing = asyncio.create_task(follow_contention(telemetry.METRICS.batch_interval.set))
        await stop.wait()
        # A standalone edge has no node whose leave it could follow: any stop is a plain one.
        leaving = stop.leave and not args.standalone
        if leaving:
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
        pacing.cancel()
        await edge.stop(leaving=leaving)
        if health_server is not None:
            await cancel_and_wait(health_follower)
            await _stop_health(health_server)
        await obs.close()
        return 0

    return main


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
    sent_limited: dict[str, int] = {}
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
        for limit, count in list(stats.limited.items()):
            delta = count - sent_limited.get(limit, 0)
            if delta:
                m.limit_refusals.labels(limit).inc(delta)
                sent_limited[limit] = count
        await asyncio.sleep(1.0)
