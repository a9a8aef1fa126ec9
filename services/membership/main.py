"""`hexmq membership`: the node's membership agent (docs/failover.md, docs/operations.md).

Agrees on the cluster view with the other nodes' agents through Consul and serves it to the
node's edge and partition services over gRPC.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import ssl
from pathlib import Path

import grpc

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.membership.v1 import membership_pb2_grpc as pb_grpc
from hexmq.grpc_options import PING_POLICY
from hexmq.hashring import DEFAULT_PARTITIONS
from hexmq.health import add_health
from hexmq.inproc import NodeServers, stop_servers
from hexmq.membership.client import add_leave_timeout, check_leave_timeout, describe_leave
from hexmq.netaddr import parse_hostport
from hexmq.readiness import Readiness, follow_in_health
from hexmq.service import (
    ServiceMain,
    StopEvent,
    add_observability_arguments,
    cancel_and_wait,
    run_service,
    setup_logging,
    start_observability,
)
from hexmq.trust.grpc_tls import ClusterTLS, add_cluster_tls_arguments
from hexmq.trust.guard import Guard
from hexmq.trust.identity import MEMBERSHIP, Identity
from services.membership.agent import AgentConfig, MembershipAgent
from services.membership.consul_client import (
    ConsulCredentials,
    check_tls_files,
    parse_consul_addr,
)
from services.membership.discovery.model import DiscoveryContext
from services.membership.discovery.options import (
    add_discovery_arguments,
    build_discovery,
    discovery_settings,
)
from services.membership.records import SERVICE_NAME, check_cluster_name, check_node_id
from services.membership.server import MembershipServicer
from services.membership.token_file import TokenFile

log = logging.getLogger("hexmq.membership")

DEFAULT_CONSUL = "127.0.0.1:8500"
# Consul's bounds on a session TTL.
MIN_SESSION_TTL_S, MAX_SESSION_TTL_S = 10, 86400


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="this node's id, e.g. n1")
    parser.add_argument("--listen", required=True, help="gRPC HOST:PORT to serve on")
    parser.add_argument(
        "--advertise",
        default=None,
        metavar="HOST:PORT",
        help="the address other nodes reach this agent at (default: --listen)",
    )
    parser.add_argument(
        "--consul",
        default=os.environ.get("CONSUL_HTTP_ADDR") or DEFAULT_CONSUL,
        metavar="HOST:PORT",
        help="the Consul HTTP API, or `hexmq consul-dev` (default: $CONSUL_HTTP_ADDR, else "
        f"{DEFAULT_CONSUL})",
    )
    parser.add_argument(
        "--consul-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="the Consul ACL token to send, read from FILE (again whenever the file changes); "
        "default: $CONSUL_HTTP_TOKEN if set, else none",
    )
    parser.add_argument(
        "--consul-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="with an https:// --consul: a CA (PEM) to trust for Consul's certificate, besides "
        "the system's",
    )
    parser.add_argument(
        "--consul-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="with an https:// --consul: the client certificate (PEM) to present (Consul's "
        "verify_incoming); needs --consul-key",
    )
    parser.add_argument(
        "--consul-key", type=Path, default=None, metavar="FILE", help="the --consul-cert's key"
    )
    parser.add_argument(
        "--cluster",
        default="hexmq",
        metavar="NAME",
        help="the cluster's name: its keys live under hexmq/NAME/ in Consul KV (default hexmq)",
    )
    parser.add_argument(
        "--partition-addr",
        required=True,
        metavar="HOST:PORT",
        help="this node's partition service, as other nodes reach it",
    )
    parser.add_argument(
        "--mqtt-addr",
        required=True,
        metavar="HOST:PORT",
        help="this node's MQTT listener, as clients reach it",
    )
    parser.add_argument(
        "--expect",
        type=int,
        default=None,
        metavar="N",
        help="nodes serving before the first view is made (default: every node --discovery "
        "lists, or 1 without discovery)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=DEFAULT_PARTITIONS,
        help="partitions of the first view; an existing view's count wins",
    )
    parser.add_argument(
        "--rf",
        type=int,
        default=1,
        help="replication factor of the first view; an existing view's wins",
    )
    parser.add_argument(
        "--session-ttl",
        type=int,
        default=MIN_SESSION_TTL_S,
        metavar="S",
        help="TTL of the node's Consul session in whole seconds (its liveness lease; "
        f"{MIN_SESSION_TTL_S}-{MAX_SESSION_TTL_S}, default {MIN_SESSION_TTL_S})",
    )
    parser.add_argument(
        "--probe-interval",
        type=float,
        default=0.2,
        metavar="S",
        help="seconds between health checks of each peer's partition service (default 0.2)",
    )
    parser.add_argument(
        "--probe-timeout",
        type=float,
        default=0.5,
        metavar="S",
        help="seconds a health check may take (default 0.5)",
    )
    parser.add_argument(
        "--suspect-after",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds without an answer before a peer is reported silent (default 1)",
    )
    parser.add_argument(
        "--rejoin-settle",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds a (re)joining node must be registered and unsuspected before it is "
        "admitted (default 1)",
    )
    add_leave_timeout(parser)
    parser.add_argument("--log-level", default="INFO")
    add_observability_arguments(parser)
    add_discovery_arguments(parser)
    add_cluster_tls_arguments(parser)


def agent_config(args: argparse.Namespace) -> AgentConfig:
    """The agent's settings, or a ValueError naming the option that is wrong."""
    check_node_id(args.node_id)
    check_cluster_name(args.cluster)
    parse_hostport(args.listen, what="--listen")
    advertise = args.advertise or args.listen
    parse_hostport(advertise, what="--advertise")
    try:
        parse_consul_addr(args.consul)
    except ValueError as exc:
        raise ValueError(f"--consul: {exc}") from None
    credentials = consul_credentials(args)
    parse_hostport(args.partition_addr, what="--partition-addr")
    parse_hostport(args.mqtt_addr, what="--mqtt-addr")
    for option, value in (("--expect", args.expect), ("--partitions", args.partitions)):
        if value is not None and value < 1:
            raise ValueError(f"{option} must be at least 1, got {value}")
    if args.rf < 1:
        raise ValueError(f"--rf must be at least 1, got {args.rf}")
    if not MIN_SESSION_TTL_S <= args.session_ttl <= MAX_SESSION_TTL_S:
        raise ValueError(
            f"--session-ttl must be {MIN_SESSION_TTL_S}-{MAX_SESSION_TTL_S} seconds (Consul's "
            f"bounds), got {args.session_ttl}"
        )
    for option, seconds in (
        ("--probe-interval", args.probe_interval),
        ("--probe-timeout", args.probe_timeout),
        ("--suspect-after", args.suspect_after),
    ):
        if not seconds > 0:
            raise ValueError(f"{option} must be more than 0 seconds, got {seconds}")
    check_leave_timeout(args.leave_timeout)
    if args.rejoin_settle < 0:
        raise ValueError(f"--rejoin-settle must be 0 or more seconds, got {args.rejoin_settle}")
    discovery = discovery_settings(args, args.cluster)
    service_name, service_tags = SERVICE_NAME, [args.cluster]
    if discovery is not None and discovery.backend == "consul":
        service_name = discovery.consul_service
        if discovery.consul_tag and discovery.consul_tag != args.cluster:
            service_tags.append(discovery.consul_tag)
    return AgentConfig(
        node_id=args.node_id,
        cluster=args.cluster,
        consul_addr=args.consul,
        consul_credentials=credentials,
        partition_addr=args.partition_addr,
        mqtt_addr=args.mqtt_addr,
        membership_addr=advertise,
        partitions=args.partitions,
        rf=args.rf,
        # Without --expect: every node discovery lists, or (no discovery) one node, as before.
        expect=args.expect if args.expect is not None else None if discovery else 1,
        session_ttl_s=args.session_ttl,
        probe_interval_s=args.probe_interval,
        probe_timeout_s=args.probe_timeout,
        suspect_after_s=args.suspect_after,
        rejoin_settle_s=args.rejoin_settle,
        service_name=service_name,
        service_tags=tuple(service_tags),
        discovery=discovery,
    )


