"""CONNECT, up to its CONNACK, and AUTH (enhanced authentication, also re-authentication).

Checks and refusals (authentication method, connection limits and rate, client id, Keep Alive,
the will's topic), the wait for the session's partition, enhanced authentication (AUTH
exchanges), opening the session at its partition, and the CONNACK.
"""

from __future__ import annotations

import dataclasses

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import NO_PROPERTIES, Auth, ConnAck, Connect, Disconnect, Packet, Properties
from hexmq.mqtt import ProtocolError as MQTTProtocolError
from services.edge.enhanced_auth import AuthMethod, ConnectionAuth, Continue, Step, Success
from services.edge.limits import Admission
from services.edge.session.actions import Gate, Open, Pause, SetTimer
from services.edge.session.delivery import reattach
from services.edge.session.state import OK, RC, V5, SessionState, State
from services.edge.tickets import Route, refused_by_hold
from services.edge.topic_alias import outbound_aliases
from services.edge.translate import fill_message, v311_return_code

NEVER_EXPIRES = 0xFFFFFFFF


def handle_connect(s: SessionState, packet: Connect, now: float, wall_ms: int) -> None:
    s.version = packet.protocol_version
    props = packet.properties
    edge = s.edge
    method_name = None
    if s.version == V5:
        # Known before CONNACK: they shape the AUTH packets and refusals too.
        s.problem_information = props.request_problem_information is not False
        s.client_max_packet = props.maximum_packet_size or 0
        method_name = props.authentication_method
    method = None
    if method_name is not None:
        method = edge.access.methods.get(method_name)
        if method is None:  # [MQTT-4.12.0-1]
            refuse_connect(
                s, RC.BAD_AUTHENTICATION_METHOD, edge.access.methods.why_refused(method_name)
            )
            return
    if s.admission is not Admission.ADMITTED:
        refuse_busy(s, RC.QUOTA_EXCEEDED, f"over {edge.limit.maximum} connections")
        return
    rate = edge.connect_rate
    if rate is not None and not rate.allow(now):
        refuse_busy(
            s, RC.CONNECTION_RATE_EXCEEDED, f"over {rate.per_second:g} new connections a second"
        )
        return
    client_id = packet.client_id
    assigned = None
    if not client_id:
        if s.version != V5 and not packet.clean_start:
            # MQTT-3.1.3-8: an empty id needs clean session 1 in 3.1.1.
            refuse_connect(
                s, RC.CLIENT_IDENTIFIER_NOT_VALID, "empty client id with clean session 0"
            )
            return
        client_id = assigned = edge.assign_client_id()
    s.client_id = client_id
    s.assigned_id = assigned
    limit = s.config.max_keepalive
    if not s.keepalive.grant(packet.keepalive, limit, s.version == V5):
        # A 3.1.1 client cannot be told a Server Keep Alive: refused with return code 2, as
        # mosquitto does for max_keepalive.
        refuse_connect(
            s,
            RC.CLIENT_IDENTIFIER_NOT_VALID,
            f"keep alive {packet.keepalive}s is over the maximum of {limit}s (0: none)",
        )
        return
    if packet.will is not None:
        over, will_refusal = s.config.topic_limits.which(packet.will.topic)
        if will_refusal is not None:
            edge.stats.limited[over] += 1
            refuse_connect(s, RC.TOPIC_NAME_INVALID, f"will {will_refusal}")
            return
    p = edge.router.session_partition(client_id)
    if not edge.partition_open(p):
        # The session's partition cannot take its OpenSession now (no master in the view,
        # its link down): wait in turn with its held commands, within the failover bound.
        # Before the credentials, so that a refusal for them also shows that this edge
        # reaches the session's node (what `hexmq cluster up` probes with an anonymous
        # CONNECT when a password file is set).
        s.state = State.CONNECTING
        s.pause(Pause.CONNECT)
        token = s.ask(lambda result, _route: partition_opened(s, packet, method, result, wall_ms))
        s.emit(Gate(token, p))
        return
    authenticate(s, packet, method, wall_ms)


