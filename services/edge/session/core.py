"""Session: one MQTT client connection at the edge, as a sans-IO core.

Inputs are methods (bytes read, a partition's answer by token, retained messages gathered, a
delivery, a timer tick, a takeover, the edge stopping, the socket gone, the session's partition
moved); each returns the actions it decided (services/edge/session/actions.py), which the
adapter (services/edge/connection.py) carries out in order. Packets go to their handler through
one table, a function per packet type (services/edge/session/handle_*.py). No asyncio, no gRPC,
no clock: `now` (monotonic seconds) and `wall_ms` (wall clock, ms) come with the inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import (
    NEED_DATA,
    Auth,
    ConnAck,
    Disconnect,
    MQTTError,
    PingReq,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
    UnsupportedProtocolVersion,
    encode,
)
from hexmq.mqtt.reason_codes import ConnectReturnCode
from services.edge.limits import Admission
from services.edge.session.actions import Action, Close, ConfirmKick, SetTimer
from services.edge.session.delivery import acknowledged, flush_acks, send_delivery
from services.edge.session.delivery import reattach as reattach_session
from services.edge.session.handle_acks import (
    handle_disconnect,
    handle_pingreq,
    handle_puback,
    handle_pubcomp,
    handle_pubrec,
)
from services.edge.session.handle_connect import (
    handle_auth,
    handle_authenticating,
    handle_connect,
    refuse_connect,
)
from services.edge.session.handle_publish import handle_publish
from services.edge.session.handle_qos2 import handle_pubrel
from services.edge.session.handle_subscribe import handle_subscribe, handle_unsubscribe
from services.edge.session.state import (
    AUTHENTICATING,
    AWAITING_CONNECT,
    CONNECTED,
    CONNECTING,
    RC,
    V5,
    SessionState,
    State,
)
from services.edge.tickets import Route
from services.edge.translate import reason_name

log = logging.getLogger("hexmq.edge.connection")

Handler = Callable[[SessionState, Any, float, int], None]

# What each packet a connected client sends does: open its handler to see all of it.
HANDLERS: dict[type, Handler] = {
    Publish: handle_publish,
    PubAck: handle_puback,
    PubRec: handle_pubrec,
    PubRel: handle_pubrel,
    PubComp: handle_pubcomp,
    Subscribe: handle_subscribe,
    Unsubscribe: handle_unsubscribe,
    PingReq: handle_pingreq,
    Disconnect: handle_disconnect,
    Auth: handle_auth,
}
# Before CONNACK: the codec lets only CONNECT through first; then, while a CONNECT's enhanced
# authentication runs, AUTH or DISCONNECT (CONNECTING reads nothing: it waits for the session's
# partition).
CONNECTING_HANDLERS: dict[State, Handler] = {
    State.AWAITING_CONNECT: handle_connect,
    State.AUTHENTICATING: handle_authenticating,
}


class Session(SessionState):
    """See the module docstring; the state and its plumbing are SessionState's."""

    __slots__ = ()

    # ----- inputs ---------------------------------------------------------------------------

    def start(self, peer: str, admission: Admission, now: float) -> list[Action]:
        """The socket from `peer` (HOST:PORT) is open, and counted against the edge's limit
        (`admission`): the client has `connect_timeout` to be connected."""
        self.peer = peer
        self.admission = admission
        self.keepalive.last_rx = now
        self.emit(SetTimer(now + self.config.connect_timeout))
        return self.take()

    def receive(self, data: bytes, now: float, wall_ms: int) -> list[Action]:
        """Bytes read from the client."""
        self.keepalive.last_rx = now
        self.rx_wall_ms = wall_ms
        self.codec.receive_data(data)
        self.process(now, wall_ms)
        return self.take()

    def answered(self, token: int, result: pb.Result, sent_to: Route | None = None) -> list[Action]:
        """The partition's answer to the command sent with `token` (`sent_to`: where it went).
        A token nothing waits for is a DeliveryAck's (its answer confirms its ids)."""
        waiting = self.waiting
        on_answer = waiting.pop(token, None) if waiting else None
        if on_answer is None:
            acknowledged(self, token, result)
            return self.take()
        if not waiting:
            self.waiting = None  # (an emptied dict keeps its size: idle connections hold none)
        connecting = self.state is CONNECTING
        on_answer(result, sent_to)
        if connecting and self.codec.buffered_bytes:
            # Packets read while a CONNECT waited for its partition or its session (AUTH, what
            # came before CONNACK), handled as of when they were read.
            self.process(self.keepalive.last_rx, self.rx_wall_ms)
        return self.take()

    def gathered(self, token: int, messages: Sequence[cpb.Message]) -> list[Action]:
        """The retained messages gathered for the GatherRetained sent with `token`."""
        on_answer = self._awaited(token)
        if on_answer is not None:
            on_answer(messages)
        return self.take()

    def deliver(self, message: pb.Delivery, wall_ms: int, buffered: int) -> list[Action]:
        """Messages from the session's master; `buffered`: bytes the socket has not sent."""
        send_delivery(self, message, wall_ms, buffered)
        return self.take()

    def tick(self, now: float) -> list[Action]:
        """The timer the session asked for (SetTimer) is due."""
        state = self.state
        if state is State.CLOSED:
            return self.take()
        if state is State.CONNECTING:
            # Waiting for the session's partition (a Gate: refused by the failover hold), or
            # for the OpenSession's answer, which a master that cannot commit (cut off from
            # its followers) may never give: refused at the deadline, and taken back.
            deadline = self.open_deadline
            if deadline and now >= deadline:
                refuse_connect(
                    self,
                    RC.SERVER_UNAVAILABLE,
                    f"session not opened within {self.config.failover_hold:g}s",
                )
            elif deadline:
                self.emit(SetTimer(deadline))
            return self.take()
        timeout = self.config.connect_timeout
        if state is State.AUTHENTICATING:
            refuse_connect(
                self, RC.NOT_AUTHORIZED, f"authentication not completed within {timeout:g}s"
            )
        elif state is not State.CONNECTED:
            self.close(f"no CONNECT within {timeout:g}s")
        elif self.keepalive.interval:  # (Keep Alive 0: no timer, a stale tick does nothing)
            keepalive = self.keepalive
            again = keepalive.due(now)
            if again is None:
                # MQTT-3.1.2-24: 1.5 x keepalive without a packet ends the connection.
                idle = now - keepalive.last_rx
                self.fail(
                    RC.KEEP_ALIVE_TIMEOUT,
                    f"no packet for {idle:.1f}s (keepalive {keepalive.interval}s)",
                )
            else:
                self.emit(SetTimer(again))
        return self.take()

    def kick(self, reason_code: int, node: str = "") -> list[Action]:
        """Another connection took the session over (or the partition ended it). `node`: the
        partition node that sent the Kick, told once the connection is closed (ConfirmKick;
        "": nobody to tell)."""
        if self.state is State.CLOSED:
            self._confirm_kick(node)
            return self.take()
        log.info("%s (%s) taken over; closing", self.client_id, self.peer)
        tracer = self.edge.tracer
        if tracer.enabled:
            tracer.takeover(self.client_id, reason_code)
        # (No CloseSession: the session is another connection's now.)
        self.withdraw_open()
        why = (
            "another connection with this client id took the session over"
            if reason_code == RC.SESSION_TAKEN_OVER
            else reason_name(reason_code)
        )
        self.disconnect(reason_code, why, why="")
        self._confirm_kick(node)
        return self.take()

    def _confirm_kick(self, node: str) -> None:
        if node:
            kicked = pb.Kicked(client_id=self.client_id, connection_id=self.connection_id)
            self.emit(ConfirmKick(node, pb.EdgeCommand(kicked=kicked)))

    def shutdown(self, reference: str | None = None) -> list[Action]:
        """The edge is stopping: tell a 5.0 client (0x8B, or 0x9C Use another server with
        `reference` as the Server Reference, MQTT 5.0 section 4.11) and close."""
        if self.state is not State.CONNECTED:
            self.close(None, reason_code=RC.SERVER_SHUTTING_DOWN)
            return self.take()
        self.close_session(graceful=False)
        if reference:
            base = Properties(server_reference=reference)
            self.disconnect(RC.USE_ANOTHER_SERVER, None, base=base)
        else:
            self.disconnect(RC.SERVER_SHUTTING_DOWN, None)
        return self.take()

    def lost(self) -> list[Action]:
        """The socket is gone (whoever closed it)."""
        self.end_unacknowledged_deliveries()
        self.end_session_span("connection closed")
        if self.state is State.CONNECTED:
            self.close_session(graceful=False)
        self.withdraw_open()
        self.state = State.CLOSED
        return self.take()

    def reattach(self) -> tuple[bool, list[Action]]:
        """The session's partition moved (view, link back): re-attach it there now. False
        when there was nothing to do (services/edge/session/delivery.py)."""
        done = reattach_session(self)
        return done, self.take()

    def waits_for_master(self) -> bool:
        """Connected, and the session not attached at its partition's master as the edge
        routes it now: no route (its master is not in the view, or its link is down), or
        another one than it is attached at (its re-attach is held or unanswered). Such a
        connection gets nothing meanwhile (services/edge/unreachable.py)."""
        p = self.partition
        if self.state is not State.CONNECTED or p is None:
            return False
        route = self.edge.partition_route(p)
        return route is None or route != self.attached

    def master_unreachable(self, why: str) -> list[Action]:
        """The session waited past --unreachable-disconnect for a master it could not reach
        (`why` says how long and why): end the connection, so that the client connects again,
        through this node or another, and gets its queue there. 5.0: DISCONNECT 0x89 Server
        busy with `why` as the Reason String (0x88 Server unavailable is a CONNACK code only);
        3.1.1: a close. A lost connection to its session: the Will follows its delay, unless
        the client is back first. The edge logs one line per sweep, not one per connection."""
        if self.state is not State.CONNECTED:
            return self.take()
        log.debug("closing %s (%s): %s", self.peer, self.client_id, why)
        self.close_session(graceful=False)
        self.disconnect(RC.SERVER_BUSY, why)
        return self.take()

    def _awaited(self, token: int) -> Callable[..., None] | None:
        """What waits for `token`'s answer (taken), or None."""
        waiting = self.waiting
        if not waiting:
            return None
        on_answer = waiting.pop(token, None)
        if not waiting:
            self.waiting = None  # (an emptied dict keeps its size: idle connections hold none)
        return on_answer

    # ----- packets --------------------------------------------------------------------------

    def on_protocol_error(self, exc: MQTTError) -> None:
        """Bad input from the client (the codec's error, carrying its reason code)."""
        if self.state in (State.AWAITING_CONNECT, State.AUTHENTICATING, State.CONNECTING):
            code = exc.reason_code
            self.edge.stats.rejected["connect", code] += 1
            log.warning(
                "closing %s: bad CONNECT: %s (0x%02X): %s",
                self.peer,
                reason_name(code),
                code,
                exc.message,
            )
            answered = True  # (a CONNACK written: the close lingers for it, Close.linger)
            if isinstance(exc, UnsupportedProtocolVersion):
                # 3.1.1 clients (and older) understand return code 0x01 [MQTT-3.1.2-2]; a newer
                # level gets the 5.0 form of 0x84.
                if (exc.protocol_level or 0) > V5:
                    self.write(encode(ConnAck(False, RC.UNSUPPORTED_PROTOCOL_VERSION), V5))
                else:
                    v311 = ConnectReturnCode.UNACCEPTABLE_PROTOCOL_VERSION
                    self.write(encode(ConnAck(False, v311), 4))
            elif self.codec.protocol_version == V5:
                self.version = V5
                answered = self.send(ConnAck(False, code))
            else:
                answered = False
            self.withdraw_open()
            self.state = State.CLOSED
            self.emit(Close(code, exc.message, linger=answered))
            return
        self.fail(exc.reason_code, exc.message)

    def process(self, now: float, wall_ms: int) -> None:
        """Handle every whole packet the codec holds, while the state reads packets (not
        while a CONNECT waits for its partition)."""
        codec = self.codec
        try:
            while (
                (state := self.state) is CONNECTED
                or state is AWAITING_CONNECT
                or state is AUTHENTICATING
            ):
                packet = codec.next_event()
                if packet is NEED_DATA:
                    break
                if state is CONNECTED:
                    try:
                        handler = HANDLERS[type(packet)]
                    except KeyError:  # (the codec lets no other packet through)
                        self.fail(RC.PROTOCOL_ERROR, f"unexpected {type(packet).__name__}")
                        break
                else:
                    handler = CONNECTING_HANDLERS[state]
                handler(self, packet, now, wall_ms)
        except MQTTError as exc:
            self.on_protocol_error(exc)
        flush_acks(self)