def consul_credentials(args: argparse.Namespace) -> ConsulCredentials:
    """The token and TLS files the agent presents to Consul; ValueError naming the option.
    Each file is read now (a bad one stops the agent at start); the token file again whenever
    it changes (a rotation needs no restart)."""
    ca, cert, key = args.consul_ca, args.consul_cert, args.consul_key
    try:
        check_tls_files(args.consul, ca, cert, key)
    except ValueError as exc:
        raise ValueError(f"--consul-ca, --consul-cert, --consul-key: {exc}") from None
    context = ssl.create_default_context()
    if ca is not None:
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"--consul-ca {ca}: no usable PEM CA certificate ({exc})") from None
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"--consul-cert {cert}, --consul-key {key}: not a usable PEM certificate and "
                f"its key ({exc})"
            ) from None
    token = (
        None
        if args.consul_token_file is None
        else TokenFile(args.consul_token_file, "--consul-token-file").current
    )
    return ConsulCredentials(token=token, ca=ca, cert=cert, key=key)


def run(args: argparse.Namespace) -> int:
    setup_logging("membership", args.node_id, args.log_level)
    main = prepare(args)
    return main if isinstance(main, int) else run_service(main)


def prepare(args: argparse.Namespace, colocated: NodeServers | None = None) -> ServiceMain | int:
    """The agent's `main(stop)`, or the exit code when the options are wrong (logged).
    `colocated`: the co-located node (`hexmq node`) whose services also call this agent in
    process."""
    try:
        config = agent_config(args)
        discovery = (
            None
            if config.discovery is None
            else build_discovery(config.discovery, discovery_context(config))
        )
        tls = ClusterTLS.from_args(args, Identity(MEMBERSHIP, args.node_id))
    except ValueError as exc:  # DiscoveryError and TLSConfigError included
        log.error("%s", exc)
        return 2
    tls.warn_if_insecure()

    async def main(stop: StopEvent) -> int:
        try:
            obs = start_observability("membership", args.node_id, args)
        except OSError as exc:
            log.error("cannot serve metrics on %s: %s", args.metrics_listen, exc.strerror)
            return 1
        agent = MembershipAgent(
            config, obs.tracing, on_fatal=stop.set, discovery=discovery, tls=tls
        )
        obs.ready_when(lambda: membership_readiness(config.node_id, agent.board.view))
        # The node's services ping their watches and calls (hexmq/grpc_options.py).
        server = grpc.aio.server(options=PING_POLICY)
        guard = Guard(tls, "membership")
        servicer = MembershipServicer(agent, guard)
        pb_grpc.add_MembershipServiceServicer_to_server(servicer, server)
        if colocated is not None:
            pb_grpc.add_MembershipServiceServicer_to_server(servicer, colocated.membership)
        health = add_health(server)
        try:
            tls.add_port(server, args.listen)
        except RuntimeError as exc:
            log.error("cannot listen on %s: %s", args.listen, exc)
            await obs.close()
            return 1
        await agent.start()
        await server.start()
        if colocated is not None:
            await colocated.membership.start()
        health_follower = asyncio.create_task(follow_in_health(obs.readiness, health))
        log.info(
            "membership agent of %s on %s (%s): cluster %r at Consul %s, discovery %s, "
            "expecting %s for a first view",
            config.node_id,
            args.listen,
            tls.describe(),
            config.cluster,
            config.consul_addr,
            config.discovery.describe() if config.discovery else "none (every registered node)",
            f"{config.expect} node(s)"
            if config.expect
            else "every node discovery lists"
            if config.discovery
            else "1 node",
        )
        await stop.wait()
        if stop.leave and not agent.failed:
            # SIGTERM (an orchestrator stops the node, maybe every service at once): leave
            # first, since this agent's session ending now would make it a failover. A node
            # the view never admitted has left already.
            await _finish_leave(agent, args.leave_timeout, stop)
        log.info("shutting down")
        await cancel_and_wait(health_follower)
        # Stop serving first (the node's services see the agent go), then end the session:
        # its keys vanish at once and the peers remove this node without waiting for its TTL.
        await stop_servers(1.0, server, colocated.membership if colocated else None)
        await agent.stop()
        await obs.close()
        return 1 if agent.failed else 0

    return main


