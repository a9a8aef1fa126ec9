"""ConnectionBase: what every part of a ClientConnection shares.

The connection's state (all of it, set up in one place), and the plumbing every part uses:
requests to the session's partition, reading paused and resumed, Reason Strings, and the ways a
connection ends (protocol errors, failures, closes). ClientConnection (services/edge/connection.py)
adds the packet dispatch and the hot path; services/edge/connect.py, inbound_qos2.py and
subscriptions.py hold the other packet handlers, as mixins over this class.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry.trace import Span, Status, StatusCode

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    NO_PROPERTIES,
    ConnAck,
    Connect,
    Disconnect,
    MQTTConnection,
    MQTTError,
    Packet,
    Properties,
    Role,
    UnsupportedProtocolVersion,
    encode,
)
from hexmq.mqtt.reason_codes import ConnectReturnCode, ReasonCode
from services.edge.acl import ClientAcl
from services.edge.enhanced_auth import ConnectionAuth
from services.edge.limits import Admission
from services.edge.qos2_origins import RoutedOrigin
from services.edge.topic_alias import InboundTopicAliases, OutboundTopicAliases
from services.edge.translate import reason_name

if TYPE_CHECKING:
    from services.edge.dispatch import SessionRoute
    from services.edge.server import Edge
    from services.edge.tickets import Route, Ticket


log = logging.getLogger("hexmq.edge.connection")

OK = pb.StatusCode.STATUS_CODE_OK
UNAVAILABLE = pb.StatusCode.STATUS_CODE_UNAVAILABLE
# Answers meaning that this connection no longer holds its session (it is being closed).
GONE = (pb.StatusCode.STATUS_CODE_TAKEN_OVER, pb.StatusCode.STATUS_CODE_NOT_FOUND)
V5 = 5
RC = ReasonCode


class State(enum.Enum):
    AWAITING_CONNECT = 1
    AUTHENTICATING = 5  # CONNECT named an Authentication Method: AUTH exchange before CONNACK
    CONNECTING = 2  # CONNECT sent to the session's partition, waiting for its answer
    CONNECTED = 3
    CLOSED = 4


class ConnectionBase(asyncio.Protocol):
    """One MQTT client connection's state and shared plumbing; see the module docstring."""

    def __init__(self, edge: Edge) -> None:
        self.edge = edge
        self.config = edge.config
        self.codec = MQTTConnection(Role.SERVER, max_packet_size=edge.config.max_packet_size)
        self.connection_id = edge.new_connection_id()
        self.state = State.AWAITING_CONNECT
        self.client_id = ""
        self.version = 4
        # The session's partition (set with the OpenSession), and where the session was last
        # opened or re-attached: a re-attach is owed when the partition's route is another
        # (services/edge/reattach.py).
        self.route: SessionRoute | None = None
        self.attached: Route | None = None
        self._open_ticket: Ticket | None = None
        # The AttachSession on its way, and whether another is owed after it.
        self._attach: Ticket | None = None
        self._attach_again = False
        # Delivery acknowledgements sent (or not sendable) whose confirmation has not come:
        # token -> (acknowledged message ids, PUBREC'd message ids). A re-attach carries them.
        self._unconfirmed: OrderedDict[int, tuple[list[int], list[int]]] = OrderedDict()
        self._ack_tokens = itertools.count(1)
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
        # Deliveries sent to the client and not acknowledged: packet id -> message id. Kept
        # across a re-attach, so that a PUBACK arriving after it still maps to its message.
        self._inflight_out: dict[int, int] = {}
        # QoS 2 deliveries: PUBLISH sent, awaiting PUBREC (packet id -> message id); PUBREC'd
        # message ids for the partition (flushed with the acks); PUBREL sent, awaiting PUBCOMP.
        self._q2_out: dict[int, int] = {}
        self._recs: list[int] = []
        self._rel_out: dict[int, int] = {}
        # Publishes being stored (QoS 1 until PUBACK, QoS 2 until PUBREC).
        self._pending_in = 0
        # Inbound QoS 2 on this connection: packet ids being claimed and routed; those whose
        # routing could not be recorded because the session's partition had no master within
        # the failover bound (recorded again on re-attach, then PUBREC: reason code, span,
        # origin); those answered with PUBREC and
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

    if TYPE_CHECKING:
        # Defined by ClientConnection, which keeps the hot path (writes, flushes, publishes)
        # and the packet dispatch; declared here so that the parts may call them.
        def _write(self, data: bytes) -> None: ...
        def _flush_out(self) -> None: ...
        def _process(self) -> None: ...
        def _count_in(self) -> bool: ...
        def _uncount_in(self) -> None: ...
        def _record_qos2(
            self,
            pid: int,
            failure: str | None,
            reason: int,
            span: Span | None,
            routed: RoutedOrigin | None = None,
            *,
            quiet: bool = False,
        ) -> None: ...
        def _flush_acks(self) -> None: ...
        def reattach(self) -> bool: ...
        def _publish_refused(
            self,
            pid: int,
            why: str,
            span: Span | None = None,
            *,
            qos: int = 1,
            close: bool = False,
            quiet: bool = False,
        ) -> None: ...

    def delivery_source(self) -> str | None:
        """The node whose deliveries this connection takes now: the master its re-attach went
        to (while one is on its way; "" while it waits to be sent: none), else the one it is
        attached at (None: not known yet, any)."""
        attach = self._attach
        if attach is not None:
            sent = attach.sent_to
            return sent.node if sent is not None else ""
        return self.attached.node if self.attached is not None else None

    # ----- helpers ----------------------------------------------------------------------

    def _session_partition(self) -> int:
        route = self.route
        assert route is not None
        return route.partition

    def _session_request(self, cmd: pb.EdgeCommand, callback: Callable[[pb.Result], None]) -> None:
        route = self.route
        assert route is not None
        route.request(cmd, callback)

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
        # A request (its answer unneeded): sent again if its link breaks first.
        route.request_ignored(pb.EdgeCommand(close_session=close))

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

    def _throttle(self, node: str) -> None:
        """Stop reading while the link to `node` has more queued than it can send
        (backpressure)."""
        link = self.edge.router.links.get(node)
        if link is not None and link.congested and "link" not in self._paused_for:
            self._pause_reading("link")
            link.when_drained(lambda: self._resume_reading("link"))

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

    def _close(self, why: str | None, *, quiet: bool = False) -> None:
        """Close the connection; `why` is logged (at DEBUG when `quiet`: a refusal of a command
        held past the failover bound, which is logged once per partition and burst)."""
        if why is not None:
            log.log(
                logging.DEBUG if quiet else logging.WARNING,
                "closing %s (%s): %s",
                self.peer,
                self.client_id or "-",
                why,
            )
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
