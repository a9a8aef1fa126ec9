"""SessionState: one MQTT client's session at the edge, and the plumbing every handler uses.

What the session holds, set up in one place (`__slots__`; what only some connections need is
made when first needed), and how it speaks: bytes for the client (`write`), actions for the
adapter (`emit`), commands whose answers come back by token (`ask`, `request`), Reason Strings
sized for the client, and the ways a connection ends. The packet handlers
(services/edge/session/handle_*.py) and the Session's inputs (services/edge/session/core.py)
work on this state. No asyncio, no gRPC, no clock: time comes in with the inputs.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    NO_PROPERTIES,
    ConnAck,
    Connect,
    Disconnect,
    MQTTConnection,
    Packet,
    Properties,
    Role,
    encode,
)
from hexmq.mqtt.reason_codes import ReasonCode
from services.edge.limits import Admission
from services.edge.session.actions import (
    Action,
    Close,
    Pause,
    PauseReading,
    Request,
    ResumeReading,
    Withdraw,
    Write,
)
from services.edge.session.keepalive import Keepalive
from services.edge.translate import reason_name

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from services.edge.acl import ClientAcl
    from services.edge.enhanced_auth import ConnectionAuth
    from services.edge.session.environment import EdgeServices
    from services.edge.session.inbound import Qos2Claims
    from services.edge.session.outbound import Outbound
    from services.edge.session.window import InflightWindow
    from services.edge.tickets import Route
    from services.edge.topic_alias import InboundTopicAliases, OutboundTopicAliases

log = logging.getLogger("hexmq.edge.connection")

RC = ReasonCode
OK = pb.StatusCode.STATUS_CODE_OK
UNAVAILABLE = pb.StatusCode.STATUS_CODE_UNAVAILABLE
# Answers meaning that this connection no longer holds its session (it is being closed).
GONE = (pb.StatusCode.STATUS_CODE_TAKEN_OVER, pb.StatusCode.STATUS_CODE_NOT_FOUND)
V5 = 5


class State(enum.Enum):
    AWAITING_CONNECT = 1
    AUTHENTICATING = 5  # CONNECT named an Authentication Method: AUTH exchange before CONNACK
    CONNECTING = 2  # CONNECT sent to the session's partition, waiting for its answer
    CONNECTED = 3
    CLOSED = 4


# The states as module constants for the per-message paths: reading an enum member off its
# class is a Python-level lookup, several times a global's cost.
AWAITING_CONNECT = State.AWAITING_CONNECT
AUTHENTICATING = State.AUTHENTICATING
CONNECTING = State.CONNECTING
CONNECTED = State.CONNECTED
CLOSED = State.CLOSED


class SessionState:
    """One client connection's session: see the module docstring."""

    __slots__ = (
        "acl",
        "actions",
        "admission",
        "assigned_id",
        "attach_again",
        "attached",
        "attaching",
        "auth",
        "claims",
        "client_id",
        "client_max_packet",
        "codec",
        "config",
        "connect_expiry",
        "connection_id",
        "deliver_spans",
        "edge",
        "final_auth_data",
        "granted_expiry",
        "in_aliases",
        "inbound",
        "keepalive",
        "next_token",
        "open_deadline",
        "out",
        "out_aliases",
        "outbound",
        "partition",
        "paused",
        "peer",
        "pending_connect",
        "problem_information",
        "receive_maximum",
        "rx_wall_ms",
        "session_span",
        "state",
        "version",
        "waiting",
    )

    def __init__(self, edge: EdgeServices, connection_id: str) -> None:
        config = edge.config
        self.edge = edge
        self.config = config
        self.codec = MQTTConnection(Role.SERVER, max_packet_size=config.max_packet_size)
        self.connection_id = connection_id
        # The client's address (HOST:PORT), and whether this edge has room for it: set when
        # its socket opens (Session.start).
        self.peer = "?"
        self.admission = Admission.ADMITTED
        self.state = State.AWAITING_CONNECT
        self.client_id = ""
        self.version = 4
        # The session's partition (set when the session is opened), and the route it was last
        # opened or re-attached through: a re-attach is owed when the partition's is another.
        self.partition: int | None = None
        self.attached: Route | None = None
        # When the CONNECT's OpenSession, on its way, is given up (0.0: none on its way).
        self.open_deadline = 0.0
        # The token of the AttachSession on its way (0: none), and whether another is owed.
        self.attaching = 0
        self.attach_again = False
        self.keepalive = Keepalive()
        # The wall clock (ms) of the last read: a message's publish time.
        self.rx_wall_ms = 0
        # 5.0 Request Problem Information: False means no Reason String on acknowledgements.
        self.problem_information = True
        # The Session Expiry Interval the client connected with (5.0).
        self.connect_expiry = 0
        # A 5.0 client's Session Expiry Interval lowered to --max-session-expiry (CONNACK).
        self.granted_expiry: int | None = None
        # The client's Receive Maximum (3.1.1: --max-inflight-v311), and its Maximum Packet
        # Size (0: no limit).
        self.receive_maximum = 0
        self.client_max_packet = 0
        # Topic aliases (5.0), of this connection only: the client's (made at its first
        # alias) and ours for deliveries (None when the client or the edge wants none).
        self.in_aliases: InboundTopicAliases | None = None
        self.out_aliases: OutboundTopicAliases | None = None
        # Publishes being stored (our Receive Maximum), inbound QoS 2 packet ids, and the
        # deliveries in flight to the client: made at the first QoS 1/2 publish or delivery.
        self.inbound: InflightWindow | None = None
        self.claims: Qos2Claims | None = None
        self.outbound: Outbound | None = None
        # Why the session wants reading paused, Pause bits (the adapter adds its own reasons).
        self.paused = 0
        self.assigned_id: str | None = None
        # What this client may publish and receive (None: no ACL file, everything).
        self.acl: ClientAcl | None = None
        # Enhanced authentication (5.0, CONNECT with an Authentication Method), the CONNECT
        # waiting for its exchange to end, and the exchange's final data for the CONNACK.
        self.auth: ConnectionAuth | None = None
        self.pending_connect: Connect | None = None
        self.final_auth_data: bytes | None = None
        # Traced deliveries awaiting the client's acknowledgement, by packet id; the CONNECT's.
        self.deliver_spans: dict[int, Span] | None = None
        self.session_span: Span | None = None
        # Commands whose answers are awaited: token -> what to do with the answer.
        self.waiting: dict[int, Callable[..., None]] | None = None
        self.next_token = 1
        # Output of the input being handled: actions, and bytes not yet in a Write.
        self.actions: list[Action] | None = None
        self.out: list[bytes] | None = None

    # ----- output ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        out = self.out
        if out is None:
            self.out = [data]
        else:
            out.append(data)

    def send(self, packet: Packet) -> bool:
        """Write `packet`; False when it was not, being over the client's Maximum Packet Size
        (MQTT-3.1.2-24: never sent; its optional parts, the Reason String, were left out
        before, by `reason`). A CONNACK or DISCONNECT over it is left to its caller, which
        closes anyway; any other packet ends the connection here (DISCONNECT 0x95 Packet too
        large, itself only if it fits)."""
        data = self.codec.send(packet)
        limit = self.client_max_packet
        if limit and len(data) > limit:
            if not isinstance(packet, ConnAck | Disconnect):
                self.fail(
                    RC.PACKET_TOO_LARGE,
                    f"a {type(packet).__name__} of {len(data)} bytes is over the client's "
                    f"Maximum Packet Size of {limit}",
                )
            return False
        out = self.out
        if out is None:
            self.out = [data]
        else:
            out.append(data)
        return True

    def emit(self, action: Action) -> None:
        if self.out:
            self._written()
        actions = self.actions
        if actions is None:
            self.actions = [action]
        else:
            actions.append(action)

    def _written(self) -> None:
        out = self.out
        assert out
        self.out = None
        data = out[0] if len(out) == 1 else b"".join(out)
        if self.actions is None:
            self.actions = [Write(data)]
        else:
            self.actions.append(Write(data))

    def take(self) -> list[Action]:
        """Everything decided since the last call, in order."""
        out = self.out
        actions = self.actions
        if out is not None:
            self.out = None
            write = Write(out[0] if len(out) == 1 else b"".join(out))
            if actions is None:
                return [write]
            actions.append(write)
        elif actions is None:
            return []
        self.actions = None
        return actions

    @property
    def out_bytes(self) -> int:
        """Bytes written by the input being handled and not yet taken."""
        return sum(map(len, self.out)) if self.out else 0

    # ----- commands -------------------------------------------------------------------------

    def ask(self, on_answer: Callable[..., None]) -> int:
        """A new token, whose answer goes to `on_answer`."""
        token = self.next_token
        self.next_token = token + 1
        waiting = self.waiting
        if waiting is None:
            self.waiting = {token: on_answer}
        else:
            waiting[token] = on_answer
        return token

    def new_token(self) -> int:
        """A token whose answer is not awaited (a DeliveryAck's: see Outbound)."""
        token = self.next_token
        self.next_token = token + 1
        return token

    def request(self, command: pb.EdgeCommand, on_result: Callable[[pb.Result], None]) -> None:
        """A command for the session's partition; `on_result(result)` hears its answer."""
        partition = self.partition
        assert partition is not None
        self.emit(Request(self.ask(lambda result, _route: on_result(result)), partition, command))

    def close_session(
        self, *, graceful: bool, expiry: int | None = None, send_will: bool = False
    ) -> None:
        partition = self.partition
        if partition is None:
            return
        close = pb.CloseSession(
            client_id=self.client_id,
            connection_id=self.connection_id,
            graceful=graceful,
            send_will=send_will,
        )
        if expiry is not None:
            close.session_expiry_s = expiry
        # A request (its answer unneeded): sent again if its link breaks first.
        self.request_ignored(pb.EdgeCommand(close_session=close))

    def request_ignored(self, command: pb.EdgeCommand) -> None:
        """A command for the session's partition whose answer nobody needs, but which must
        reach it (sent again if its link breaks first)."""
        partition = self.partition
        assert partition is not None
        self.emit(Request(0, partition, command))

    # ----- reading --------------------------------------------------------------------------

    def pause(self, why: Pause) -> None:
        if not self.paused & why:
            self.paused |= why
            self.emit(PauseReading(why))

    def resume(self, why: Pause) -> None:
        if self.paused & why:
            self.paused &= ~why
            self.emit(ResumeReading(why))

    # ----- answers to the client (a refused publish: services/edge/session/refusals.py) -----

    def reason(
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

    # ----- ends -----------------------------------------------------------------------------

    def fail(self, reason: int, why: str) -> None:
        """End the connection for a protocol violation: 5.0 gets DISCONNECT with the reason."""
        self.edge.stats.rejected["disconnect", reason] += 1
        log.warning(
            "closing %s (%s): %s (0x%02X): %s",
            self.peer,
            self.client_id or "-",
            reason_name(reason),
            reason,
            why,
        )
        connected = self.state is State.CONNECTED
        if connected:
            self.close_session(graceful=False)
        self.withdraw_open()
        if connected:
            self.disconnect(reason, why)
        else:  # (before its CONNACK a client gets no DISCONNECT: a close)
            self.state = State.CLOSED
            self.emit(Close(reason, why))

    def disconnect(
        self,
        reason: int,
        reason_string: str | None,
        *,
        base: Properties = NO_PROPERTIES,
        why: str | None = None,
    ) -> None:
        """End a connected client's connection with `reason`: the one way every DISCONNECT
        the server sends goes (the caller has settled the session). 5.0: DISCONNECT with
        `base` and `reason_string` as its Reason String where it fits (MQTT-3.14.2-3), or no
        DISCONNECT if even that is over the client's Maximum Packet Size (MQTT-3.1.2-24);
        then a Close that lingers (Close.linger), so that the DISCONNECT reaches a client still
        sending instead of being lost to a reset. 3.1.1, which has no server DISCONNECT: a
        close. `why`: what the log says (the Reason String unless given)."""
        sent = False
        if self.version == V5:
            props = base
            if reason_string is not None:
                props = self.reason(lambda p: Disconnect(reason, p), reason_string, base=base)
            sent = self.send(Disconnect(reason, props))
        self.state = State.CLOSED
        logged = (reason_string or "") if why is None else why
        self.emit(Close(reason, logged, linger=sent))

    def close(
        self, why: str | None, *, quiet: bool = False, reason_code: int = 0, linger: bool = False
    ) -> None:
        """Close the connection; `why` is logged (at DEBUG when `quiet`: a refusal of a command
        held past the failover bound, which is logged once per partition and burst). `linger`:
        a refusal (CONNACK) was written, to reach a client still sending (Close.linger)."""
        if why is not None:
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "closing %s (%s): %s",
                self.peer,
                self.client_id or "-",
                why,
            )
        if self.state is State.CONNECTED:
            self.close_session(graceful=False)
        self.withdraw_open()
        self.state = State.CLOSED
        self.emit(Close(reason_code, why or "", linger=linger))

    def withdraw_open(self) -> None:
        """The connection ends before its OpenSession was answered: take it back, so that it
        is never sent again (a resend after a heal took the session from the client's newer
        connection elsewhere: fault seed 3032). An answer already on its way still comes: an
        OK lets the session go (handle_connect.session_opened)."""
        if self.open_deadline:
            self.open_deadline = 0.0
            self.emit(Withdraw())

    def end_unacknowledged_deliveries(self) -> None:
        """The connection closed with these deliveries written and not acknowledged."""
        spans, self.deliver_spans = self.deliver_spans, None
        if spans:
            tracer = self.edge.tracer
            for span in spans.values():
                tracer.unacknowledged(span)

    def end_session_span(self, error: str | None, reason_code: int = 0) -> None:
        span, self.session_span = self.session_span, None
        if span is not None:
            self.edge.tracer.finish(span, reason_code=reason_code, error=error)
