"""SUBSCRIBE (and the retained messages it gets) and UNSUBSCRIBE."""

from __future__ import annotations

from collections.abc import Sequence

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import MQTTError, SubAck, SubackReturnCode, Subscribe, UnsubAck, Unsubscribe
from hexmq.topics import split_shared, validate_topic_filter
from services.edge import retained
from services.edge.outcomes import suback_codes, unsuback_codes
from services.edge.pending_subscriptions import RetainedWatch
from services.edge.session.actions import GatherRetained
from services.edge.session.state import OK, RC, V5, SessionState, State
from services.edge.tickets import refused_by_hold

FAILURE_V311 = SubackReturnCode.FAILURE


def handle_subscribe(s: SessionState, packet: Subscribe, now: float, wall_ms: int) -> None:
    edge = s.edge
    tracer = edge.tracer
    span = tracer.start_subscribe(s.client_id) if tracer.enabled else None
    v5 = s.version == V5
    codes: list[int | None] = []
    specs = []
    sub_id = packet.properties.subscription_identifiers
    for sub in packet.subscriptions:
        try:
            # Also the share name of a $share/{ShareName}/{filter} (0x8F; the codec has
            # already refused No Local on one with a Protocol Error, MQTT-3.8.3-4).
            validate_topic_filter(sub.topic_filter)
        except MQTTError as exc:
            codes.append(exc.reason_code if v5 else FAILURE_V311)
            continue
        # A shared subscription is limited and authorized by its inner filter, as
        # mosquitto authorizes it.
        inner = split_shared(sub.topic_filter)[1]
        limit, why = s.config.topic_limits.which(inner)
        if why is not None:
            edge.stats.limited[limit] += 1
            edge.stats.rejected["subscribe", RC.TOPIC_FILTER_INVALID] += 1
            codes.append(RC.TOPIC_FILTER_INVALID if v5 else FAILURE_V311)
            continue
        if s.acl is not None and not s.acl.may_subscribe(inner):
            deny = s.config.acl_deny_reason_code
            edge.stats.rejected["subscribe", deny] += 1
            codes.append(deny if v5 else FAILURE_V311)
            continue
        codes.append(None)
        specs.append(
            pb.SubscriptionSpec(
                filter=sub.topic_filter,
                qos=sub.qos,
                no_local=sub.no_local,
                retain_as_published=sub.retain_as_published,
                retain_handling=sub.retain_handling,
                subscription_id=sub_id[0] if sub_id else 0,
            )
        )

    if not specs:  # every filter refused here: nothing goes to the partition
        refused = tuple(code for code in codes if code is not None)
        s.send(SubAck(packet.packet_id, refused))
        if span is not None:
            tracer.finish(span)
        return
    # From here on, a publish this edge routes reaches these subscriptions, as on a single
    # broker, before the partition has announced them (services/edge/
    # pending_subscriptions.py); retained messages routed meanwhile are recorded, so that
    # the ones gathered after the SUBACK are not sent again.
    router = edge.router
    partition = s.partition
    assert partition is not None
    filters = [spec.filter for spec in specs]
    router.subscribing(partition, filters)
    watch = retained.watch(router.pending, specs)

    def on_result(result: pb.Result) -> None:
        router.subscribed(partition, filters)
        if span is not None:
            tracer.finish(span, error=None if result.status == OK else result.message)
        granted_ok = result.status == OK
        if s.state is not State.CONNECTED:
            if watch is not None:
                router.pending.end_watch(watch)
            return
        # A failure is 0x80 in both versions (5.0: Unspecified error; 3.1.1: Failure).
        answered = suback_codes(result.filter_outcomes)
        granted = list(answered) if granted_ok else [FAILURE_V311] * len(specs)
        for i, code in enumerate(granted):
            if code >= FAILURE_V311 and granted_ok:
                # The partition's own refusal (0x97: over --max-subscriptions); 3.1.1 has
                # only Failure.
                edge.stats.rejected["subscribe", code] += 1
                if not v5:
                    granted[i] = FAILURE_V311
        answers = iter(granted)
        final = [code if code is not None else next(answers) for code in codes]
        s.send(SubAck(packet.packet_id, tuple(final)))
        if watch is None:
            return
        if granted_ok:
            send_retained(s, specs, answered, list(result.existed), watch)
        else:
            router.pending.end_watch(watch)

    s.request(
        pb.EdgeCommand(
            subscribe=pb.Subscribe(
                client_id=s.client_id, connection_id=s.connection_id, subscriptions=specs
            )
        ),
        on_result,
    )


