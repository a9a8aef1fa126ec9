"""Translation between MQTT packets (the codec's dataclasses) and the partition protocol's
messages, in both directions, plus the reason-code tables the edge answers with."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import NO_PROPERTIES, Properties, Publish
from hexmq.mqtt.reason_codes import ConnectReturnCode, ReasonCode

RC = ReasonCode


def packet_id_for(message_id: int) -> int:
    """The packet id of a queued delivery: stable for the message across reconnects."""
    return (message_id - 1) % 65535 + 1


def fill_message(
    m: cpb.Message,
    publisher_id: str,
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    props: Properties,
    now_ms: int,
) -> None:
    """Fill `m` in place (protobuf copies a message passed to a constructor), published at
    `now_ms` (wall clock, milliseconds: its Message Expiry counts from then)."""
    now = now_ms
    m.topic = topic
    m.payload = payload
    m.qos = qos
    m.retain = retain
    m.publisher_id = publisher_id
    m.published_at_ms = now
    if props is NO_PROPERTIES:
        return
    if props.payload_format_indicator is not None:
        m.payload_format = props.payload_format_indicator
    if props.message_expiry_interval is not None:
        m.expires_at_ms = now + props.message_expiry_interval * 1000
    if props.content_type is not None:
        m.content_type = props.content_type
    if props.response_topic is not None:
        m.response_topic = props.response_topic
    if props.correlation_data is not None:
        m.correlation_data = props.correlation_data
    for key, value in props.user_properties:
        m.user_properties.add(key=key, value=value)


# What Router.route_publish gives: per master node (its id), the partitions a message goes to.
Targets: TypeAlias = tuple[tuple[str, tuple[pb.PartitionTarget, ...]], ...]


def publish_commands(
    publisher_id: str,
    packet: Publish,
    targets: Targets,
    retained: tuple[str, pb.PartitionTarget] | None,
    now_ms: int,
) -> list[tuple[str, pb.EdgeCommand]]:
    """One Publish command per master node (plus, for RETAIN, the node mastering the topic's
    partition, if it is not one of them), published at `now_ms`. The message is built in place
    in the first command and copied for the rest."""

    def fill(message: cpb.Message) -> None:
        fill_message(
            message,
            publisher_id,
            packet.topic,
            packet.payload,
            packet.qos,
            packet.retain,
            packet.properties,
            now_ms,
        )

    return message_commands(fill, targets, retained)


def message_commands(
    fill: Callable[[cpb.Message], None],
    targets: Targets,
    retained: tuple[str, pb.PartitionTarget] | None = None,
) -> list[tuple[str, pb.EdgeCommand]]:
    """publish_commands for a message that `fill` writes (e.g. a will, already built)."""
    out: list[tuple[str, pb.EdgeCommand]] = []
    plan = list(targets)
    if retained is not None and all(node != retained[0] for node, _ in plan):
        plan.append((retained[0], ()))
    for node, node_targets in plan:
        cmd = pb.EdgeCommand()
        if out:
            cmd.publish.message.CopyFrom(out[0][1].publish.message)
        else:
            fill(cmd.publish.message)
        cmd.publish.targets.extend(node_targets)
        if retained is not None and node == retained[0]:
            cmd.publish.retained.CopyFrom(retained[1])
        out.append((node, cmd))
    return out


def publish_properties(qm: pb.QueuedMessage, now_ms: float) -> Properties:
    """The 5.0 PUBLISH properties of a delivery; the expiry is what remains of it."""
    m = qm.message
    if not (
        m.HasField("payload_format")
        or m.expires_at_ms
        or m.HasField("content_type")
        or m.response_topic
        or m.HasField("correlation_data")
        or m.user_properties
        or qm.subscription_ids
    ):
        return NO_PROPERTIES
    expiry = None
    if m.expires_at_ms:
        expiry = max(1, int((m.expires_at_ms - now_ms + 999) // 1000))
    return Properties(
        payload_format_indicator=m.payload_format if m.HasField("payload_format") else None,
        message_expiry_interval=expiry,
        content_type=m.content_type if m.HasField("content_type") else None,
        response_topic=m.response_topic or None,
        correlation_data=m.correlation_data if m.HasField("correlation_data") else None,
        user_properties=tuple((u.key, u.value) for u in m.user_properties),
        subscription_identifiers=tuple(qm.subscription_ids),
    )


def reason_name(code: int) -> str:
    try:
        return ReasonCode(code).name.replace("_", " ").title()
    except ValueError:
        return "Unknown"


_V311_RETURN_CODES: dict[int, int] = {
    RC.CLIENT_IDENTIFIER_NOT_VALID: ConnectReturnCode.IDENTIFIER_REJECTED,
    RC.BAD_USER_NAME_OR_PASSWORD: ConnectReturnCode.BAD_USER_NAME_OR_PASSWORD,
    RC.NOT_AUTHORIZED: ConnectReturnCode.NOT_AUTHORIZED,
    RC.BAD_AUTHENTICATION_METHOD: ConnectReturnCode.NOT_AUTHORIZED,
}


def v311_return_code(reason: int) -> int:
    """The 3.1.1 CONNACK return code closest to a 5.0 CONNACK reason code."""
    return _V311_RETURN_CODES.get(reason, ConnectReturnCode.SERVER_UNAVAILABLE)
