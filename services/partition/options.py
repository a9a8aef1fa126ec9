"""`hexmq partition`'s options: what they are (`add_arguments`), whether they can work
(`check_options`, before anything starts) and what they configure (`queue_limits`,
`replication_limits`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from hexmq.membership.client import add_leave_timeout, check_leave_timeout
from hexmq.netaddr import parse_hostport
from hexmq.pacing import (
    DEFAULT_REMOVAL_LINGER,
    add_batch_interval_argument,
    apply_batch_interval,
    configure_removal_linger,
)
from hexmq.service import add_observability_arguments
from hexmq.trust.grpc_tls import add_cluster_tls_arguments
from services.partition import redis_access
from services.partition.delivery import (
    DEFAULT_MAX_QUEUED,
    DEFAULT_MAX_QUEUED_BYTES,
    DEFAULT_MAX_RETAINED_BYTES,
    DEFAULT_MAX_RETAINED_MESSAGES,
    DEFAULT_MAX_SUBSCRIPTIONS,
    QueueLimits,
)
from services.partition.qos2_seen import DEFAULT_RETENTION_S
from services.partition.redis_access import PASSWORD_VARIABLE, RedisAccess
from services.partition.replication import DEFAULT_LOG_ENTRIES, ReplicationLimits


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-id", required=True, help="this node's id, e.g. n1")
    parser.add_argument("--listen", required=True, help="gRPC HOST:PORT to serve edges on")
    parser.add_argument(
        "--redis",
        required=True,
        help="the node's Redis, redis://HOST:PORT/DB (rediss:// for TLS, or unix://PATH?db=N)",
    )
    parser.add_argument(
        "--redis-user",
        metavar="NAME",
        help="the Redis ACL user to authenticate as (default: Redis's `default` user)",
    )
    parser.add_argument(
        "--redis-password-file",
        type=Path,
        metavar="FILE",
        help=f"the Redis password is this file's content (or give it in {PASSWORD_VARIABLE}; "
        "never on a command line)",
    )
    parser.add_argument(
        "--redis-ca",
        metavar="FILE",
        help="rediss://: Redis's certificate must be signed by this CA (PEM) (default: the "
        "system's CAs) and name the URL's host",
    )
    parser.add_argument(
        "--redis-cert",
        metavar="FILE",
        help="rediss://: this client's certificate (PEM), for a Redis with tls-auth-clients",
    )
    parser.add_argument(
        "--redis-key", metavar="FILE", help="rediss://: the key of --redis-cert (PEM)"
    )
    parser.add_argument("--membership", required=True, help="the node's membership HOST:PORT")
    add_leave_timeout(parser)
    parser.add_argument("--startup-timeout", type=float, default=30.0)
    parser.add_argument(
        "--max-queued-messages",
        type=int,
        default=DEFAULT_MAX_QUEUED,
        help="QoS 1/2 messages one session may hold; past it see --queue-overflow "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--max-queued-bytes",
        type=int,
        default=DEFAULT_MAX_QUEUED_BYTES,
        metavar="BYTES",
        help="payload and topic bytes of the QoS 1/2 messages one session may hold; past it "
        "see --queue-overflow (default %(default)s, 16 MiB)",
    )
    parser.add_argument(
        "--max-subscriptions",
        type=int,
        default=DEFAULT_MAX_SUBSCRIPTIONS,
        metavar="N",
        help="subscriptions one session may hold; a SUBSCRIBE's further filters get SUBACK "
        "0x97 (5.0) / 0x80 (3.1.1) (default %(default)s)",
    )
    parser.add_argument(
        "--max-retained-messages",
        type=int,
        default=DEFAULT_MAX_RETAINED_MESSAGES,
        metavar="N",
        help="retained messages the whole cluster holds (each node its share of the "
        "partitions it masters); a retained PUBLISH for a new topic past it is delivered but "
        "not retained, and a 5.0 publisher gets 0x97 (default %(default)s)",
    )
    parser.add_argument(
        "--max-retained-bytes",
        type=int,
        default=DEFAULT_MAX_RETAINED_BYTES,
        metavar="BYTES",
        help="payload and topic bytes of the cluster's retained messages, shared like "
        "--max-retained-messages (default %(default)s, 1 GiB)",
    )
    parser.add_argument(
        "--queue-overflow",
        choices=("drop-newest", "drop-oldest"),
        default="drop-newest",
        help="a full session queue does not take the new message (drop-newest) or drops its "
        "oldest to make room (drop-oldest); either is counted in hexmq_dropped_messages_total",
    )
    parser.add_argument(
        "--replication-log-entries",
        type=int,
        default=DEFAULT_LOG_ENTRIES,
        help="recent log entries kept per mastered partition for followers to catch up from; "
        "a follower further behind gets a snapshot of the partition",
    )
    parser.add_argument(
        "--replica-lag-timeout",
        type=float,
        default=5.0,
        help="seconds an in-sync follower may stay behind before writes stop waiting for it",
    )
    parser.add_argument(
        "--qos2-dedupe-retention",
        type=float,
        default=DEFAULT_RETENTION_S,
        metavar="SECONDS",
        help="how long a target partition remembers a QoS 2 routing whose end it was never told "
        "of (its edge died); a retry of that routing later than this is stored again "
        "(default %(default)g: 24 h)",
    )
    parser.add_argument(
        "--redis-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a Redis command (or connect) that takes longer fails, and the service stops: its "
        "partitions fail over (default %(default)g)",
    )
    add_batch_interval_argument(parser)
    parser.add_argument(
        "--removal-linger-us",
        type=int,
        default=round(DEFAULT_REMOVAL_LINGER * 1_000_000),
        metavar="US",
        help="a QoS 1 message's removal, once its client acknowledged it, waits up to this many "
        "microseconds for the next write of this master and goes with it (its Redis "
        "transaction, replication frames and answer), instead of a round of its own; below "
        "--ack-linger-us, that is the wait (default %(default)s)",
    )
    parser.add_argument("--log-level", default="INFO")
    add_observability_arguments(parser)
    add_cluster_tls_arguments(parser)


def check_options(args: argparse.Namespace) -> tuple[RedisAccess, list[str]]:
    """How to reach Redis, and warnings to log, once the options are checked (ValueError
    naming the option that cannot work); configures this process's pacing."""
    parse_hostport(args.listen, what="--listen")
    parse_hostport(args.membership, what="--membership")
    for name in (
        "max_queued_messages",
        "max_queued_bytes",
        "max_subscriptions",
        "max_retained_messages",
        "max_retained_bytes",
    ):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.replication_log_entries < 1:
        raise ValueError("--replication-log-entries must be at least 1")
    if not args.redis_timeout > 0:
        raise ValueError("--redis-timeout must be positive")
    if args.replica_lag_timeout <= 0:
        raise ValueError("--replica-lag-timeout must be positive")
    if not args.qos2_dedupe_retention > 0:
        raise ValueError("--qos2-dedupe-retention must be positive")
    check_leave_timeout(args.leave_timeout)
    access, warnings = redis_access.from_options(
        args.redis,
        user=args.redis_user,
        password_file=args.redis_password_file,
        ca=args.redis_ca,
        cert=args.redis_cert,
        key=args.redis_key,
        environ=os.environ,
    )
    apply_batch_interval(args)
    if args.removal_linger_us < 0:
        raise ValueError("--removal-linger-us must be 0 or more")
    configure_removal_linger(args.removal_linger_us / 1_000_000)
    return access, warnings


def queue_limits(args: argparse.Namespace) -> QueueLimits:
    """What one session, and the partitions mastered here, may hold."""
    return QueueLimits(
        args.max_queued_messages,
        args.queue_overflow == "drop-oldest",
        max_queued_bytes=args.max_queued_bytes,
        max_subscriptions=args.max_subscriptions,
        max_retained_messages=args.max_retained_messages,
        max_retained_bytes=args.max_retained_bytes,
    )


def replication_limits(args: argparse.Namespace, tick_s: float) -> ReplicationLimits:
    """The replication state machine's limits, its lag counted in ticks of `tick_s`."""
    return ReplicationLimits(
        log_entries=args.replication_log_entries,
        lag_ticks=max(1, round(args.replica_lag_timeout / tick_s)),
    )
