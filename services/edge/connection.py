"""ClientConnection: one MQTT client's socket, a thin asyncio adapter around its session core.

Bytes read go into the Session (services/edge/session/core.py); the actions it returns are
carried out here, in order: commands go to the edge's dispatcher with a callback that feeds the
answer back by token, writes are coalesced (per input, and per partition-link frame while the
edge handles one: Edge.batched), the timer is an entry on the edge's deadlines (one loop timer
for all: services/edge/deadlines.py). Reading pauses for the session's
reasons, while a partition link this client published to is congested, and while the socket's
write buffer is over its high-water mark (pause_writing/resume_writing).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt.reason_codes import ReasonCode
from services.edge import retained
from services.edge.deadlines import Deadline, LoopDeadlines
from services.edge.limits import Admission
from services.edge.session import Action, EdgeServices, Pause, Session, State
from services.edge.session import actions as act

if TYPE_CHECKING:
    from services.edge.dispatch import Dispatcher
    from services.edge.qos2_origins import OriginForgets
    from services.edge.tickets import ResultCallback, Ticket

__all__ = ["ClientConnection", "ConnectionHost", "State"]

# How long a connection closed with a reason reads on, discarding, for its client's end of
# stream (ClientConnection._linger).
LINGER_S = 2.0


class ConnectionHost(EdgeServices, Protocol):
    """What a connection's adapter uses of its edge (services/edge/server.py, Edge)."""

    dispatcher: Dispatcher
    qos2_forgets: OriginForgets
    # True while the edge handles a partition link's frame: writes wait for its end.
    corked: bool
    # Commands the connections sent whose answers have not come, and whether the edge is
    # stopping (then it waits for them: `answers_settled` once none is due).
    answers_due: int
    stopping: bool
    # Every connection's timer (ticks ClientConnection._tick).
    deadlines: LoopDeadlines[ClientConnection]

    def new_connection_id(self) -> str: ...
    def connection_opened(self, conn: ClientConnection) -> None: ...
    def connection_gone(self, conn: ClientConnection) -> None: ...
    def flush_later(self, conn: ClientConnection) -> None: ...
    def answers_settled(self) -> None: ...