def partition_opened(
    s: SessionState, packet: Connect, method: AuthMethod | None, result: pb.Result, wall_ms: int
) -> None:
    """The CONNECT waited for its session's partition (`handle_connect`)."""
    if s.state is not State.CONNECTING:
        return  # the client left meanwhile
    if result.status != OK:
        refuse_connect(s, RC.SERVER_UNAVAILABLE, result.message, quiet=True)
        return
    s.state = State.AWAITING_CONNECT
    s.resume(Pause.CONNECT)
    authenticate(s, packet, method, wall_ms)


def authenticate(s: SessionState, packet: Connect, method: AuthMethod | None, wall_ms: int) -> None:
    if method is not None:
        # The method decides who the client is; CONNECT's User Name and Password are not
        # checked. Only AUTH (or DISCONNECT) may come until CONNACK [MQTT-3.1.2-30].
        s.auth = ConnectionAuth(method, client_id=s.client_id, peer=s.peer)
        s.pending_connect = packet
        s.state = State.AUTHENTICATING
        auth_step(s, s.auth.start(packet.properties.authentication_data), wall_ms)
        return
    reason, why = s.edge.access.authenticate(packet.username, packet.password)
    if reason:
        refuse_connect(s, reason, why)
        return
    open_session(s, packet, packet.username, wall_ms)


def handle_authenticating(s: SessionState, packet: Packet, now: float, wall_ms: int) -> None:
    """What a client may send while its CONNECT's exchange runs: AUTH or DISCONNECT."""
    if isinstance(packet, Auth):
        assert s.auth is not None
        auth_step(s, s.auth.receive(packet, connected=False), wall_ms)
    elif isinstance(packet, Disconnect):
        s.close(None)  # the client gave up; there is no session yet
    else:
        raise MQTTProtocolError(
            f"{type(packet).__name__} before CONNACK; a CONNECT with an Authentication "
            "Method is followed only by AUTH or DISCONNECT [MQTT-3.1.2-30]"
        )


def handle_auth(s: SessionState, packet: Auth, now: float, wall_ms: int) -> None:
    """AUTH once connected: a re-authentication (4.12.1); the codec refuses AUTH after a
    CONNECT without a method [MQTT-4.12.0-7]."""
    if s.auth is None:
        s.fail(RC.PROTOCOL_ERROR, "unexpected Auth")
        return
    auth_step(s, s.auth.receive(packet, connected=True), wall_ms)


def auth_step(s: SessionState, step: Step, wall_ms: int) -> None:
    """Act on an enhanced authentication step, in CONNECT or in a re-authentication."""
    auth = s.auth
    assert auth is not None
    connected = s.state is State.CONNECTED
    if isinstance(step, Continue):  # [MQTT-4.12.0-2], [MQTT-4.12.0-5]
        props = Properties(authentication_method=auth.name, authentication_data=step.data)
        s.send(Auth(RC.CONTINUE_AUTHENTICATION, props))
    elif isinstance(step, Success):
        if connected:  # re-authenticated (4.12.1)
            props = Properties(authentication_method=auth.name, authentication_data=step.data)
            s.send(Auth(RC.SUCCESS, props))
            return
        packet, s.pending_connect = s.pending_connect, None
        assert packet is not None
        s.final_auth_data = step.data
        open_session(s, packet, step.username, wall_ms)
    elif connected:  # [MQTT-4.12.1-2]; the session stays, as on any close
        s.fail(step.reason_code, step.reason)
    else:  # [MQTT-4.12.0-4]
        refuse_connect(s, step.reason_code, step.reason, step.data)