def discovery_context(config: AgentConfig) -> DiscoveryContext:
    return DiscoveryContext(
        node_id=config.node_id,
        cluster=config.cluster,
        partition_addr=config.partition_addr,
        mqtt_addr=config.mqtt_addr,
        membership_addr=config.membership_addr,
        consul_addr=config.consul_addr,
        consul_credentials=config.consul_credentials,
    )


async def _finish_leave(agent: MembershipAgent, timeout_s: float, stop: StopEvent) -> None:
    leave = asyncio.ensure_future(agent.leave(timeout_s))
    plain = asyncio.ensure_future(stop.plain.wait())
    await asyncio.wait({leave, plain}, return_when=asyncio.FIRST_COMPLETED)
    plain.cancel()
    if leave.done():
        log.info("%s", describe_leave(leave.result(), timeout_s))
    else:
        leave.cancel()
        log.warning("leave cut short by a plain stop")


def membership_readiness(node_id: str, view: mpb.View | None) -> Readiness:
    """Ready once the agreed view lists this node as a member: an orchestrator then counts the
    node as up (a Kubernetes pod's readiness, a rolling update waiting for the node to be back
    in the view). An agent whose node is out of the view still serves that view to its node's
    services and to any edge; it is only not ready."""
    if view is None:
        return Readiness(False, "no view agreed yet")
    if all(m.node_id != node_id for m in view.members):
        return Readiness(False, f"view {view.epoch} does not list node {node_id}")
    return Readiness(True, f"view {view.epoch}: {len(view.members)} members")
