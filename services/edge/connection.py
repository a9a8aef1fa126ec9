"""ClientConnection: one MQTT client, as a thin asyncio adapter around the sans-IO codec.

Bytes go into the codec; packets come out and become partition commands; partition results and
deliveries come back as callbacks and become packets. Writes made while handling one read (or one
gRPC frame of results) leave in a single transport.write.

This module keeps the packet dispatch and the hot path (PUBLISH QoS 0/1, deliveries, writes);
the other parts are mixins over services/edge/connection_base.py (state and shared plumbing):
CONNECT in connect.py, inbound QoS 2 in inbound_qos2.py, SUBSCRIBE in subscriptions.py, the
re-attach after a failover and the delivery acknowledgements in reattach.py. Commands go to
partitions through the edge's dispatcher (services/edge/dispatch.py), which holds them while a
partition has no reachable master.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from opentelemetry.trace import Span

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    NEED_DATA,
    NO_PROPERTIES,
    Auth,
    Connect,
    Disconnect,
    MQTTError,
    Packet,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
)
from services.edge.connect import ConnectHandling
from services.edge.connection_base import OK, RC, V5, State, log
from services.edge.inbound_qos2 import InboundQos2Handling
from services.edge.limits import Admission
from services.edge.reattach import SessionAttachment
from services.edge.subscriptions import SubscribeHandling
from services.edge.tickets import refused_by_hold
from services.edge.translate import (
    packet_id_for,
    publish_commands,
    publish_properties,
    reason_name,
)

__all__ = ["ClientConnection", "State"]

# QoS 0 deliveries are dropped (and counted) for a subscriber whose socket has this much unsent.
QOS0_DROP_BUFFER = 4 * 1024 * 1024


class ClientConnection(ConnectHandling, InboundQos2Handling, SubscribeHandling, SessionAttachment):
    """One MQTT client connection at the edge (asyncio.Protocol): see the module docstring."""

    # ----- asyncio.Protocol -------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.last_rx = self._loop.time()
        self.edge.connections[self.connection_id] = self
        self._timer = self._loop.call_later(self.config.connect_timeout, self._on_timer)
        self._admission = self.edge.limit.admit()
        if self._admission is Admission.DROP:
            self.stats.rejected["connect", RC.QUOTA_EXCEEDED] += 1
            self._close(None)

    def data_received(self, data: bytes) -> None:
        self.last_rx = self._loop.time()
        self.stats.bytes_in += len(data)
        self.codec.receive_data(data)
        self._process()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_deliver_spans("connection closed before PUBACK")
        self._end_session_span("connection closed")
        if self.state is State.CONNECTED:
            self._close_session(graceful=False)
        self.state = State.CLOSED
        if self._timer is not None:
            self._timer.cancel()
        self.edge.connections.pop(self.connection_id, None)
        self.edge.limit.release()

    # ----- inbound ----------------------------------------------------------------------

    def _process(self) -> None:
        try:
            while (
                (state := self.state) is State.CONNECTED
                or state is State.AWAITING_CONNECT
                or state is State.AUTHENTICATING
            ):
                event = self.codec.next_event()
                if event is NEED_DATA:
                    break
                if state is State.AUTHENTICATING:
                    self._handle_authenticating(event)
                else:
                    self._handle(event)
        except MQTTError as exc:
            self._on_protocol_error(exc)
        self._flush_acks()

    def _handle(self, packet: Packet) -> None:
        if isinstance(packet, Publish):
            self._on_publish(packet)
        elif isinstance(packet, PubAck):
            mid = self._inflight_out.pop(packet.packet_id, None)
            if mid is not None:
                self._acks.append(mid)
                if self._deliver_spans:
                    span = self._deliver_spans.pop(packet.packet_id, None)
                    if span is not None:
                        self.edge.tracer.client_ack(span, self.client_id)
        elif isinstance(packet, PingReq):
            self._write(self.codec.send(PingResp()))
        elif isinstance(packet, Subscribe):
            self._on_subscribe(packet)
        elif isinstance(packet, Unsubscribe):
            self._on_unsubscribe(packet)
        elif isinstance(packet, Disconnect):
            self._on_disconnect(packet)
        elif isinstance(packet, PubRec):
            self._on_pubrec(packet)
        elif isinstance(packet, PubRel):
            self._on_pubrel(packet)
        elif isinstance(packet, PubComp):
            self._on_pubcomp(packet)
        elif isinstance(packet, Connect):
            self._on_connect(packet)
        elif isinstance(packet, Auth) and self._auth is not None:
            # Re-authentication (4.12.1); the codec refuses AUTH after a CONNECT without a
            # method [MQTT-4.12.0-7].
            self._on_auth_step(self._auth.receive(packet, connected=True))
        else:
            self._fail(RC.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")

    def _on_publish(self, packet: Publish) -> None:
        self.stats.messages_in[packet.qos] += 1
        props = packet.properties
        if props.topic_alias is not None:
            packet = self._aliases.resolve(packet)  # a bad alias raises, ending the connection
        refusal = self._publish_refusal(packet.topic)
        if refusal is not None:
            # 5.0 hears why; 3.1.1 has no way to be told, so (as mosquitto does) it is
            # acknowledged and dropped.
            reason, why = refusal
            self.stats.rejected["publish", reason] += 1
            if packet.qos and packet.packet_id is not None:
                # A 5.0 PUBREC with a failure code ends a QoS 2 exchange; a 3.1.1 client goes
                # on with PUBREL and gets its PUBCOMP (the partition knows no such packet id).
                ack = PubRec if packet.qos == 2 else PubAck
                refused_id = packet.packet_id
                if self.version == V5:
                    props = self._reason(
                        lambda p: ack(refused_id, reason, p), why, problem_information=True
                    )
                    self._write(self.codec.send(ack(refused_id, reason, props)))
                else:
                    self._write(self.codec.send(ack(refused_id, 0)))
            return
        # The codec has already refused wildcards, bad UTF-8 and U+0000 in the topic name.
        tracer = self.edge.tracer
        span = route_span = None
        if tracer.enabled and (started := tracer.start_publish(self.client_id, packet)):
            span, route_span = started
        if packet.qos and not self.edge.router.index_complete:
            # Some partition's subscription index has not arrived: a route now could miss its
            # subscribers. Held, in arrival order, until it has (within the failover bound).
            if route_span is not None:
                route_span.end()
            self.edge.dispatcher.after_index(
                lambda result: self._publish_indexed(packet, span, result)
            )
            return
        self._route_publish(packet, span, route_span)

    def _publish_indexed(self, packet: Publish, span: Span | None, result: pb.Result) -> None:
        """A publish that waited for the subscription index (`_on_publish`)."""
        if self.state is not State.CONNECTED:
            if span is not None:
                self.edge.tracer.finish(span, error="connection closed before PUBACK")
            return
        if result.status != OK:
            assert packet.packet_id is not None
            self._publish_refused(
                packet.packet_id, result.message, span, qos=packet.qos, quiet=True
            )
            return
        self._route_publish(packet, span, None)

    def _route_publish(self, packet: Publish, span: Span | None, route_span: Span | None) -> None:
        tracer = self.edge.tracer
        router = self.edge.router
        dispatcher = self.edge.dispatcher
        route = router.route_publish(packet.topic)
        if route_span is not None:
            tracer.routed(route_span, route)
        retained = router.retained_route(packet.topic) if packet.retain else None
        if packet.qos == 0:
            commands = publish_commands(self.client_id, packet, route.targets, retained)
            if retained is not None:
                router.routed_retained(commands[0][1].publish.message)
            if span is not None:
                tracer.stamp(span, commands)
            for node, cmd in commands:
                dispatcher.publish_qos0(cmd)
                self._throttle(node)
            if span is not None:
                tracer.finish(span)
            return
        pid = packet.packet_id
        assert pid is not None
        if packet.qos == 2:
            self._on_publish_qos2(packet, pid, route, retained, span)
            return
        if not route.targets and retained is None:
            self._write(
                self.codec.send(
                    PubAck(pid, RC.NO_MATCHING_SUBSCRIBERS if self.version == V5 else 0)
                )
            )
            if span is not None:
                tracer.finish(span, reason_code=RC.NO_MATCHING_SUBSCRIBERS)
            return
        if not self._count_in():
            return
        commands = publish_commands(self.client_id, packet, route.targets, retained)
        if retained is not None:
            router.routed_retained(commands[0][1].publish.message)
        done = self._publish_done(pid, len(commands), span)
        if span is not None:
            tracer.stamp(span, commands)
        for node, cmd in commands:
            dispatcher.publish(cmd, done)
            self._throttle(node)

    def _publish_refusal(self, topic: str) -> tuple[int, str] | None:
        """Why a client may not publish to `topic` (reason code, reason string), or None: only
        the broker publishes under $SYS, the ACL may deny the topic, and the topic limits."""
        if topic.startswith("$SYS/"):
            return RC.NOT_AUTHORIZED, "only the broker publishes under $SYS/"
        if self.acl is not None and not self.acl.may_publish(topic):
            return RC.NOT_AUTHORIZED, "the ACL denies publishing to this topic"
        why = self.config.topic_limits.refusal(topic)
        if why is not None:
            return RC.TOPIC_NAME_INVALID, why
        return None

    def _count_in(self) -> bool:
        """One more publish being stored; False after ending the connection for exceeding
        our Receive Maximum."""
        self._pending_in += 1
        if (
            self._pending_in + len(self._q2_received) > self.config.receive_maximum
            and self.version == V5
        ):
            # MQTT-3.3.4-9: more unacknowledged QoS 1 and 2 publishes than we announced (a
            # QoS 2 one counts until its PUBCOMP).
            self._fail(
                RC.RECEIVE_MAXIMUM_EXCEEDED,
                f"more than {self.config.receive_maximum} unacknowledged QoS 1/2 publishes",
            )
            return False
        if self._pending_in >= self.config.receive_maximum:
            self._pause_reading("inflight")
        return True

    def _uncount_in(self) -> None:
        self._pending_in -= 1
        if self._pending_in <= self.config.receive_maximum // 2:
            self._resume_reading("inflight")

    # ----- outbound QoS 2 -----------------------------------------------------------------

    def _on_pubrec(self, packet: PubRec) -> None:
        mid = self._q2_out.pop(packet.packet_id, None)
        if mid is None:
            return  # not in flight on this connection
        if packet.reason_code >= 0x80:
            # The client refused it: the exchange ends here (no PUBREL), the message is done.
            self._acks.append(mid)
        else:
            self._recs.append(mid)
        # The client has the message: its trace ends here (what follows is PUBREL/PUBCOMP,
        # possibly on a later connection).
        if self._deliver_spans:
            span = self._deliver_spans.pop(packet.packet_id, None)
            if span is not None:
                self.edge.tracer.client_ack(span, self.client_id)

    def _on_pubcomp(self, packet: PubComp) -> None:
        mid = self._rel_out.pop(packet.packet_id, None)
        if mid is not None:
            self._acks.append(mid)

    def _publish_done(self, pid: int, parts: int, span: Span | None) -> Callable[[pb.Result], None]:
        failures: list[pb.Result] = []
        remaining = parts

        def on_result(result: pb.Result) -> None:
            nonlocal remaining
            remaining -= 1
            if result.status != OK:
                failures.append(result)
            if remaining:
                return
            self._uncount_in()
            if self.state is not State.CONNECTED:
                if span is not None:
                    self.edge.tracer.finish(span, error="connection closed before PUBACK")
                return
            if failures:
                failure = failures[0]
                self._publish_refused(pid, failure.message, span, quiet=refused_by_hold(failure))
            else:
                self._write(self.codec.send(PubAck(pid)))
                if span is not None:
                    self.edge.tracer.finish(span)

        return on_result

    def _publish_refused(
        self,
        pid: int,
        why: str,
        span: Span | None = None,
        *,
        qos: int = 1,
        close: bool = False,
        quiet: bool = False,
    ) -> None:
        """Never acknowledge what was not stored: 5.0 gets a failing PUBACK (PUBREC for QoS 2,
        which ends that exchange), 3.1.1 (which has none) or `close` loses the connection and
        the client will resend the unacknowledged message. `quiet`: a refusal past the failover
        bound, logged once per partition and burst (services/edge/hold.py), not here."""
        self.stats.refused_publishes += 1
        if span is not None:
            self.edge.tracer.finish(span, reason_code=RC.UNSPECIFIED_ERROR, error=why)
        if self.version == V5 and not close:
            if not quiet:
                log.warning("%s: PUBLISH %d refused: %s", self.client_id, pid, why)
            ack = PubRec if qos == 2 else PubAck
            props = self._reason(
                lambda p: ack(pid, RC.UNSPECIFIED_ERROR, p), why, problem_information=True
            )
            self._write(self.codec.send(ack(pid, RC.UNSPECIFIED_ERROR, props)))
        else:
            self._close(f"PUBLISH {pid} cannot be stored: {why}", quiet=quiet)

    def _on_disconnect(self, packet: Disconnect) -> None:
        expiry = packet.properties.session_expiry_interval
        if expiry and self.version == V5 and self.connect_expiry == 0:
            # 3.14.2.2.2: not a valid DISCONNECT (so the will is sent, as for a lost connection).
            self._fail(
                RC.PROTOCOL_ERROR,
                "DISCONNECT sets a Session Expiry Interval on a session connected with 0",
            )
            return
        if expiry is not None and self.version == V5:
            self._close_session(graceful=True, expiry=expiry, send_will=packet.reason_code == 0x04)
        else:
            self._close_session(graceful=True, send_will=packet.reason_code == 0x04)
        self.state = State.CLOSED
        self._close(None)

    # ----- outbound ---------------------------------------------------------------------

    def deliver(self, delivery: pb.Delivery) -> None:
        if self.state is not State.CONNECTED:
            return
        now = time.time() * 1000
        send = self.codec.send
        transport = self.transport
        tracer = self.edge.tracer
        acl = self.acl
        out_aliases = self._out_aliases
        limit = self.client_max_packet
        for qm in delivery.messages:
            if qm.released:
                # QoS 2, PUBREC recorded: PUBREL (again) until PUBCOMP.
                rel_pid = packet_id_for(qm.message_id)
                self._q2_out.pop(rel_pid, None)
                self._rel_out[rel_pid] = qm.message_id
                self._write(send(PubRel(rel_pid)))
                continue
            m = qm.message
            if acl is not None and not acl.may_receive(m.topic):
                # Granted by a broader subscription (or one made under other rules): not for
                # this client. Acknowledged so that the partition forgets it.
                if qm.qos:
                    self._acks.append(qm.message_id)
                continue
            if (
                qm.qos == 0
                and transport is not None
                and (transport.get_write_buffer_size() + self._out_bytes > QOS0_DROP_BUFFER)
            ):
                # A subscriber that cannot keep up loses QoS 0 messages, not the broker memory.
                self.stats.dropped_qos0 += 1
                continue
            if m.expires_at_ms and m.expires_at_ms <= now and not (qm.dup and qm.qos == 2):
                # (A QoS 2 message sent before is not dropped: its delivery has started and the
                # client holds its packet id until PUBREL.)
                if qm.qos:
                    self._acks.append(qm.message_id)
                continue
            pid = packet_id_for(qm.message_id) if qm.qos else None
            props = publish_properties(qm, now) if self.version == V5 else NO_PROPERTIES
            if out_aliases is None:
                data = send(Publish(m.topic, m.payload, qm.qos, qm.retain, qm.dup, pid, props))
            else:  # the alias map changes here, in send order, only for what is sent
                data = out_aliases.encode(
                    send, m.topic, m.payload, qm.qos, qm.retain, qm.dup, pid, props, limit
                )
            if limit and len(data) > limit:
                # MQTT-3.1.2-25: too large for this client: discard it and behave as if it
                # had been delivered (the partition forgets it), for this client only.
                self.stats.dropped_too_large += 1
                if qm.qos:
                    self._acks.append(qm.message_id)
                continue
            span = tracer.start_deliver(qm, self.client_id) if tracer.enabled else None
            if pid is not None:
                (self._q2_out if qm.qos == 2 else self._inflight_out)[pid] = qm.message_id
                if span is not None:
                    self._deliver_spans[pid] = span
            elif span is not None:
                span.end()
            self._write(data)
            self.stats.messages_out[qm.qos] += 1
        self._flush_acks()

    def kick(self, reason_code: int) -> None:
        """Another connection took the session over (or the partition ended it)."""
        if self.state is State.CLOSED:
            return
        log.info("%s (%s) taken over; closing", self.client_id, self.peer)
        if self.edge.tracer.enabled:
            self.edge.tracer.finish(
                self.edge.tracer.start_event(telemetry.SpanName.TAKEOVER, self.client_id),
                reason_code=reason_code,
            )
        self.state = State.CLOSED
        if self.version == V5:
            why = (
                "another connection with this client id took the session over"
                if reason_code == RC.SESSION_TAKEN_OVER
                else reason_name(reason_code)
            )
            props = self._reason(lambda p: Disconnect(reason_code, p), why)
            self._write(self.codec.send(Disconnect(reason_code, props)))
        self._close(None)

    def shutdown(self, *, leaving: bool = False, reference: str | None = None) -> None:
        """The edge is stopping: tell 5.0 clients (0x8B, or 0x9C Use another server with the
        --server-reference) and close. When its node left the cluster (`leaving`), `reference`
        is where the client should go when the edge knows one for this listener: 0x9C with it
        as the Server Reference (a client redirects on 0x9C or 0x9D, the reason codes MQTT 5.0
        section 4.11 pairs a Server Reference with), else 0x8B."""
        if self.state is State.CONNECTED and self.version == V5:
            ref = reference if leaving else self.config.server_reference
            if ref:
                packet = Disconnect(RC.USE_ANOTHER_SERVER, Properties(server_reference=ref))
            else:
                packet = Disconnect(RC.SERVER_SHUTTING_DOWN)
            self._write(self.codec.send(packet))
        self._close(None)

    # ----- helpers ----------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        self._out.append(data)
        self._out_bytes += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_out)

    def _flush_out(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None and not self.transport.is_closing():
            data = b"".join(self._out)
            self.stats.bytes_out += len(data)
            self.transport.write(data)
        self._out = []
        self._out_bytes = 0