def open_session(s: SessionState, packet: Connect, username: str | None, wall_ms: int) -> None:
    """The client is authenticated as `username`: open (or take over) its session."""
    edge = s.edge
    access = edge.access
    config = s.config
    rules = access.client_ids
    if rules.active:
        # Bound to the user before anything is keyed by it (issue 25: one user must not
        # resume another's session).
        bound, why = rules.client_id(s.client_id, username)
        if bound is None:
            edge.stats.limited["client_id"] += 1
            if username is None and rules.use_username:
                refuse_connect(s, RC.NOT_AUTHORIZED, why)
            else:
                refuse_connect(s, RC.CLIENT_IDENTIFIER_NOT_VALID, why)
            return
        if bound != s.client_id:
            s.client_id = bound
            if s.assigned_id is not None:
                s.assigned_id = bound  # an empty id gets the user's, and is told so
    client_id = s.client_id
    props = packet.properties
    will = packet.will
    if will is not None:
        # A will is a PUBLISH of its client: $SYS/ and the ACL's write rule apply now, and
        # again when it is published (services/edge/handoff.py).
        denied = access.may_publish_will(client_id, username, will.topic)
        if denied is not None:
            edge.stats.limited["will_acl"] += 1
            refuse_connect(s, RC.NOT_AUTHORIZED, f"will topic {will.topic!r}: {denied}")
            return
    s.acl = access.client_acl(client_id, username)
    if s.version == V5:
        asked = props.session_expiry_interval or 0
        receive_maximum = props.receive_maximum or 65535
        if receive_maximum > config.max_inflight:
            # MQTT 5.0 lets the server send fewer than the client's Receive Maximum (counted
            # when the client announced one: most leave it out, meaning 65535).
            if props.receive_maximum is not None:
                edge.stats.limited["inflight"] += 1
            receive_maximum = config.max_inflight
        s.receive_maximum = receive_maximum
        s.out_aliases = outbound_aliases(
            props.topic_alias_maximum, config.max_outbound_topic_aliases
        )
    else:
        asked = 0 if packet.clean_start else NEVER_EXPIRES
        s.receive_maximum = config.max_inflight_v311
    expiry = min(asked, config.max_session_expiry)
    if expiry != asked:
        edge.stats.limited["session_expiry"] += 1
        s.granted_expiry = expiry  # 5.0: told in CONNACK (3.2.2.3.2)
    s.connect_expiry = expiry
    p = s.partition = edge.router.session_partition(client_id)
    open_cmd = pb.OpenSession(
        client_id=client_id,
        connection_id=s.connection_id,
        clean_start=packet.clean_start,
        session_expiry_s=expiry,
        protocol_version=s.version,
        receive_maximum=s.receive_maximum,
        maximum_packet_size=props.maximum_packet_size or 0,
    )
    if will is not None:
        fill_message(
            open_cmd.will.message,
            client_id,
            will.topic,
            will.payload,
            will.qos,
            will.retain,
            will.properties,
            wall_ms,
        )
        open_cmd.will.delay_interval_s = will.properties.will_delay_interval or 0
        # Its owner, for the ACL check when it is published (the ACL may change meanwhile).
        open_cmd.will.owner_recorded = True
        if username is not None:
            open_cmd.will.username = username
    if edge.tracer.enabled:
        s.session_span = edge.tracer.start_connect(client_id, s.peer)
    s.state = State.CONNECTING
    s.pause(Pause.CONNECT)
    token = s.ask(lambda result, route: session_opened(s, result, route))
    s.emit(Open(token, p, pb.EdgeCommand(open_session=open_cmd)))
    # CONNACK within --failover-hold of the client's last packet (its CONNECT, or its last
    # AUTH): a master that took the OpenSession may be cut off from its followers, unable
    # to answer until a heal deposes it (Session.tick refuses the CONNECT then).
    s.open_deadline = s.keepalive.last_rx + s.config.failover_hold
    s.emit(SetTimer(s.open_deadline))


