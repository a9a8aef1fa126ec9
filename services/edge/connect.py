"""ConnectHandling: a client's CONNECT, up to its CONNACK.

Checks and refusals (authentication method, connection limits and rate, client id, Keep Alive,
the will's topic, the session's node), enhanced authentication (AUTH exchanges, also
re-authentication once connected), opening the session at its partition, and the timer that
ends a connection that does not connect in time or then goes quiet (Keep Alive).
"""

from __future__ import annotations

import dataclasses
import uuid

from hexmq import telemetry
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    Properties,
    ProtocolError,
)
from services.edge.connection_base import OK, RC, V5, ConnectionBase, State
from services.edge.dispatch import SessionRoute
from services.edge.enhanced_auth import AuthMethod, ConnectionAuth, Continue, Step, Success
from services.edge.limits import Admission
from services.edge.tickets import refused_by_hold
from services.edge.topic_alias import outbound_aliases
from services.edge.translate import fill_message, v311_return_code

NEVER_EXPIRES = 0xFFFFFFFF


class ConnectHandling(ConnectionBase):
    """The CONNECT part of ClientConnection (a mixin over ConnectionBase)."""

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
        p = self.edge.router.session_partition(client_id)
        if not self.edge.dispatcher.open(p):
            # The session's partition cannot take its OpenSession now (no master in the view,
            # its link down): wait in turn with its held commands, within the failover bound.
            # Before the credentials, so that a refusal for them also shows that this edge
            # reaches the session's node (what `hexmq cluster up` probes with an anonymous
            # CONNECT when a password file is set).
            self.state = State.CONNECTING
            self._pause_reading("connect")
            self.edge.dispatcher.gate(
                p, lambda result: self._on_partition_open(packet, method, result)
            )
            return
        self._authenticate(packet, method)

    def _on_partition_open(
        self, packet: Connect, method: AuthMethod | None, result: pb.Result
    ) -> None:
        """The CONNECT waited for its session's partition (`_on_connect`)."""
        if self.state is not State.CONNECTING:
            return  # the client left meanwhile
        if result.status != OK:
            self._refuse_connect(RC.SERVER_UNAVAILABLE, result.message, quiet=True)
            return
        self.state = State.AWAITING_CONNECT
        self._resume_reading("connect")
        self._authenticate(packet, method)
        if self.state is State.AUTHENTICATING:
            self._process()  # AUTH packets that came meanwhile

    def _authenticate(self, packet: Connect, method: AuthMethod | None) -> None:
        client_id = self.client_id
        props = packet.properties
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
        p = self.edge.router.session_partition(client_id)
        self.route = route = SessionRoute(p, self.edge.dispatcher)
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
            self._session_span = self.edge.tracer.start_event(
                telemetry.SpanName.CONNECT, client_id, self.peer
            )
        self.state = State.CONNECTING
        self._pause_reading("connect")
        self._open_ticket = route.request(
            pb.EdgeCommand(open_session=open_session), self._on_open_result
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
            # Logs one line (a refusal past the failover bound: only at DEBUG).
            self._refuse_connect(
                RC.SERVER_UNAVAILABLE, result.message, quiet=refused_by_hold(result)
            )
            return
        ticket, self._open_ticket = self._open_ticket, None
        self.attached = ticket.sent_to if ticket is not None else None
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
        route = self.route
        if route is not None and self.edge.dispatcher.route(route.partition) != self.attached:
            # The partition moved while the session was being opened.
            self.reattach()
        self._process()

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
        if self.state is State.CONNECTING:
            # The session is being opened (or waits for its partition's master): answered
            # within the failover bound, by CONNACK either way.
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
        quiet: bool = False,
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
        self._close(f"CONNECT refused (0x{reason:02X}): {why}", quiet=quiet)
