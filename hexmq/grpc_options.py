"""gRPC options of the cluster's links, shared by both ends: keepalive and message limits only
work when the pinging side and the permitting side agree.

Every channel one service opens to another (an edge's links to the partition services, a
follower's replication streams, the view watch and agreement calls to the node's own agent)
pings its peer (KEEPALIVE) and reconnects within bounds of its own (RECONNECT); every server
of the cluster accepts those pings (PING_POLICY). Without the pings a peer that went silent
was never noticed by a client that had nothing to send: a gRPC server closes, after 20 s of
unacknowledged data (its default TCP_USER_TIMEOUT), a connection whose peer it cannot reach,
without a word that could cross the cut, and an idle client (a view watch, which only
receives) then waits on that dead connection for ever, also after the heal (issue 30).
"""

from __future__ import annotations

# Frames carry many messages; one MQTT packet may be up to the edge's maximum packet size.
_MAX_MESSAGE = 256 * 1024 * 1024

MESSAGE_LIMITS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.max_send_message_length", _MAX_MESSAGE),
]

# A dead or silent peer is noticed within ~15 s even when the call is idle; with data in
# flight within 5 s (gRPC sets TCP_USER_TIMEOUT to the keepalive timeout). gRPC 1.85 waits
# for a ping's answer `ping_timeout_ms` (default 60 s), not the keepalive timeout: a link
# whose peer had gone silent with nothing to send was noticed only after 70 s.
KEEPALIVE: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.ping_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]

# The serving side must accept those pings on an idle stream: its default (one per 5 min,
# 2 strikes) answers our 10 s pings with GOAWAY "too_many_pings" after about 30 idle seconds,
# which dropped every idle link and replication stream.
PING_POLICY: list[tuple[str, int]] = [
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]

# Reconnecting once the peer is reachable again, within about RECONNECT_BOUND_S whatever came
# before. gRPC's defaults would give each connection attempt 20 s (a SYN lost in a cut is
# sent again by the kernel only 1, 3, 7 and 15 s later) and back off up to 120 s between
# attempts; and channels to one address share one subchannel, with its backoff, unless each
# has a pool of its own (a channel made for a new attempt then inherits the old one's wait).
RECONNECT: list[tuple[str, int]] = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Not a backoff: how long each connection attempt (TCP, TLS, HTTP/2) may take.
    ("grpc.min_reconnect_backoff_ms", 2_000),
]
RECONNECT_BOUND_S = 3.0

# What both ends of the edge-partition link and of the replication streams use (the servers
# also ping their clients, so a partition service notices a silent edge or follower).
LINK_OPTIONS: list[tuple[str, int]] = [*MESSAGE_LIMITS, *KEEPALIVE, *PING_POLICY]

# A client's channel to another service of the cluster: pings, and the reconnect bounds.
CLUSTER_CHANNEL_OPTIONS: list[tuple[str, int]] = [*KEEPALIVE, *RECONNECT]