class ClientConnection(asyncio.Protocol):
    __slots__ = (
        "_attach",
        "_deadline",
        "_lingering",
        "_opening",
        "_out",
        "_paused",
        "connection_id",
        "edge",
        "queued",
        "session",
        "transport",
    )

    def __init__(self, edge: ConnectionHost) -> None:
        self.edge = edge
        self.connection_id = edge.new_connection_id()
        self.session = Session(edge, self.connection_id)
        self.transport: asyncio.Transport | None = None
        self._paused = 0  # Pause bits
        self._deadline: Deadline | None = None
        self._out: list[bytes] | None = None
        self.queued = False  # among the edge's connections to flush after a frame
        self._attach: Ticket | None = None  # the AttachSession on its way
        self._opening: _Opening | None = None  # the OpenSession on its way
        # Closed with a reason and discarding input until it ends (_linger): its bound.
        self._lingering: asyncio.TimerHandle | None = None

    # ----- asyncio.Protocol, and what the edge calls ----------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = transport  # type: ignore[assignment]
        edge = self.edge
        name = transport.get_extra_info("peername")
        peer = f"{name[0]}:{name[1]}" if name else "?"
        admission = edge.limit.admit()
        edge.connection_opened(self)
        if admission is Admission.DROP:
            edge.stats.rejected["connect", ReasonCode.QUOTA_EXCEEDED] += 1
            transport.close()
        else:
            now = asyncio.get_running_loop().time()
            self.carry_out(self.session.start(peer, admission, now))

    def data_received(self, data: bytes) -> None:
        self.edge.stats.bytes_in += len(data)
        if self._lingering is not None:
            return  # closed with a reason: read only to be discarded (_linger)
        now = asyncio.get_running_loop().time()
        self.carry_out(self.session.receive(data, now, int(time.time() * 1000)))

    def connection_lost(self, exc: Exception | None) -> None:
        self._set_timer(None)
        if self._lingering is not None:
            self._lingering.cancel()
        self.carry_out(self.session.lost())
        self.edge.connection_gone(self)

    def pause_writing(self) -> None:
        self._pause(Pause.WRITE)

    def resume_writing(self) -> None:
        self._resume(Pause.WRITE)

    def deliver(self, delivery: pb.Delivery) -> None:
        if self.transport is not None:
            out = self._out
            buffered = self.transport.get_write_buffer_size() + (sum(map(len, out)) if out else 0)
            wall_ms = int(time.time() * 1000)
            self.carry_out(self.session.deliver(delivery, wall_ms, buffered))

    def kick(self, reason_code: int, node: str = "") -> None:
        self.carry_out(self.session.kick(reason_code, node))

    def shutdown(self, reference: str | None = None) -> None:
        self.carry_out(self.session.shutdown(reference))

    def reattach(self) -> bool:
        done, actions = self.session.reattach()
        self.carry_out(actions)
        return done

    def master_unreachable(self, why: str) -> None:
        self.carry_out(self.session.master_unreachable(why))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def delivery_source(self) -> str | None:
        """The node whose deliveries this connection takes now: the master its re-attach went
        to (while one is on its way; "" while it waits to be sent: none), else the one it is
        attached at (None: not known yet, any)."""
        if self._attach is not None:
            sent = self._attach.sent_to
            return sent.node if sent is not None else ""
        attached = self.session.attached
        return attached.node if attached is not None else None

    # ----- actions --------------------------------------------------------------------------

    def carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if type(action) is act.Write:  # (the commonest, inline)
                if self._out is None:
                    self._out = [action.data]
                else:
                    self._out.append(action.data)
            else:
                _CARRY_OUT[type(action)](self, action)
        if self._out is not None:
            if not self.edge.corked:
                self.flush()
            elif not self.queued:
                self.queued = True
                self.edge.flush_later(self)

    def flush(self) -> None:
        """Write what the session produced, in one transport.write."""
        self.queued = False
        out, self._out = self._out, None
        transport = self.transport
        if out and transport is not None and not transport.is_closing() and not self._lingering:
            data = out[0] if len(out) == 1 else b"".join(out)
            self.edge.stats.bytes_out += len(data)
            transport.write(data)

    def _publish(self, a: act.PublishCommand) -> None:
        edge = self.edge
        if a.token:
            edge.answers_due += 1
            edge.dispatcher.publish(a.command, functools.partial(self._stored, a.token))
        else:
            edge.dispatcher.publish_qos0(a.command)
        link = edge.router.links.get(a.node)
        if link is not None and link.congested and not self._paused & Pause.LINK:
            self._pause(Pause.LINK)
            link.when_drained(lambda: self._resume(Pause.LINK))

    def _request(self, a: act.Request | act.Attach) -> None:
        edge, session, token = self.edge, self.session, a.token
        ticket: Ticket | None = None
        edge.answers_due += 1

        def answered(result: pb.Result) -> None:
            self._settled()
            if ticket is self._attach:
                self._attach = None
            if token:
                sent_to = ticket.sent_to if ticket is not None else None
                self.carry_out(session.answered(token, result, sent_to))

        if type(a) is act.Attach:
            ticket = self._attach = edge.dispatcher.attach(a.partition, a.command, answered)
        else:
            ticket = edge.dispatcher.request(a.partition, a.command, answered)

    def _open(self, a: act.Open) -> None:
        """OpenSession: remembered until answered, so that the session can take it back."""
        self.edge.answers_due += 1
        opening = _Opening()
        token = a.token

        def answered(result: pb.Result) -> None:
            if opening.due:  # (not taken back meanwhile)
                opening.due = False
                self._settled()
            if self._opening is opening:
                self._opening = None
            sent_to = opening.ticket.sent_to if opening.ticket is not None else None
            self.carry_out(self.session.answered(token, result, sent_to))

        opening.ticket = self.edge.dispatcher.request(a.partition, a.command, answered)
        if opening.due:  # (an answer may come at once)
            self._opening = opening

    def _withdraw(self, a: act.Withdraw) -> None:
        opening, self._opening = self._opening, None
        if opening is None or not opening.due:
            return
        opening.due = False
        assert opening.ticket is not None
        self.edge.dispatcher.withdraw(opening.ticket)
        self._settled()  # (a withdrawn request held back is dropped: its answer never comes)

    def _settled(self) -> None:
        """A command's answer came (or will not be waited for): one fewer a stop waits for."""
        edge = self.edge
        edge.answers_due -= 1
        if edge.stopping and not edge.answers_due:
            edge.answers_settled()

    def _answer(self, token: int) -> ResultCallback:
        return functools.partial(self._answered, token)

    def _answered(self, token: int, result: pb.Result) -> None:
        self.carry_out(self.session.answered(token, result))

    def _stored(self, token: int, result: pb.Result) -> None:
        """The answer to a Publish: counted as due while the edge stops."""
        self._settled()
        self.carry_out(self.session.answered(token, result))

    def _gather(self, a: act.GatherRetained) -> None:
        session, token = self.session, a.token
        links = list(self.edge.router.links.values())
        retained.gather(links, a.filters, lambda m: self.carry_out(session.gathered(token, m)))

    def _pause(self, why: int) -> None:
        if self._lingering is not None:
            return  # (what a lingering connection reads is discarded: it reads on)
        if not self._paused and self.transport is not None:
            self.transport.pause_reading()
        self._paused |= why

    def _resume(self, why: int) -> None:
        if not self._paused & why:
            return
        self._paused &= ~why
        transport = self.transport
        if not self._paused and transport is not None and not transport.is_closing():
            transport.resume_reading()

    def _set_timer(self, at: float | None) -> None:
        deadlines = self.edge.deadlines
        if at is None:
            deadlines.cancel(self._deadline)
            self._deadline = None
        else:
            self._deadline = deadlines.set(self, at, self._deadline)

    def _tick(self) -> None:
        self._deadline = None
        self.carry_out(self.session.tick(asyncio.get_running_loop().time()))

    def _close(self, a: act.Close) -> None:
        self.flush()
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if a.linger and self._lingering is None:
            self._linger(transport)
        else:
            transport.close()

    def _linger(self, transport: asyncio.Transport) -> None:
        """After a DISCONNECT with a reason: stop taking requests but let the DISCONNECT
        reach the client. Closing a socket with unread input resets the connection, and a
        client still sending (publishes past our Receive Maximum, say) then loses the
        DISCONNECT to the reset, or its next write fails. So: shut down our side once the
        DISCONNECT is written (the client reads it, then end of stream), read and discard
        what the client still sends until its end of stream or LINGER_S, then close."""
        loop = asyncio.get_running_loop()
        self._lingering = loop.call_later(LINGER_S, transport.close)
        try:
            if transport.can_write_eof():
                transport.write_eof()  # (after what is buffered; TLS cannot: it waits for EOF)
        except NotImplementedError:  # (WebSocket: its close handshake ends it instead)
            transport.close()
            return
        self._paused = 0  # (reading resumes whatever paused it: the input is discarded)
        transport.resume_reading()


