"""Channel and server options of the edge-partition link, shared by both ends: keepalive and
message limits only work when the pinging side and the permitting side agree."""

from __future__ import annotations

# Frames carry many messages; one MQTT packet may be up to the edge's maximum packet size.
_MAX_MESSAGE = 256 * 1024 * 1024

LINK_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    # A dead peer is noticed within ~15 s even when the stream is idle.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # The serving side must accept those pings on an idle stream: its default (one per 5 min,
    # 2 strikes) answers our 10 s pings with GOAWAY "too_many_pings" after about 30 idle
    # seconds, which dropped every idle link and replication stream.
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]
