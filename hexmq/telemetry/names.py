"""Span names, span attribute names and attribute helpers: the contract with trace readers.

The Spark job and dashboards select spans by these names and attributes, so they are defined once
here and never spelled out elsewhere. Adding a name is fine; renaming one breaks readers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Final

from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue


class SpanName:
    """Span names. One publish is one trace:

    mqtt.publish (edge, root unless the client sent a context)
      edge.route
      partition.append          one per target partition (on its master)
        partition.replicate     one per follower
        partition.ack
        mqtt.deliver            one per subscriber
          mqtt.client_ack
    """

    PUBLISH: Final = "mqtt.publish"
    ROUTE: Final = "edge.route"
    APPEND: Final = "partition.append"
    REPLICATE: Final = "partition.replicate"
    ACK: Final = "partition.ack"
    DELIVER: Final = "mqtt.deliver"
    CLIENT_ACK: Final = "mqtt.client_ack"
    CONNECT: Final = "mqtt.connect"
    SUBSCRIBE: Final = "mqtt.subscribe"
    TAKEOVER: Final = "session.takeover"
    FAILOVER: Final = "partition.failover"
    CATCHUP: Final = "partition.catchup"
    MEMBERSHIP_VIEW: Final = "membership.view"


# The status message of an mqtt.deliver span whose PUBLISH was written and whose connection
# closed before the client acknowledged it: the client may hold it, so a redelivery may be a
# second copy (the Spark job's audit counts it towards `duplicated`).
DELIVER_UNACKNOWLEDGED: Final = "connection closed before PUBACK"


# The kind each span should be started with. SERVER where the span is the receiving side of a
# client's or peer's request, CLIENT/PRODUCER where this process sends on, INTERNAL otherwise;
# Jaeger draws service edges from SERVER/CLIENT pairs.
SPAN_KIND: Final[Mapping[str, SpanKind]] = {
    SpanName.PUBLISH: SpanKind.SERVER,
    SpanName.ROUTE: SpanKind.INTERNAL,
    SpanName.APPEND: SpanKind.SERVER,
    SpanName.REPLICATE: SpanKind.CLIENT,
    SpanName.ACK: SpanKind.INTERNAL,
    SpanName.DELIVER: SpanKind.PRODUCER,
    SpanName.CLIENT_ACK: SpanKind.SERVER,
    SpanName.CONNECT: SpanKind.SERVER,
    SpanName.SUBSCRIBE: SpanKind.SERVER,
    SpanName.TAKEOVER: SpanKind.INTERNAL,
    SpanName.FAILOVER: SpanKind.INTERNAL,
    SpanName.CATCHUP: SpanKind.INTERNAL,
    SpanName.MEMBERSHIP_VIEW: SpanKind.INTERNAL,
}


class Attr:
    """Span attribute names: OpenTelemetry messaging semantic conventions, then hexmq's own.

    The Spark job (spark/hexmq_traces/schema.py ATTRIBUTE_COLUMNS) reads these by name, and
    types: ints stay ints (partition, epoch, seq, qos, counts, reason code), ids are strings.
    """

    MESSAGING_SYSTEM: Final = "messaging.system"
    DESTINATION: Final = "messaging.destination.name"  # the MQTT topic
    MESSAGE_ID: Final = "messaging.message.id"
    OPERATION_TYPE: Final = "messaging.operation.type"
    OPERATION_NAME: Final = "messaging.operation.name"
    BODY_SIZE: Final = "messaging.message.body.size"
    BATCH_COUNT: Final = "messaging.batch.message_count"
    # The MQTT client's address (general semantic conventions): from the PROXY protocol header
    # when the edge's listener is behind a balancer that sends one, else the socket's peer.
    CLIENT_ADDRESS: Final = "client.address"
    CLIENT_PORT: Final = "client.port"

    NODE: Final = "hexmq.node"
    PARTITION: Final = "hexmq.partition"
    EPOCH: Final = "hexmq.partition.epoch"
    SEQ: Final = "hexmq.partition.seq"  # the partition log sequence number of a write
    FOLLOWER: Final = "hexmq.follower"  # node id of the follower a replicate span waits on
    QOS: Final = "hexmq.qos"
    # On mqtt.deliver: a PUBLISH sent again with the DUP flag (MQTT 4.4: after a reconnect); at
    # QoS 2 the client's packet id makes it the same delivery, not a second one.
    DUP: Final = "hexmq.dup"
    CLIENT_ID_HASH: Final = "hexmq.client_id_hash"  # the publisher's (or the acting client's)
    SUBSCRIBER_HASH: Final = "hexmq.subscriber_hash"  # client_id_hash of the receiving client
    SUBSCRIBERS: Final = "hexmq.subscribers"  # matching subscribers of a publish
    ROUTE_PARTITIONS: Final = "hexmq.route.partitions"  # partitions a publish was routed to
    REPLICATION_LAG: Final = "hexmq.replication.lag"  # writes a follower is behind
    REASON_CODE: Final = "hexmq.reason_code"  # MQTT reason code sent back, when not success
    VIEW_EPOCH: Final = "hexmq.view.epoch"
    NODE_LOST: Final = "hexmq.node.lost"  # the node whose loss caused a failover


MESSAGING_SYSTEM: Final = "mqtt"  # not in the semconv's list of well-known systems; allowed

# messaging.operation.name (MQTT's word) -> messaging.operation.type (semconv's closed set).
# The broker sits in the middle, so these describe what happens to the message at that step.
OPERATION_TYPES: Final[Mapping[str, str]] = {
    "publish": "send",
    "deliver": "process",
    "ack": "settle",
}


def client_id_hash(client_id: str | bytes) -> str:
    """A short stable id for a client: 16 hex digits of BLAKE2b-64 of its UTF-8 client id.

    Client ids can be personal data (device serials, user names), and traces leave the cluster,
    so spans carry this instead. It is the same in every process and release, so a trace reader
    can group by client and an operator who knows a client id can compute its hash. It is
    unkeyed: it hides ids from casual readers, not from someone who can guess candidates.
    """
    raw = client_id.encode() if isinstance(client_id, str) else client_id
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def messaging_attributes(
    *,
    operation: str | None = None,
    topic: str | None = None,
    message_id: str | None = None,
    body_size: int | None = None,
    qos: int | None = None,
    client_id: str | bytes | None = None,
    subscriber_id: str | bytes | None = None,
    node: str | None = None,
    partition: int | None = None,
    epoch: int | None = None,
    seq: int | None = None,
) -> dict[str, AttributeValue]:
    """Attributes of a span about one message; unset arguments are left out.

    `operation` is the MQTT step ("publish", "deliver", "ack"); the semconv operation type is
    derived from it. `client_id` (the publisher) and `subscriber_id` (the receiver, on
    mqtt.deliver / mqtt.client_ack) are hashed here (see client_id_hash), never recorded raw.
    Build these only when `span.is_recording()`: that keeps unsampled messages cheap.
    """
    attrs: dict[str, AttributeValue] = {Attr.MESSAGING_SYSTEM: MESSAGING_SYSTEM}
    if operation is not None:
        attrs[Attr.OPERATION_NAME] = operation
        op_type = OPERATION_TYPES.get(operation)
        if op_type is not None:
            attrs[Attr.OPERATION_TYPE] = op_type
    if topic is not None:
        attrs[Attr.DESTINATION] = topic
    if message_id is not None:
        attrs[Attr.MESSAGE_ID] = message_id
    if body_size is not None:
        attrs[Attr.BODY_SIZE] = body_size
    if qos is not None:
        attrs[Attr.QOS] = qos
    if client_id is not None:
        attrs[Attr.CLIENT_ID_HASH] = client_id_hash(client_id)
    if subscriber_id is not None:
        attrs[Attr.SUBSCRIBER_HASH] = client_id_hash(subscriber_id)
    attrs.update(partition_attributes(node=node, partition=partition, epoch=epoch, seq=seq))
    return attrs


def partition_attributes(
    *,
    node: str | None = None,
    partition: int | None = None,
    epoch: int | None = None,
    seq: int | None = None,
    follower: str | None = None,
) -> dict[str, AttributeValue]:
    """hexmq's placement attributes (for partition.* spans and any span that names a node)."""
    attrs: dict[str, AttributeValue] = {}
    if node is not None:
        attrs[Attr.NODE] = node
    if partition is not None:
        attrs[Attr.PARTITION] = partition
    if epoch is not None:
        attrs[Attr.EPOCH] = epoch
    if seq is not None:
        attrs[Attr.SEQ] = seq
    if follower is not None:
        attrs[Attr.FOLLOWER] = follower
    return attrs