class _Opening:
    """An OpenSession on its way: its ticket, and whether a stop still waits for its answer."""

    __slots__ = ("due", "ticket")

    def __init__(self) -> None:
        self.due = True
        self.ticket: Ticket | None = None


def _acknowledge(c: ClientConnection, a: act.Acknowledge) -> None:
    c.edge.dispatcher.acknowledge(a.partition, a.command, c._answer(a.token), lazy=a.lazy)


def _gate(c: ClientConnection, a: act.Gate) -> None:
    c.edge.dispatcher.gate(a.partition, c._answer(a.token))


def _await_index(c: ClientConnection, a: act.AwaitIndex) -> None:
    c.edge.dispatcher.after_index(c._answer(a.token))


def _confirm_kick(c: ClientConnection, a: act.ConfirmKick) -> None:
    # (The Close before it flushed the DISCONNECT: the connection is closed to its client.)
    link = c.edge.router.links.get(a.node)
    if link is not None:
        link.send(a.command)


def _forget(c: ClientConnection, a: act.ForgetOrigins) -> None:
    c.edge.qos2_forgets.forget(a.routed)


_CARRY_OUT: dict[type, Callable[[ClientConnection, Any], None]] = {
    act.PublishCommand: ClientConnection._publish,
    act.Request: ClientConnection._request,
    act.Attach: ClientConnection._request,
    act.Open: ClientConnection._open,
    act.Withdraw: ClientConnection._withdraw,
    act.Acknowledge: _acknowledge,
    act.Gate: _gate,
    act.AwaitIndex: _await_index,
    act.GatherRetained: ClientConnection._gather,
    act.ForgetOrigins: _forget,
    act.PauseReading: lambda c, a: c._pause(a.reason),
    act.ResumeReading: lambda c, a: c._resume(a.reason),
    act.SetTimer: lambda c, a: c._set_timer(a.at),
    act.Close: ClientConnection._close,
    act.ConfirmKick: _confirm_kick,
}