def session_opened(s: SessionState, result: pb.Result, route: Route | None) -> None:
    """The OpenSession's answer: CONNACK (or a refusal), then what the client sent meanwhile."""
    s.open_deadline = 0.0
    if s.state is not State.CONNECTING:
        if result.status == OK:
            # The client left while its session was being opened: let the session go.
            s.close_session(graceful=False)
        return
    if result.status != OK:
        # Logs one line (a refusal past the failover bound: only at DEBUG).
        refuse_connect(s, RC.SERVER_UNAVAILABLE, result.message, quiet=refused_by_hold(result))
        return
    edge = s.edge
    s.attached = route
    s.state = State.CONNECTED
    edge.stats.connects += 1
    span = s.session_span
    if span is not None and span.is_recording():
        span.set_attribute("hexmq.session_present", result.session_present)
    s.end_session_span(None)
    props = NO_PROPERTIES
    if s.version == V5:
        auth = s.auth
        config = s.config
        props = Properties(
            # [MQTT-4.12.0-5]: the method of the CONNECT, and the exchange's final data.
            authentication_method=auth.name if auth is not None else None,
            authentication_data=s.final_auth_data,
            assigned_client_identifier=s.assigned_id,
            session_expiry_interval=s.granted_expiry,
            server_keep_alive=s.keepalive.server_keep_alive,
            receive_maximum=config.receive_maximum,
            topic_alias_maximum=config.topic_alias_maximum,
            # Maximum QoS is left out: QoS 2 is supported (3.2.2.3.4).
            shared_subscription_available=True,
            maximum_packet_size=config.max_packet_size,
        )
    s.final_auth_data = None
    if not s.send(ConnAck(result.session_present, RC.SUCCESS, props)):
        # Over the client's Maximum Packet Size (it has no Reason String or User Property
        # to leave out): never sent (MQTT-3.1.2-24), and the client cannot be connected
        # without it; nor told so (no DISCONNECT before CONNACK). The session stays, as
        # for a connection lost.
        s.close(f"the CONNACK is over the client's Maximum Packet Size of {s.client_max_packet}")
        return
    s.emit(SetTimer(s.keepalive.first_deadline()))
    s.resume(Pause.CONNECT)
    p = s.partition
    assert p is not None
    if edge.partition_route(p) != s.attached:
        reattach(s)  # the partition moved while the session was being opened


def refuse_busy(s: SessionState, reason: int, why: str) -> None:
    """Refuse a CONNECT because this edge is full or busy: with a --server-reference, a 5.0
    client is sent there (0x9C Use another server, MQTT 5.0 section 4.11)."""
    ref = s.config.server_reference
    # An edge over its limits sheds the connection at once, without lingering over it.
    if ref and s.version == V5:
        refuse_connect(s, RC.USE_ANOTHER_SERVER, why, server_reference=ref, linger=False)
    else:
        refuse_connect(s, reason, why, linger=False)


def refuse_connect(
    s: SessionState,
    reason: int,
    why: str,
    auth_data: bytes | None = None,
    *,
    server_reference: str | None = None,
    quiet: bool = False,
    linger: bool = True,
) -> None:
    """Answer a CONNECT with a refusal and close. The close lingers (Close.linger: half-close,
    drain up to LINGER_S), as after a DISCONNECT, so that the CONNACK reaches a client that
    sent more after its CONNECT instead of being lost to a reset; `linger` False for an edge
    over its limits, which sheds connections at once."""
    s.end_session_span(why, reason)
    s.edge.stats.rejected["connect", reason] += 1
    if s.version == V5:
        base = Properties(server_reference=server_reference)
        if auth_data is not None and s.auth is not None:
            # The method's last word (e.g. SCRAM's e=invalid-proof), with its method.
            base = dataclasses.replace(
                base, authentication_method=s.auth.name, authentication_data=auth_data
            )
        props = s.reason(lambda p: ConnAck(False, reason, p), why, base=base)
        sent = s.send(ConnAck(False, reason, props))
    else:
        sent = s.send(ConnAck(False, v311_return_code(reason)))
    s.state = State.CLOSED
    s.close(
        f"CONNECT refused (0x{reason:02X}): {why}",
        quiet=quiet,
        reason_code=reason,
        linger=linger and sent,
    )
