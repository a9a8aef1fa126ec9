"""SubscribeHandling: a client's SUBSCRIBE (and the retained messages it gets) and UNSUBSCRIBE."""

from __future__ import annotations

from hexmq import telemetry
from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import MQTTError, SubAck, Subscribe, UnsubAck, Unsubscribe
from hexmq.topics import split_shared, validate_topic_filter
from services.edge import retained
from services.edge.connection_base import OK, RC, V5, ConnectionBase, State
from services.edge.pending_subscriptions import RetainedWatch
from services.edge.tickets import refused_by_hold


class SubscribeHandling(ConnectionBase):
    """The SUBSCRIBE/UNSUBSCRIBE part of ClientConnection (a mixin over ConnectionBase)."""

    def _on_subscribe(self, packet: Subscribe) -> None:
        tracer = self.edge.tracer
        span = (
            tracer.start_event(telemetry.SpanName.SUBSCRIBE, self.client_id)
            if tracer.enabled
            else None
        )
        codes: list[int | None] = []
        specs = []
        sub_id = packet.properties.subscription_identifiers
        for sub in packet.subscriptions:
            try:
                # Also the share name of a $share/{ShareName}/{filter} (0x8F; the codec has
                # already refused No Local on one with a Protocol Error, MQTT-3.8.3-4).
                validate_topic_filter(sub.topic_filter)
            except MQTTError as exc:
                codes.append(exc.reason_code if self.version == V5 else 0x80)
                continue
            # A shared subscription is limited and authorized by its inner filter, as
            # mosquitto authorizes it.
            inner = split_shared(sub.topic_filter)[1]
            if self.config.topic_limits.refusal(inner) is not None:
                self.stats.rejected["subscribe", RC.TOPIC_FILTER_INVALID] += 1
                codes.append(RC.TOPIC_FILTER_INVALID if self.version == V5 else 0x80)
                continue
            if self.acl is not None and not self.acl.may_subscribe(inner):
                deny = self.config.acl_deny_reason_code
                self.stats.rejected["subscribe", deny] += 1
                codes.append(deny if self.version == V5 else 0x80)
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
            self._write(self.codec.send(SubAck(packet.packet_id, refused)))
            if span is not None:
                tracer.finish(span)
            return
        # From here on, a publish this edge routes reaches these subscriptions, as on a single
        # broker, before the partition has announced them (services/edge/
        # pending_subscriptions.py); retained messages routed meanwhile are recorded, so that
        # the ones gathered after the SUBACK are not sent again.
        router = self.edge.router
        partition = self._session_partition()
        filters = [s.filter for s in specs]
        router.subscribing(partition, filters)
        watch = retained.watch(router.pending, specs)

        def on_result(result: pb.Result) -> None:
            router.subscribed(partition, filters)
            if span is not None:
                tracer.finish(span, error=None if result.status == OK else result.message)
            granted_ok = result.status == OK
            if self.state is not State.CONNECTED:
                if watch is not None:
                    router.pending.end_watch(watch)
                return
            granted = iter(result.reason_codes if granted_ok else [0x80] * len(specs))
            final = [code if code is not None else next(granted) for code in codes]
            self._write(self.codec.send(SubAck(packet.packet_id, tuple(final))))
            if watch is None:
                return
            if granted_ok:
                self._send_retained(specs, list(result.reason_codes), list(result.existed), watch)
            else:
                router.pending.end_watch(watch)

        self._session_request(
            pb.EdgeCommand(
                subscribe=pb.Subscribe(
                    client_id=self.client_id, connection_id=self.connection_id, subscriptions=specs
                )
            ),
            on_result,
        )

    def _send_retained(
        self,
        specs: list[pb.SubscriptionSpec],
        granted: list[int],
        existed: list[bool],
        watch: RetainedWatch,
    ) -> None:
        """After the SUBACK: the retained messages for the new subscriptions, queued through
        the session's partition like any delivery (MQTT-3.3.1-9), but those this edge routed
        after the SUBSCRIBE, which reached the subscriptions live."""
        pending = self.edge.router.pending
        wanted = retained.wanted(specs, granted, existed)
        if not wanted:
            pending.end_watch(watch)
            return

        def queue(messages: list[cpb.Message]) -> None:
            pending.end_watch(watch)
            deliveries = retained.deliveries(watch.not_sent_live(messages), wanted)
            if deliveries and self.state is State.CONNECTED:
                self._session_request(
                    pb.EdgeCommand(
                        enqueue_retained=pb.EnqueueRetained(
                            client_id=self.client_id,
                            connection_id=self.connection_id,
                            messages=deliveries,
                        )
                    ),
                    lambda result: None,
                )

        retained.gather(list(self.edge.router.links.values()), [s.filter for s, _ in wanted], queue)

    def _on_unsubscribe(self, packet: Unsubscribe) -> None:
        # A shared group's partition whose member leaves is the group's last choice until the
        # answer (services/edge/pending_subscriptions.py).
        router = self.edge.router
        partition = self._session_partition()
        leaving = router.unsubscribing(partition, list(packet.topic_filters))

        def on_result(result: pb.Result) -> None:
            router.unsubscribed(partition, leaving)
            if self.state is not State.CONNECTED:
                return
            if self.version != V5:
                if result.status != OK:
                    self._close(
                        f"UNSUBSCRIBE failed: {result.message}", quiet=refused_by_hold(result)
                    )
                    return
                self._write(self.codec.send(UnsubAck(packet.packet_id)))
                return
            codes = (
                tuple(result.reason_codes)
                if result.status == OK
                else (0x80,) * len(packet.topic_filters)
            )
            self._write(self.codec.send(UnsubAck(packet.packet_id, codes)))

        self._session_request(
            pb.EdgeCommand(
                unsubscribe=pb.Unsubscribe(
                    client_id=self.client_id,
                    connection_id=self.connection_id,
                    filters=packet.topic_filters,
                )
            ),
            on_result,
        )
