"""ClientConnection: one MQTT client, as a thin asyncio adapter around the sans-IO codec.

Bytes go into the codec; packets come out and become partition commands; partition results and
deliveries come back as callbacks and become packets. Writes made while handling one read (or one
gRPC frame of results) leave in a single transport.write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, Status, StatusCode

from hexmq import telemetry
from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    NEED_DATA,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MQTTConnection,
    MQTTError,
    Packet,
    PingReq,
    PingResp,
    Properties,
    ProtocolError,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Role,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    UnsupportedProtocolVersion,
    encode,
)
from hexmq.mqtt.reason_codes import ConnectReturnCode, ReasonCode
from hexmq.topics import split_shared, validate_topic_filter
from services.edge import retained
from services.edge.acl import ClientAcl
from services.edge.enhanced_auth import ConnectionAuth, Continue, Step, Success
from services.edge.limits import Admission
from services.edge.links import unavailable
from services.edge.qos2_origins import RoutedOrigin, carry_origin, fault_stall
from services.edge.topic_alias import InboundTopicAliases, OutboundTopicAliases, outbound_aliases
from services.edge.translate import (
    fill_message,
    packet_id_for,
    publish_commands,
    publish_properties,
    reason_name,
    v311_return_code,
)

if TYPE_CHECKING:
    from services.edge.links import PartitionLink
    from services.edge.router import PublishRoute, SessionRoute
    from services.edge.server import Edge

log = logging.getLogger("hexmq.edge.connection")

OK = pb.StatusCode.STATUS_CODE_OK
UNAVAILABLE = pb.StatusCode.STATUS_CODE_UNAVAILABLE
# Answers meaning that this connection no longer holds its session (it is being closed).
GONE = (pb.StatusCode.STATUS_CODE_TAKEN_OVER, pb.StatusCode.STATUS_CODE_NOT_FOUND)
NEVER_EXPIRES = 0xFFFFFFFF
V5 = 5
RC = ReasonCode
# QoS 0 deliveries are dropped (and counted) for a subscriber whose socket has this much unsent.
QOS0_DROP_BUFFER = 4 * 1024 * 1024


class State(enum.Enum):
    AWAITING_CONNECT = 1
    AUTHENTICATING = 5  # CONNECT named an Authentication Method: AUTH exchange before CONNACK
    CONNECTING = 2  # CONNECT sent to the session's partition, waiting for its answer
    CONNECTED = 3
    CLOSED = 4


class ClientConnection(asyncio.Protocol):
    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.config = edge.config
        self.codec = MQTTConnection(Role.SERVER, max_packet_size=edge.config.max_packet_size)
        self.connection_id = edge.new_connection_id()
        self.state = State.AWAITING_CONNECT
        self.client_id = ""
        self.version = 4
        self.route: SessionRoute | None = None
        self.peer = "?"
        self.transport: asyncio.Transport | None = None
        self.keepalive = 0
        # 5.0 Request Problem Information: False means no Reason String on acknowledgements.
        self.problem_information = True
        # The Session Expiry Interval the client connected with (5.0).
        self.connect_expiry = 0
        self.last_rx = 0.0
        self.receive_maximum = 0
        # The largest packet the client accepts (5.0 Maximum Packet Size; 0: no limit).
        self.client_max_packet = 0
        # Topic aliases (5.0), of this connection only: the client's, and ours for deliveries
        # (None when the client or the edge wants none, and for 3.1.1).
        self._aliases = InboundTopicAliases(edge.config.topic_alias_maximum)
        self._out_aliases: OutboundTopicAliases | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self.stats = edge.stats
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._acks: list[int] = []
        # Deliveries sent to the client and not acknowledged: packet id -> message id.
        self._inflight_out: dict[int, int] = {}
        # QoS 2 deliveries: PUBLISH sent, awaiting PUBREC (packet id -> message id); PUBREC'd
        # message ids for the partition (flushed with the acks); PUBREL sent, awaiting PUBCOMP.
        self._q2_out: dict[int, int] = {}
        self._recs: list[int] = []
        self._rel_out: dict[int, int] = {}
        # Publishes being stored (QoS 1 until PUBACK, QoS 2 until PUBREC).
        self._pending_in = 0
        # Inbound QoS 2 on this connection: packet ids being claimed and routed; those whose
        # routing could not be recorded because the session's link dropped (recorded again on
        # re-attach, then PUBREC: reason code, span, origin); those answered with PUBREC and
        # awaiting PUBREL (they count against our Receive Maximum until PUBCOMP, MQTT-4.9).
        self._q2_routing: set[int] = set()
        self._q2_unrecorded: dict[int, tuple[int, Span | None, RoutedOrigin | None]] = {}
        self._q2_received: set[int] = set()
        # Why reading is paused: "connect" (CONNACK pending), "inflight" (too many unacknowledged
        # publishes), "link" (a partition link is congested). Reading resumes when none is left.
        self._paused_for: set[str] = set()
        self._assigned_id: str | None = None
        # Set when --max-keepalive overrides the client's Keep Alive (5.0 Server Keep Alive).
        self._server_keep_alive: int | None = None
        # Traced deliveries awaiting the client's PUBACK, by packet id.
        self._deliver_spans: dict[int, Span] = {}
        self._session_span: Span | None = None
        # What this client may publish and receive (None: no ACL file, everything).
        self.acl: ClientAcl | None = None
        self._admission = Admission.ADMITTED
        # Enhanced authentication (5.0, CONNECT with an Authentication Method), and the CONNECT
        # waiting for its exchange to end.
        self._auth: ConnectionAuth | None = None
        self._pending_connect: Connect | None = None
        self._final_auth_data: bytes | None = None  # for the CONNACK

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

    def _on_connect(self, packet: Connect) -> None:
        self.version = packet.protocol_version
        props = packet.properties
        method_name = None
        if self.version == V5:
            # Known before CONNACK: they shape the AUTH packets and refusals too.
            self.problem_information = props.request_problem_information is not False
            self.client_max_packet = props.maximum_packet_size or 0
            method_name = props.authentication_method
        method = None
        if method_name is not None:
            method = self.edge.access.methods.get(method_name)
            if method is None:  # [MQTT-4.12.0-1]
                self._refuse_connect(
                    RC.BAD_AUTHENTICATION_METHOD,
                    self.edge.access.methods.why_refused(method_name),
                )
                return
        if self._admission is not Admission.ADMITTED:
            self._refuse_busy(RC.QUOTA_EXCEEDED, f"over {self.edge.limit.maximum} connections")
            return
        rate = self.edge.connect_rate
        if rate is not None and not rate.allow():
            self._refuse_busy(
                RC.CONNECTION_RATE_EXCEEDED, f"over {rate.per_second:g} new connections a second"
            )
            return
        client_id = packet.client_id
        assigned = None
        if not client_id:
            if self.version != V5 and not packet.clean_start:
                # MQTT-3.1.3-8: an empty id needs clean session 1 in 3.1.1.
                self._refuse_connect(
                    RC.CLIENT_IDENTIFIER_NOT_VALID, "empty client id with clean session 0"
                )
                return
            client_id = assigned = f"hexmq-{uuid.uuid4().hex[:20]}"
        self.client_id = client_id
        self._assigned_id = assigned
        if not self._grant_keepalive(packet.keepalive):
            return
        will_refusal = packet.will and self.config.topic_limits.refusal(packet.will.topic)
        if will_refusal:
            self._refuse_connect(RC.TOPIC_NAME_INVALID, f"will {will_refusal}")
            return
        route = self.edge.router.session_route(client_id)
        if not route.link.connected:
            # Before the credentials, so that a refusal for them also shows that this edge
            # reaches the session's node (what `hexmq cluster up` probes with an anonymous
            # CONNECT when a password file is set).
            self._refuse_connect(RC.SERVER_UNAVAILABLE, unavailable(route.link.node_id).message)
            return
        if method is not None:
            # The method decides who the client is; CONNECT's User Name and Password are not
            # checked. Only AUTH (or DISCONNECT) may come until CONNACK [MQTT-3.1.2-30].
            self._auth = ConnectionAuth(method, client_id=client_id, peer=self.peer)
            self._pending_connect = packet
            self.state = State.AUTHENTICATING
            self._on_auth_step(self._auth.start(props.authentication_data))
            return
        reason, why = self.edge.access.authenticate(packet.username, packet.password)
        if reason:
            self._refuse_connect(reason, why)
            return
        self._open_session(packet, packet.username)

    def _handle_authenticating(self, packet: Packet) -> None:
        if isinstance(packet, Auth):
            assert self._auth is not None
            self._on_auth_step(self._auth.receive(packet, connected=False))
        elif isinstance(packet, Disconnect):
            self._close(None)  # the client gave up; there is no session yet
        else:
            raise ProtocolError(
                f"{type(packet).__name__} before CONNACK; a CONNECT with an Authentication "
                "Method is followed only by AUTH or DISCONNECT [MQTT-3.1.2-30]"
            )

    def _on_auth_step(self, step: Step) -> None:
        """Act on an enhanced authentication step, in CONNECT or in a re-authentication."""
        auth = self._auth
        assert auth is not None
        connected = self.state is State.CONNECTED
        if isinstance(step, Continue):  # [MQTT-4.12.0-2], [MQTT-4.12.0-5]
            props = Properties(authentication_method=auth.name, authentication_data=step.data)
            self._write(self.codec.send(Auth(RC.CONTINUE_AUTHENTICATION, props)))
        elif isinstance(step, Success):
            if connected:  # re-authenticated (4.12.1)
                props = Properties(authentication_method=auth.name, authentication_data=step.data)
                self._write(self.codec.send(Auth(RC.SUCCESS, props)))
                return
            packet, self._pending_connect = self._pending_connect, None
            assert packet is not None
            self._final_auth_data = step.data
            self._open_session(packet, step.username)
        elif connected:  # [MQTT-4.12.1-2]; the session stays, as on any close
            self._fail(step.reason_code, step.reason)
        else:  # [MQTT-4.12.0-4]
            self._refuse_connect(step.reason_code, step.reason, step.data)

    def _open_session(self, packet: Connect, username: str | None) -> None:
        """The client is authenticated as `username`: open (or take over) its session."""
        client_id = self.client_id
        props = packet.properties
        if self.edge.access.acl is not None:
            self.acl = self.edge.access.acl.for_client(client_id, username)
        if self.version == V5:
            expiry = props.session_expiry_interval or 0
            self.receive_maximum = props.receive_maximum or 65535
            self._out_aliases = outbound_aliases(
                props.topic_alias_maximum, self.config.max_outbound_topic_aliases
            )
        else:
            expiry = 0 if packet.clean_start else NEVER_EXPIRES
            self.receive_maximum = self.config.max_inflight_v311
        self.connect_expiry = expiry
        self.route = route = self.edge.router.session_route(client_id)
        open_session = pb.OpenSession(
            client_id=client_id,
            connection_id=self.connection_id,
            clean_start=packet.clean_start,
            session_expiry_s=expiry,
            protocol_version=self.version,
            receive_maximum=self.receive_maximum,
            maximum_packet_size=props.maximum_packet_size or 0,
        )
        if packet.will is not None:
            will = packet.will
            fill_message(
                open_session.will.message,
                client_id,
                will.topic,
                will.payload,
                will.qos,
                will.retain,
                will.properties,
            )
            open_session.will.delay_interval_s = will.properties.will_delay_interval or 0
        if self.edge.tracer.enabled:
            self._session_span = self.edge.tracer.start_event(telemetry.SpanName.CONNECT, client_id)
        self.state = State.CONNECTING
        self._pause_reading("connect")
        route.link.request(
            pb.EdgeCommand(
                partition=route.partition, partition_epoch=route.epoch, open_session=open_session
            ),
            self._on_open_result,
        )

    def _grant_keepalive(self, asked: int) -> bool:
        """The Keep Alive this connection runs on, within --max-keepalive: a 5.0 client asking
        for more (or for none) is told the maximum as Server Keep Alive [MQTT-3.2.2-21]; a
        3.1.1 client cannot be told, so it is refused with return code 2, as mosquitto does
        for max_keepalive. False when the CONNECT was refused."""
        limit = self.config.max_keepalive
        self.keepalive = asked
        if not limit or 0 < asked <= limit:
            return True
        if self.version != V5:
            self._refuse_connect(
                RC.CLIENT_IDENTIFIER_NOT_VALID,
                f"keep alive {asked}s is over the maximum of {limit}s (0: none)",
            )
            return False
        self.keepalive = self._server_keep_alive = limit
        return True

    def _on_open_result(self, result: pb.Result) -> None:
        if self.state is not State.CONNECTING:
            if result.status == OK:
                # The client left while its session was being opened: let the session go.
                self._close_session(graceful=False)
            return
        if result.status != OK:
            self._refuse_connect(RC.SERVER_UNAVAILABLE, result.message)  # logs one line
            return
        self.state = State.CONNECTED
        self.stats.connects += 1
        if self._session_span is not None and self._session_span.is_recording():
            self._session_span.set_attribute("hexmq.session_present", result.session_present)
        self._end_session_span(None)
        props = NO_PROPERTIES
        if self.version == V5:
            auth = self._auth
            props = Properties(
                # [MQTT-4.12.0-5]: the method of the CONNECT, and the exchange's final data.
                authentication_method=auth.name if auth is not None else None,
                authentication_data=self._final_auth_data,
                assigned_client_identifier=self._assigned_id,
                server_keep_alive=self._server_keep_alive,
                receive_maximum=self.config.receive_maximum,
                topic_alias_maximum=self.config.topic_alias_maximum,
                # Maximum QoS is left out: QoS 2 is supported (3.2.2.3.4).
                shared_subscription_available=True,
                maximum_packet_size=self.config.max_packet_size,
            )
        self._write(
            self.codec.send(
                ConnAck(session_present=result.session_present, reason_code=0, properties=props)
            )
        )
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.keepalive:
            self._timer = self._loop.call_later(self.keepalive * 1.5, self._on_timer)
        self._resume_reading("connect")
        self._process()

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
        route = self.edge.router.route_publish(packet.topic)
        if route_span is not None:
            tracer.routed(route_span, route)
        retained = self.edge.router.retained_route(packet.topic) if packet.retain else None
        if packet.qos == 0:
            commands = publish_commands(self.client_id, packet, route.targets, retained)
            if span is not None:
                tracer.stamp(span, commands)
            for link, cmd in commands:
                link.send(cmd)
                self._throttle(link)
            if span is not None:
                tracer.finish(span)
            return
        pid = packet.packet_id
        assert pid is not None
        if packet.qos == 2:
            self._on_publish_qos2(packet, pid, route, retained, span)
            return
        if not route.complete:
            self._publish_refused(pid, "a partition node is unavailable", span)
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
        done = self._publish_done(pid, len(commands), span)
        if span is not None:
            tracer.stamp(span, commands)
        for link, cmd in commands:
            link.request(cmd, done)
            self._throttle(link)

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

    # ----- inbound QoS 2 ------------------------------------------------------------------
    #
    # 1. Qos2Receive to the session's partition: is this packet id new? (It records a claim.)
    # 2. NEW: route like QoS 1, then Qos2Routed (recorded as received, durably), then PUBREC.
    #    DUPLICATE: PUBREC at once, nothing routed.
    # 3. PUBREL: Qos2Release (forgotten, durably), then PUBCOMP.
    # See docs/architecture.md (QoS 2) for why the claim comes before the routing.

    def _on_publish_qos2(
        self,
        packet: Publish,
        pid: int,
        route: PublishRoute,
        retained: tuple[PartitionLink, pb.PartitionTarget] | None,
        span: Span | None,
    ) -> None:
        if pid in self._q2_received:
            # Answered before on this connection (MQTT-4.3.3-9): PUBREC again, nothing routed.
            self._write(self.codec.send(PubRec(pid)))
            if span is not None:
                self.edge.tracer.finish(span)
            return
        if pid in self._q2_routing or pid in self._q2_unrecorded:
            if span is not None:
                self.edge.tracer.finish(span, error="duplicate of a publish being stored")
            return  # a resend of the one being stored: its PUBREC follows
        if not route.complete:
            self._publish_refused(pid, "a partition node is unavailable", span, qos=2)
            return
        if not self._count_in():
            return
        self._q2_routing.add(pid)

        def on_claim(result: pb.Result) -> None:
            if result.status != OK:
                self._q2_settled(pid)
                if result.status not in GONE and self.state is State.CONNECTED:
                    self._publish_refused(pid, result.message, span, qos=2)
                elif span is not None:
                    self.edge.tracer.finish(span, error=result.message)
                return
            if result.qos2_state == pb.QOS2_STATE_NEW:
                self._route_qos2(packet, pid, retained, span, result.qos2_origin)
                return
            self._q2_settled(pid)
            if result.qos2_state == pb.QOS2_STATE_DUPLICATE:
                self._q2_pubrec(pid, 0, span)
            elif span is not None:  # IN_PROGRESS: the PUBREC comes from that attempt
                self.edge.tracer.finish(span, error="duplicate of a publish being stored")

        self._session_request(
            pb.EdgeCommand(
                qos2_receive=pb.Qos2Receive(
                    client_id=self.client_id, connection_id=self.connection_id, packet_id=pid
                )
            ),
            on_claim,
        )

    def _route_qos2(
        self,
        packet: Publish,
        pid: int,
        retained: tuple[PartitionLink, pb.PartitionTarget] | None,
        span: Span | None,
        origin: bytes,
    ) -> None:
        """The packet id is claimed: store the message at every target, as for QoS 1, with the
        claim's origin id (targets that stored it in an earlier attempt skip it). This goes on
        (and is reported to the session's partition) even if the client leaves."""
        # Routed now, with shared groups placed by the origin id: a retry of this claim picks
        # the partitions this attempt picks.
        route = self.edge.router.route_publish(packet.topic, origin)
        if not route.targets and retained is None:
            reason = RC.NO_MATCHING_SUBSCRIBERS if self.version == V5 else 0
            self._record_qos2(pid, None, reason, span)
            return
        commands = publish_commands(self.client_id, packet, route.targets, retained)
        routed = carry_origin(origin, commands)
        failures: list[str] = []
        remaining = len(commands)

        def done(result: pb.Result) -> None:
            nonlocal remaining
            remaining -= 1
            if result.status != OK:
                failures.append(result.message)
            if not remaining:
                self._record_qos2(pid, failures[0] if failures else None, 0, span, routed)

        if span is not None:
            self.edge.tracer.stamp(span, commands)
        for link, cmd in fault_stall(self.config.fault_stall_qos2_routing, packet, commands):
            link.request(cmd, done)
            self._throttle(link)

    def _record_qos2(
        self,
        pid: int,
        failure: str | None,
        reason: int,
        span: Span | None,
        routed: RoutedOrigin | None = None,
    ) -> None:
        """Tell the session's partition how the routing ended; PUBREC once it is recorded.
        Once the claim is settled (routed, or dropped) its targets forget its origin id."""
        # A failed routing drops the claim only when a 5.0 PUBREC 0x80 is about to end the
        # exchange (the id is a new message after it, MQTT-4.3.3-9). Otherwise the client
        # resends this same message (3.1.1 is disconnected; a 5.0 client that left heard
        # nothing), and the resend takes the kept claim over and routes with its origin id,
        # so the targets that stored it do not store it twice.
        keep = failure is not None and not (self.version == V5 and self.state is State.CONNECTED)
        forgets = self.edge.qos2_forgets

        def on_result(result: pb.Result) -> None:
            if failure is not None:
                self._q2_settled(pid)
                dropped = result.status == OK and not keep
                if dropped and routed is not None:
                    forgets.forget(routed)
                if self.state is State.CONNECTED:
                    # Not stored everywhere: refused. If the drop of the claim was not
                    # confirmed, no PUBREC 0x80 (which would free the id while the claim and
                    # its origin id may stand): the connection closes and the client resends.
                    self._publish_refused(pid, failure, span, qos=2, close=not dropped)
                elif span is not None:
                    self.edge.tracer.finish(span, error=failure)
                return
            if result.status == UNAVAILABLE and self.state is State.CONNECTED:
                # Stored everywhere but not recorded: say it again once the link is back
                # (reattach), and only then PUBREC.
                self._q2_routing.discard(pid)
                self._q2_unrecorded[pid] = (reason, span, routed)
                return
            self._q2_settled(pid)
            if result.status == OK:
                if routed is not None:
                    forgets.forget(routed)
                self._q2_pubrec(pid, reason, span)
            elif result.status not in GONE and self.state is State.CONNECTED:
                self._close(f"QoS 2 PUBLISH {pid} could not be recorded: {result.message}")
            elif span is not None:
                self.edge.tracer.finish(span, error=result.message)

        self._session_request(
            pb.EdgeCommand(
                qos2_routed=pb.Qos2Routed(
                    client_id=self.client_id,
                    connection_id=self.connection_id,
                    packet_id=pid,
                    ok=failure is None,
                    keep_claim=keep,
                )
            ),
            on_result,
        )

    def _q2_settled(self, pid: int) -> None:
        """The publish is no longer being stored (answered, refused or abandoned)."""
        self._q2_routing.discard(pid)
        self._q2_unrecorded.pop(pid, None)
        self._uncount_in()

    def _q2_pubrec(self, pid: int, reason: int, span: Span | None) -> None:
        if self.state is not State.CONNECTED:
            if span is not None:
                self.edge.tracer.finish(span, error="connection closed before PUBREC")
            return
        self._q2_received.add(pid)
        self._write(self.codec.send(PubRec(pid, reason)))
        if span is not None:
            self.edge.tracer.finish(span, reason_code=reason)

    def _on_pubrel(self, packet: PubRel) -> None:
        pid = packet.packet_id

        def on_result(result: pb.Result) -> None:
            if self.state is not State.CONNECTED:
                return
            if result.status != OK:
                if result.status not in GONE:
                    # Unknown whether it was forgotten: no PUBCOMP (the client would reuse the
                    # packet id while the partition may still hold it); it sends PUBREL again
                    # when it reconnects (MQTT-4.4.0-1).
                    self._close(f"PUBREL {pid} could not be recorded: {result.message}")
                return
            self._q2_received.discard(pid)
            found = result.qos2_state == pb.QOS2_STATE_RELEASED
            reason = RC.PACKET_IDENTIFIER_NOT_FOUND if self.version == V5 and not found else 0
            self._write(self.codec.send(PubComp(pid, reason)))

        self._session_request(
            pb.EdgeCommand(
                qos2_release=pb.Qos2Release(
                    client_id=self.client_id, connection_id=self.connection_id, packet_id=pid
                )
            ),
            on_result,
        )

    # ----- outbound QoS 2 -----------------------------------------------------------------

    def _on_pubrec(self, packet: PubRec) -> None:
        mid = self._q2_out.pop(packet.packet_id, None)
        if mid is None:
            return  # not in flight on this connection (e.g. sent before a re-attach)
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
        failures: list[str] = []
        remaining = parts

        def on_result(result: pb.Result) -> None:
            nonlocal remaining
            remaining -= 1
            if result.status != OK:
                failures.append(result.message)
            if remaining:
                return
            self._uncount_in()
            if self.state is not State.CONNECTED:
                if span is not None:
                    self.edge.tracer.finish(span, error="connection closed before PUBACK")
                return
            if failures:
                self._publish_refused(pid, failures[0], span)
            else:
                self._write(self.codec.send(PubAck(pid)))
                if span is not None:
                    self.edge.tracer.finish(span)

        return on_result

    def _publish_refused(
        self, pid: int, why: str, span: Span | None = None, *, qos: int = 1, close: bool = False
    ) -> None:
        """Never acknowledge what was not stored: 5.0 gets a failing PUBACK (PUBREC for QoS 2,
        which ends that exchange), 3.1.1 (which has none) or `close` loses the connection and
        the client will resend the unacknowledged message."""
        self.stats.refused_publishes += 1
        if span is not None:
            self.edge.tracer.finish(span, reason_code=RC.UNSPECIFIED_ERROR, error=why)
        if self.version == V5 and not close:
            log.warning("%s: PUBLISH %d refused: %s", self.client_id, pid, why)
            ack = PubRec if qos == 2 else PubAck
            props = self._reason(
                lambda p: ack(pid, RC.UNSPECIFIED_ERROR, p), why, problem_information=True
            )
            self._write(self.codec.send(ack(pid, RC.UNSPECIFIED_ERROR, props)))
        else:
            self._close(f"PUBLISH {pid} cannot be stored: {why}")

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

        def on_result(result: pb.Result) -> None:
            if span is not None:
                tracer.finish(span, error=None if result.status == OK else result.message)
            if self.state is not State.CONNECTED:
                return
            granted = iter(result.reason_codes if result.status == OK else [0x80] * len(specs))
            final = [code if code is not None else next(granted) for code in codes]
            self._write(self.codec.send(SubAck(packet.packet_id, tuple(final))))
            if result.status == OK:
                self._send_retained(specs, list(result.reason_codes), list(result.existed))

        if not specs:
            on_result(pb.Result())
            return
        self._session_request(
            pb.EdgeCommand(
                subscribe=pb.Subscribe(
                    client_id=self.client_id, connection_id=self.connection_id, subscriptions=specs
                )
            ),
            on_result,
        )

    def _send_retained(
        self, specs: list[pb.SubscriptionSpec], granted: list[int], existed: list[bool]
    ) -> None:
        """After the SUBACK: the retained messages for the new subscriptions, queued through
        the session's partition like any delivery (MQTT-3.3.1-9)."""
        wanted = retained.wanted(specs, granted, existed)
        if not wanted:
            return

        def queue(messages: list[cpb.Message]) -> None:
            deliveries = retained.deliveries(messages, wanted)
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
        def on_result(result: pb.Result) -> None:
            if self.state is not State.CONNECTED:
                return
            if self.version != V5:
                if result.status != OK:
                    self._close(f"UNSUBSCRIBE failed: {result.message}")
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
            self._write(self.codec.send(Disconnect(reason_code)))
        self._close(None)

    def shutdown(self) -> None:
        """The edge is stopping: tell 5.0 clients (0x8B, or 0x9C Use another server with the
        --server-reference) and close."""
        if self.state is State.CONNECTED and self.version == V5:
            ref = self.config.server_reference
            if ref:
                packet = Disconnect(RC.USE_ANOTHER_SERVER, Properties(server_reference=ref))
            else:
                packet = Disconnect(RC.SERVER_SHUTTING_DOWN)
            self._write(self.codec.send(packet))
        self._close(None)

    def reattach(self) -> None:
        """The session's partition link came back: make this connection its live one again."""
        route = self.route
        if self.state is not State.CONNECTED or route is None:
            return
        # The partition resends everything unacknowledged, under the same packet ids.
        self._inflight_out.clear()
        self._q2_out.clear()
        self._rel_out.clear()
        self._end_deliver_spans("partition link lost before PUBACK")

        def on_result(result: pb.Result) -> None:
            if result.status != OK and self.state is State.CONNECTED:
                log.warning(
                    "%s: session could not be re-attached: %s", self.client_id, result.message
                )
                self.state = State.CLOSED
                if self.version == V5:
                    self._write(
                        self.codec.send(
                            Disconnect(
                                RC.SESSION_TAKEN_OVER
                                if result.status == pb.StatusCode.STATUS_CODE_TAKEN_OVER
                                else RC.UNSPECIFIED_ERROR
                            )
                        )
                    )
                self._close(None)

        route.link.request(
            pb.EdgeCommand(
                partition=route.partition,
                partition_epoch=route.epoch,
                attach_session=pb.AttachSession(
                    client_id=self.client_id,
                    connection_id=self.connection_id,
                    receive_maximum=self.receive_maximum,
                ),
            ),
            on_result,
        )
        # QoS 2 publishes stored everywhere whose routing could not be recorded: now it can.
        unrecorded, self._q2_unrecorded = self._q2_unrecorded, {}
        for pid, (reason, span, routed) in unrecorded.items():
            self._q2_routing.add(pid)
            self._record_qos2(pid, None, reason, span, routed)

    # ----- helpers ----------------------------------------------------------------------

    def _session_request(self, cmd: pb.EdgeCommand, callback: Callable[[pb.Result], None]) -> None:
        route = self.route
        assert route is not None
        cmd.partition = route.partition
        cmd.partition_epoch = route.epoch
        route.link.request(cmd, callback)

    def _close_session(
        self, *, graceful: bool, expiry: int | None = None, send_will: bool = False
    ) -> None:
        route = self.route
        if route is None:
            return
        close = pb.CloseSession(
            client_id=self.client_id,
            connection_id=self.connection_id,
            graceful=graceful,
            send_will=send_will,
        )
        if expiry is not None:
            close.session_expiry_s = expiry
        route.link.send(
            pb.EdgeCommand(
                partition=route.partition, partition_epoch=route.epoch, close_session=close
            )
        )

    def _flush_acks(self) -> None:
        if (self._acks or self._recs) and self.route is not None:
            route = self.route
            acks, self._acks = self._acks, []
            recs, self._recs = self._recs, []
            route.link.send(
                pb.EdgeCommand(
                    partition=route.partition,
                    partition_epoch=route.epoch,
                    delivery_ack=pb.DeliveryAck(
                        client_id=self.client_id,
                        connection_id=self.connection_id,
                        message_ids=acks,
                        received_ids=recs,
                    ),
                ),
                urgent=True,
            )

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

    def _pause_reading(self, why: str) -> None:
        if not self._paused_for and self.transport is not None:
            self.transport.pause_reading()
        self._paused_for.add(why)

    def _resume_reading(self, why: str) -> None:
        if why not in self._paused_for:
            return
        self._paused_for.discard(why)
        if not self._paused_for and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _throttle(self, link: PartitionLink) -> None:
        """Stop reading while `link` has more queued than it can send (backpressure)."""
        if link.congested and "link" not in self._paused_for:
            self._pause_reading("link")
            link.when_drained(lambda: self._resume_reading("link"))

    def _on_timer(self) -> None:
        self._timer = None
        if self.state is State.CLOSED:
            return
        if self.state is State.AUTHENTICATING:
            self._refuse_connect(
                RC.NOT_AUTHORIZED,
                f"authentication not completed within {self.config.connect_timeout:g}s",
            )
            return
        if self.state is not State.CONNECTED:
            self._close(f"no CONNECT within {self.config.connect_timeout:g}s")
            return
        idle = self._loop.time() - self.last_rx
        limit = self.keepalive * 1.5
        if idle >= limit:
            # MQTT-3.1.2-24: 1.5 x keepalive without a packet ends the connection.
            self._fail(
                RC.KEEP_ALIVE_TIMEOUT, f"no packet for {idle:.1f}s (keepalive {self.keepalive}s)"
            )
            return
        self._timer = self._loop.call_later(limit - idle, self._on_timer)

    def _reason(
        self,
        make: Callable[[Properties], Packet],
        why: str,
        *,
        problem_information: bool = False,
        base: Properties = NO_PROPERTIES,
    ) -> Properties:
        """`base` with a Reason String for a 5.0 packet, unless the client asked for none on
        such packets (Request Problem Information 0: MQTT-3.1.2-29) or it would make the packet
        larger than the client's Maximum Packet Size (MQTT-3.2.2-19, 3.4.2-2, 3.14.2-3)."""
        if problem_information and not self.problem_information:
            return base
        props = dataclasses.replace(base, reason_string=why[:200])
        if self.client_max_packet and len(encode(make(props), V5)) > self.client_max_packet:
            return base
        return props

    def _refuse_busy(self, reason: int, why: str) -> None:
        """Refuse a CONNECT because this edge is full or busy: with a --server-reference, a
        5.0 client is sent there (0x9C Use another server, MQTT 5.0 section 4.11)."""
        ref = self.config.server_reference
        if ref and self.version == V5:
            self._refuse_connect(RC.USE_ANOTHER_SERVER, why, server_reference=ref)
        else:
            self._refuse_connect(reason, why)

    def _refuse_connect(
        self,
        reason: int,
        why: str,
        auth_data: bytes | None = None,
        *,
        server_reference: str | None = None,
    ) -> None:
        self._end_session_span(why, reason)
        self.stats.rejected["connect", reason] += 1
        if self.version == V5:
            base = Properties(server_reference=server_reference)
            if auth_data is not None and self._auth is not None:
                # The method's last word (e.g. SCRAM's e=invalid-proof), with its method.
                base = dataclasses.replace(
                    base, authentication_method=self._auth.name, authentication_data=auth_data
                )
            props = self._reason(lambda p: ConnAck(False, reason, p), why, base=base)
            self._write(self.codec.send(ConnAck(False, reason, props)))
        else:
            self._write(self.codec.send(ConnAck(False, v311_return_code(reason))))
        self.state = State.CLOSED
        self._close(f"CONNECT refused (0x{reason:02X}): {why}")

    def _fail(self, reason: int, why: str) -> None:
        """End the connection for a protocol violation: 5.0 gets DISCONNECT with the reason."""
        self.stats.rejected["disconnect", reason] += 1
        name = reason_name(reason)
        log.warning(
            "closing %s (%s): %s (0x%02X): %s", self.peer, self.client_id or "-", name, reason, why
        )
        if self.state is State.CONNECTED:
            self._close_session(graceful=False)
            if self.version == V5:
                self._write(
                    self.codec.send(
                        Disconnect(reason, self._reason(lambda p: Disconnect(reason, p), why))
                    )
                )
        self.state = State.CLOSED
        self._close(None)

    def _on_protocol_error(self, exc: MQTTError) -> None:
        if self.state in (State.AWAITING_CONNECT, State.AUTHENTICATING, State.CONNECTING):
            self.stats.rejected["connect", exc.reason_code] += 1
            log.warning(
                "closing %s: bad CONNECT: %s (0x%02X): %s",
                self.peer,
                reason_name(exc.reason_code),
                exc.reason_code,
                exc.message,
            )
            if isinstance(exc, UnsupportedProtocolVersion):
                # 3.1.1 clients (and older) understand return code 0x01 [MQTT-3.1.2-2]; a newer
                # level gets the 5.0 form of 0x84.
                if (exc.protocol_level or 0) > V5:
                    self._write(encode(ConnAck(False, RC.UNSUPPORTED_PROTOCOL_VERSION), V5))
                else:
                    self._write(
                        encode(ConnAck(False, ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION), 4)
                    )
            elif self.codec.protocol_version == V5:
                self.version = V5
                self._write(self.codec.send(ConnAck(False, exc.reason_code)))
            self.state = State.CLOSED
            self._close(None)
            return
        self._fail(exc.reason_code, exc.message)

    def _close(self, why: str | None) -> None:
        if why is not None:
            log.warning("closing %s (%s): %s", self.peer, self.client_id or "-", why)
        if self.state is State.CONNECTED:
            self._close_session(graceful=False)
        self.state = State.CLOSED
        self._flush_out()
        if self.transport is not None:
            self.transport.close()

    def _end_deliver_spans(self, why: str) -> None:
        for span in self._deliver_spans.values():
            span.set_status(Status(StatusCode.ERROR, why))
            span.end()
        self._deliver_spans.clear()

    def _end_session_span(self, error: str | None, reason_code: int = 0) -> None:
        span, self._session_span = self._session_span, None
        if span is not None:
            self.edge.tracer.finish(span, reason_code=reason_code, error=error)
