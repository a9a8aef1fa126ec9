"""`hexmq edge`'s options: every flag of the edge (each also a HEXMQ_* variable, see
hexmq/envoptions.py), with its default and help (docs/operations.md lists them)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hexmq.membership.client import add_leave_timeout
from hexmq.mqtt.reason_codes import ReasonCode as RC
from hexmq.pacing import add_batch_interval_argument
from hexmq.service import add_observability_arguments
from hexmq.trust.grpc_tls import add_cluster_tls_arguments
from services.edge import scram
from services.edge.config import (
    DEFAULT_FAILOVER_HOLD,
    DEFAULT_MAX_INFLIGHT,
    DEFAULT_MAX_INFLIGHT_V311,
    DEFAULT_MAX_OUTBOUND_TOPIC_ALIASES,
    DEFAULT_MAX_PACKET_SIZE,
    DEFAULT_MAX_SESSION_EXPIRY,
    DEFAULT_RECEIVE_MAXIMUM,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_TOPIC_ALIAS_MAXIMUM,
)
from services.edge.enhanced_auth import MethodFactory
from services.edge.limits import DEFAULT_MAX_TOPIC_LEVELS
from services.edge.listeners import PROXY_PROTOCOL_LISTENERS

# Enhanced authentication methods built in (--auth-method); plugins add others (--auth-plugin).
BUILTIN_AUTH_METHODS: dict[str, MethodFactory] = {scram.NAME: scram.ScramSha512.from_context}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="this node's id, e.g. n1")
    parser.add_argument("--listen", required=True, help="MQTT HOST:PORT, e.g. 127.0.0.1:1883")
    parser.add_argument("--membership", required=True, help="the node's membership HOST:PORT")
    parser.add_argument(
        "--standalone",
        action="store_true",
        help="this edge belongs to no node: its --node-id is its own (not a member's), it may "
        "watch any node's membership agent, it is ready once it routes every partition of the "
        "view, and a SIGTERM stops it without waiting for a node's leave (a pool of edges "
        "deployed on their own, e.g. a Kubernetes StatefulSet)",
    )
    parser.add_argument(
        "--edge-id",
        default=None,
        metavar="ID",
        help="this edge process's own id when the node runs several edges (e.g. n1-e2; "
        "default: --node-id): its link to every partition service, its cluster certificate "
        "and its trace file go by it; each edge of a node needs its own (docs/operations.md, "
        "'Several edges per node')",
    )
    add_cluster_tls_arguments(parser)
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
        "--max-inflight-messages",
        type=int,
        default=DEFAULT_MAX_INFLIGHT,
        metavar="N",
        help="QoS 1/2 deliveries in flight to a 5.0 client, whatever larger Receive Maximum "
        "it announces (MQTT 5.0 lets the server send fewer; default %(default)s)",
    )
    parser.add_argument(
        "--max-session-expiry",
        type=int,
        default=DEFAULT_MAX_SESSION_EXPIRY,
        metavar="SECONDS",
        help="longest Session Expiry Interval granted: a 5.0 client asking for more gets this "
        "one (CONNACK says so), and a 3.1.1 persistent session (clean session 0) expires this "
        "long after its connection ends (4294967295: never; default %(default)s, a day)",
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
        "--unreachable-disconnect",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long a live connection may wait for its session's master (out of the view, "
        "its link down, or its re-attach unanswered) before the edge ends it so that the "
        "client reconnects, possibly through another node: DISCONNECT 0x89 (5.0) or a close "
        "(3.1.1); 0: never; at least --failover-hold (default: 3 x --failover-hold, at least "
        "30)",
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
    add_batch_interval_argument(parser)
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
        "--reuse-port",
        action="store_true",
        help="listen with SO_REUSEPORT: several edge processes of a node, each with this "
        "option and its own --edge-id, share the node's MQTT (TLS, WebSocket) ports and the "
        "kernel spreads new connections over them",
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
        default=DEFAULT_MAX_TOPIC_LEVELS,
        metavar="N",
        help="most levels in a topic name or filter, refused like --max-topic-length "
        "(0: no limit; default %(default)s)",
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
        "--use-username-as-clientid",
        action="store_true",
        help="a client's id is its user name, whatever its CONNECT says (mosquitto's "
        "use_username_as_clientid): no user can take over another's session; clients "
        "without a user name are refused (0x87 / 5)",
    )
    group.add_argument(
        "--clientid-prefixes",
        action="append",
        default=[],
        metavar="PREFIX",
        help="client ids must start with one of these (repeatable); %%u stands for the user "
        "name and must be followed by a separator, e.g. %%u- (a user's ids start with its "
        "name and a dash); others are refused with CONNACK 0x85 / 2",
    )
    group.add_argument(
        "--auth-method",
        action="append",
        default=[],
        choices=sorted(BUILTIN_AUTH_METHODS),
        help="offer this MQTT 5.0 enhanced authentication method (repeatable); SCRAM-SHA-512 "
        "checks the SCRAM entries of --password-file (hexmq passwd --scram)",
    )
    group.add_argument(
        "--scram-from-pbkdf2",
        action="store_true",
        help="INSECURE: SCRAM-SHA-512 also accepts the password file's $7$ entries, whose hash "
        "is SCRAM's SaltedPassword: whoever reads the file can log in as any such user "
        "(docs/security.md, 'Password file formats')",
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
