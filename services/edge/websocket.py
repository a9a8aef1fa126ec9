"""MQTT over WebSocket (MQTT 5.0 section 6, RFC 6455): a thin asyncio adapter around websockets'
sans-I/O ServerProtocol.

WebSocketConnection is the TCP socket's protocol: it answers the HTTP upgrade (path /mqtt,
subprotocol "mqtt", or "mqttv3.1" for old clients) and unwraps binary frames. The MQTT side is an
ordinary ClientConnection that sees a `WebSocketTransport`: what it writes leaves as one binary
frame per flush. A frame may carry part of a packet or several packets: the MQTT codec reassembles
the byte stream, so frames are passed on as they come.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

from services.edge.connection import ClientConnection, ConnectionHost

log = logging.getLogger("hexmq.edge.websocket")
# websockets logs every opened and closed connection at INFO: keep its per-connection lines out
# of the edge log unless they are warnings.
_protocol_log = logging.getLogger("hexmq.edge.websocket.protocol")
_protocol_log.setLevel(logging.WARNING)

PATH = "/mqtt"
SUBPROTOCOLS = (Subprotocol("mqtt"), Subprotocol("mqttv3.1"))
# Room for WebSocket framing around one MQTT packet of the largest accepted size.
FRAME_OVERHEAD = 1024


class WebSocketTransport(asyncio.Transport):
    """What the ClientConnection writes to: binary frames on the WebSocket."""

    def __init__(self, conn: WebSocketConnection) -> None:
        super().__init__()
        self._conn = conn

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._conn.send_binary(data)

    def close(self) -> None:
        self._conn.close()

    def abort(self) -> None:
        self._conn.closing = True
        self._conn.tcp.abort()

    def is_closing(self) -> bool:
        return self._conn.closing

    def pause_reading(self) -> None:
        self._conn.tcp.pause_reading()

    def resume_reading(self) -> None:
        if not self._conn.tcp.is_closing():
            self._conn.tcp.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self._conn.tcp.get_write_buffer_size()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._conn.tcp.get_extra_info(name, default)


class WebSocketConnection(asyncio.Protocol):
    def __init__(self, edge: ConnectionHost) -> None:
        self.ws = ServerProtocol(
            subprotocols=list(SUBPROTOCOLS),
            # No limit on a fragmented message (a client may stream packets in one message),
            # but each frame is bounded like a packet.
            max_size=(None, edge.config.max_packet_size + FRAME_OVERHEAD),
            logger=_protocol_log,
        )
        self.mqtt = ClientConnection(edge)
        self.tcp: asyncio.Transport = None  # type: ignore[assignment]  # set by connection_made
        self.closing = False

    # ----- asyncio.Protocol (the TCP side) ----------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tcp = transport  # type: ignore[assignment]
        # The MQTT side starts now, so its CONNECT timeout also bounds the HTTP upgrade, and
        # the socket counts against --max-connections from its first moment.
        self.mqtt.connection_made(WebSocketTransport(self))

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Frame):
                if event.opcode is Opcode.BINARY or event.opcode is Opcode.CONT:
                    if event.data:
                        payload = event.data
                        self.mqtt.data_received(
                            payload if isinstance(payload, bytes) else bytes(payload)
                        )
                elif event.opcode is Opcode.TEXT:
                    # MQTT-6.0.0-1: MQTT travels in binary frames only.
                    log.warning("closing %s: WebSocket text frame", self.mqtt.session.peer)
                    ws.fail(CloseCode.UNSUPPORTED_DATA, "MQTT needs binary frames")
            elif isinstance(event, Request):
                self._handshake(event)
        self._send_pending()

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self._send_pending()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.mqtt.connection_lost(exc)

    def pause_writing(self) -> None:
        self.mqtt.pause_writing()

    def resume_writing(self) -> None:
        self.mqtt.resume_writing()

    # ----- the MQTT side ----------------------------------------------------------------

    def send_binary(self, data: bytes | bytearray | memoryview) -> None:
        if self.ws.state is State.OPEN and not self.closing:
            self.ws.send_binary(data)
            self._send_pending()

    def close(self) -> None:
        """Close frame (1000), then the TCP connection once what is buffered is sent."""
        if self.closing:
            return
        self.closing = True
        if self.ws.state is State.OPEN:
            self.ws.send_close(CloseCode.NORMAL_CLOSURE)
        self._send_pending()
        self.tcp.close()

    # ----- helpers ----------------------------------------------------------------------

    def _handshake(self, request: Request) -> None:
        ws = self.ws
        path = request.path.partition("?")[0]
        if path != PATH:
            response = ws.reject(404, f"MQTT over WebSocket is served at {PATH}\n")
        else:
            response = ws.accept(request)
        ws.send_response(response)
        if response.status_code != 101:
            log.info(
                "refused WebSocket upgrade from %s for %s: %d %s",
                self.mqtt.session.peer,
                request.path,
                response.status_code,
                response.reason_phrase,
            )

    def _send_pending(self) -> None:
        tcp = self.tcp
        for chunk in self.ws.data_to_send():
            if chunk:
                tcp.write(chunk)
            else:  # websockets' SEND_EOF: this WebSocket is over
                self.closing = True
                tcp.close()