def send_retained(
    s: SessionState,
    specs: list[pb.SubscriptionSpec],
    granted: list[int],
    existed: list[bool],
    watch: RetainedWatch,
) -> None:
    """After the SUBACK: the retained messages for the new subscriptions, queued through the
    session's partition like any delivery (MQTT-3.3.1-9), but those this edge routed after the
    SUBSCRIBE, which reached the subscriptions live."""
    pending = s.edge.router.pending
    wanted = retained.wanted(specs, granted, existed)
    if not wanted:
        pending.end_watch(watch)
        return

    def queue(messages: Sequence[cpb.Message]) -> None:
        pending.end_watch(watch)
        deliveries = retained.deliveries(watch.not_sent_live(messages), wanted)
        if deliveries and s.state is State.CONNECTED:
            s.request_ignored(
                pb.EdgeCommand(
                    enqueue_retained=pb.EnqueueRetained(
                        client_id=s.client_id,
                        connection_id=s.connection_id,
                        messages=deliveries,
                    )
                )
            )

    s.emit(GatherRetained(s.ask(queue), tuple(spec.filter for spec, _ in wanted)))


def handle_unsubscribe(s: SessionState, packet: Unsubscribe, now: float, wall_ms: int) -> None:
    filters = packet.topic_filters
    # 5.0: a filter that is not a valid Topic Filter (`#/a`, `a+`, a bad share name) gets
    # 0x8F Topic Filter invalid, as SUBSCRIBE's does in SUBACK, and goes no further: no
    # subscription can have it. 3.1.1's UNSUBACK has no codes; its text names no reaction to
    # such a filter in UNSUBSCRIBE beyond the UNSUBACK owed even where nothing is deleted
    # (3.1.1 MQTT-3.10.4-5). Its section 4.8 would allow a close, but a 3.1.1 SUBSCRIBE with
    # such a filter is answered (0x80), not closed, so UNSUBSCRIBE keeps its UNSUBACK too.
    codes: list[int | None] = []
    if s.version == V5:
        for topic_filter in filters:
            try:
                validate_topic_filter(topic_filter)
            except MQTTError:
                codes.append(RC.TOPIC_FILTER_INVALID)
            else:
                codes.append(None)
        if None not in codes:  # every filter refused here: nothing goes to the partition
            s.send(UnsubAck(packet.packet_id, tuple(c for c in codes if c is not None)))
            return
        filters = tuple(f for f, code in zip(filters, codes, strict=True) if code is None)
    # A shared group's partition whose member leaves is the group's last choice until the
    # answer (services/edge/pending_subscriptions.py).
    router = s.edge.router
    partition = s.partition
    assert partition is not None
    leaving = router.unsubscribing(partition, list(filters))

    def on_result(result: pb.Result) -> None:
        router.unsubscribed(partition, leaving)
        if s.state is not State.CONNECTED:
            return
        if s.version != V5:
            if result.status != OK:
                s.close(f"UNSUBSCRIBE failed: {result.message}", quiet=refused_by_hold(result))
                return
            s.send(UnsubAck(packet.packet_id))
            return
        answers = iter(
            unsuback_codes(result.filter_outcomes)
            if result.status == OK
            else (RC.UNSPECIFIED_ERROR,) * len(filters)
        )
        final = tuple(code if code is not None else next(answers) for code in codes)
        s.send(UnsubAck(packet.packet_id, final))

    s.request(
        pb.EdgeCommand(
            unsubscribe=pb.Unsubscribe(
                client_id=s.client_id, connection_id=s.connection_id, filters=filters
            )
        ),
        on_result,
    )
