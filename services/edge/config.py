"""EdgeConfig: one edge's settings, from `hexmq edge`'s options (services/edge/main.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hexmq.mqtt.reason_codes import ReasonCode as RC
from services.edge.limits import TopicLimits

DEFAULT_MAX_PACKET_SIZE = 1024 * 1024
DEFAULT_RECEIVE_MAXIMUM = 1024
# 1,024, not 256: with the 4 ms batch interval a delivery's acknowledgement takes ~18 ms to
# free its place at saturation, and 256 capped one subscriber at 12-14k msg/s (one node, QoS 1
# fan-in: 17,072/s with 1,024; docs/benchmarks.md, "Fewer costs per batch").
DEFAULT_MAX_INFLIGHT_V311 = 1024
# The most deliveries in flight to a 5.0 client, whatever its Receive Maximum (issue 25: a
# client announcing 65535 and never reading held that many at the edge and its partition).
DEFAULT_MAX_INFLIGHT = 1024
# The longest Session Expiry Interval granted (issue 25): a day. 3.1.1 persistent sessions,
# "never" in MQTT, get it too (mosquitto's persistent_client_expiration, EMQX's 2 h).
DEFAULT_MAX_SESSION_EXPIRY = 86_400
NEVER_EXPIRES = 0xFFFFFFFF
DEFAULT_TOPIC_ALIAS_MAXIMUM = 64
DEFAULT_MAX_OUTBOUND_TOPIC_ALIASES = 64
DEFAULT_FAILOVER_HOLD = 10.0
DEFAULT_SHUTDOWN_GRACE = 2.0


@dataclass(frozen=True, slots=True)
class EdgeConfig:
    # The node this edge belongs to (a standalone edge: its own id).
    node_id: str
    host: str
    port: int
    membership: str
    # This edge process's own id, for its link to each partition service (which keeps one link
    # per edge id), its cluster certificate and its connection ids: the node id for a node's
    # first edge, another (e.g. n1-e2) for each more edge of the node ("": node_id).
    edge_id: str = ""
    # Listen with SO_REUSEPORT, so that several edge processes of a node share its ports and
    # the kernel spreads new connections over them (docs/operations.md, "Several edges").
    reuse_port: bool = False
    max_packet_size: int = DEFAULT_MAX_PACKET_SIZE
    # Inbound QoS 1 publishes a client may have unacknowledged (announced to 5.0 clients).
    receive_maximum: int = DEFAULT_RECEIVE_MAXIMUM
    # Outbound in-flight window for 3.1.1 clients (5.0 clients announce their own).
    max_inflight_v311: int = DEFAULT_MAX_INFLIGHT_V311
    # The most a 5.0 client's outbound window may be, whatever its Receive Maximum.
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    # The longest Session Expiry Interval granted (NEVER_EXPIRES: no cap).
    max_session_expiry: int = DEFAULT_MAX_SESSION_EXPIRY
    connect_timeout: float = 10.0
    # Inbound topic aliases a 5.0 client may use (announced in CONNACK).
    topic_alias_maximum: int = DEFAULT_TOPIC_ALIAS_MAXIMUM
    # Topic aliases the edge assigns to deliveries per 5.0 connection, at most the client's
    # Topic Alias Maximum (0: none).
    max_outbound_topic_aliases: int = DEFAULT_MAX_OUTBOUND_TOPIC_ALIASES
    # Seconds between $SYS publications (0: none).
    sys_interval: float = 10.0
    # Seconds a stopping edge waits for its clients' sockets to close and its connections'
    # commands to be answered before it cancels what is left (Edge.stop).
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    # More listeners (HOST, PORT); TLS and WSS need the edge's TLS context.
    tls_listen: tuple[str, int] | None = None
    ws_listen: tuple[str, int] | None = None
    wss_listen: tuple[str, int] | None = None
    # Listener kinds ("tcp", "ws") whose connections start with a PROXY protocol header.
    proxy_protocol: frozenset[str] = frozenset()
    # Client sockets open at once, across listeners (0: as many as the open-file limit allows).
    max_connections: int = 0
    # New CONNECTs per second (0: no limit).
    max_connection_rate: float = 0
    # Longest Keep Alive granted, in seconds (0: any, including none); 5.0 clients asking for
    # more, or for none, are given this one as Server Keep Alive; 3.1.1 clients are refused.
    max_keepalive: int = 0
    topic_limits: TopicLimits = field(default_factory=TopicLimits)
    # Sent to 5.0 clients as the Server Reference with 0x9C Use another server, instead of
    # 0x97/0x9F when this edge is full, and instead of 0x8B when it shuts down.
    server_reference: str | None = None
    # The SUBACK code a 5.0 client gets for a subscription the ACL denies (3.1.1: 0x80).
    acl_deny_reason_code: int = RC.NOT_AUTHORIZED
    # Seconds a command for a partition without a reachable master is held before it is
    # refused (services/edge/hold.py).
    failover_hold: float = DEFAULT_FAILOVER_HOLD
    # Seconds a live connection may wait for its session's master before the edge ends it
    # (services/edge/unreachable.py; 0: never).
    unreachable_disconnect: float = 3 * DEFAULT_FAILOVER_HOLD
    # Fault injection for tests only (services/edge/qos2_origins.py, fault_stall): QoS 2
    # publishes on topics with this prefix stall after their first target node ("": off).
    fault_stall_qos2_routing: str = ""

    def __post_init__(self) -> None:
        if not self.edge_id:
            object.__setattr__(self, "edge_id", self.node_id)

    @property
    def node_first_edge(self) -> bool:
        """Whether this is its node's first edge (or a standalone one), the edge that publishes
        the node's $SYS figures (services/edge/systopics.py)."""
        return self.edge_id == self.node_id
