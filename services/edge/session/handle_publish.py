"""PUBLISH from a client: refusals, then QoS 0 and 1 routed to their subscribers' partitions
(QoS 2 goes on in services/edge/session/handle_qos2.py).

A QoS 1/2 publish waits while some partition's subscription index has not arrived (a route
now could miss its subscribers); a QoS 1 one is acknowledged once every target partition has
stored it (5.0: 0x10 when nothing matched), or refused, never acknowledged falsely.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import PubAck, Publish, PubRec
from services.edge.session.actions import AwaitIndex, PublishCommand
from services.edge.session.handle_qos2 import publish_qos2
from services.edge.session.receive_maximum import count_in, uncount_in
from services.edge.session.refusals import refuse_publish, refuse_retain, watch_retained
from services.edge.session.state import CONNECTED, OK, RC, V5, SessionState, State
from services.edge.tickets import fan_in, refused_by_hold
from services.edge.topic_alias import InboundTopicAliases
from services.edge.translate import publish_commands

if TYPE_CHECKING:
    from opentelemetry.trace import Span


def handle_publish(s: SessionState, packet: Publish, now: float, wall_ms: int) -> None:
    edge = s.edge
    edge.stats.messages_in[packet.qos] += 1
    if packet.properties.topic_alias is not None:
        aliases = s.in_aliases
        if aliases is None:
            aliases = s.in_aliases = InboundTopicAliases(s.config.topic_alias_maximum)
        packet = aliases.resolve(packet)  # a bad alias raises, ending the connection
    refusal = publish_refusal(s, packet.topic)
    if refusal is not None:
        # 5.0 hears why; 3.1.1 has no way to be told, so (as mosquitto does) it is
        # acknowledged and dropped.
        reason, why = refusal
        edge.stats.rejected["publish", reason] += 1
        if packet.qos and packet.packet_id is not None:
            # A 5.0 PUBREC with a failure code ends a QoS 2 exchange; a 3.1.1 client goes
            # on with PUBREL and gets its PUBCOMP (the partition knows no such packet id).
            ack = PubRec if packet.qos == 2 else PubAck
            refused_id = packet.packet_id
            if s.version == V5:
                props = s.reason(
                    lambda p: ack(refused_id, reason, p), why, problem_information=True
                )
                s.send(ack(refused_id, reason, props))
            else:
                s.send(ack(refused_id, RC.SUCCESS))
        return
    # The codec has already refused wildcards, bad UTF-8 and U+0000 in the topic name.
    tracer = edge.tracer
    span = route_span = None
    if tracer.enabled and (started := tracer.start_publish(s.client_id, packet)):
        span, route_span = started
    if packet.qos and not edge.router.index_complete:
        # Some partition's subscription index has not arrived: a route now could miss its
        # subscribers. Held, in arrival order, until it has (within the failover bound).
        if route_span is not None:
            route_span.end()
        token = s.ask(lambda result, _route: indexed(s, packet, span, result, wall_ms))
        s.emit(AwaitIndex(token))
        return
    route_publish(s, packet, span, route_span, wall_ms)


def indexed(
    s: SessionState, packet: Publish, span: Span | None, result: pb.Result, wall_ms: int
) -> None:
    """A publish that waited for the subscription index (`handle_publish`)."""
    if s.state is not State.CONNECTED:
        if span is not None:
            s.edge.tracer.finish(span, error="connection closed before PUBACK")
        return
    if result.status != OK:
        assert packet.packet_id is not None
        refuse_publish(s, packet.packet_id, result.message, span, qos=packet.qos, quiet=True)
        return
    route_publish(s, packet, span, None, wall_ms)


def route_publish(
    s: SessionState, packet: Publish, span: Span | None, route_span: Span | None, wall_ms: int
) -> None:
    edge = s.edge
    tracer = edge.tracer
    router = edge.router
    route = router.route_publish(packet.topic)
    if route_span is not None:
        tracer.routed(route_span, route)
    retained = router.retained_route(packet.topic) if packet.retain else None
    if packet.qos == 0:
        commands = publish_commands(s.client_id, packet, route.targets, retained, wall_ms)
        if retained is not None:
            router.routed_retained(commands[0][1].publish.message)
        if span is not None:
            tracer.stamp(span, commands)
        for node, cmd in commands:
            s.emit(PublishCommand(0, node, cmd))
        if span is not None:
            tracer.finish(span)
        return
    pid = packet.packet_id
    assert pid is not None
    if packet.qos == 2:
        publish_qos2(s, packet, pid, retained, span, wall_ms)
        return
    if not route.targets and retained is None:
        s.send(PubAck(pid, RC.NO_MATCHING_SUBSCRIBERS if s.version == V5 else RC.SUCCESS))
        if span is not None:
            tracer.finish(span, reason_code=RC.NO_MATCHING_SUBSCRIBERS)
        return
    size = len(packet.payload)
    if not count_in(s, size):
        return
    commands = publish_commands(s.client_id, packet, route.targets, retained, wall_ms)
    if retained is not None:
        router.routed_retained(commands[0][1].publish.message)

    not_retained: list[str] = []

    def stored(failure: pb.Result | None) -> None:
        uncount_in(s, size)
        if s.state is not CONNECTED:
            if span is not None:
                tracer.finish(span, error="connection closed before PUBACK")
            return
        if failure is not None:
            refuse_publish(s, pid, failure.message, span, quiet=refused_by_hold(failure))
        elif not_retained and s.version == V5:
            # Delivered, but over the cluster's retained cap: 0x97, nothing else differs.
            refuse_retain(s, pid, not_retained[0], span, qos=1)
        else:
            s.send(PubAck(pid))
            if span is not None:
                tracer.finish(span)

    if span is not None:
        tracer.stamp(span, commands)
    answered = watch_retained(fan_in(len(commands), stored), not_retained, retained)
    for node, cmd in commands:
        s.emit(PublishCommand(s.ask(answered), node, cmd))


def publish_refusal(s: SessionState, topic: str) -> tuple[int, str] | None:
    """Why a client may not publish to `topic` (reason code, reason string), or None: only the
    broker publishes under $SYS, the ACL may deny the topic, and the topic limits."""
    if topic.startswith("$SYS/"):
        return RC.NOT_AUTHORIZED, "only the broker publishes under $SYS/"
    if s.acl is not None and not s.acl.may_publish(topic):
        return RC.NOT_AUTHORIZED, "the ACL denies publishing to this topic"
    limit, why = s.config.topic_limits.which(topic)
    if why is not None:
        s.edge.stats.limited[limit] += 1
        return RC.TOPIC_NAME_INVALID, why
    return None
