"""A minimal MQTT client on our own codec, for tests that must see exact packets and bytes
(reason codes, session present, DUP flags, malformed input) that client libraries hide."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from hexmq.mqtt import (
    NEED_DATA,
    NO_PROPERTIES,
    ConnAck,
    Connect,
    MQTTConnection,
    Packet,
    Properties,
    PubAck,
    Publish,
    Role,
    SubAck,
    Subscribe,
    Subscription,
    Will,
)

P = TypeVar("P")
# How long recv() waits by default for a packet that should come.
WAIT_S = 10.0


class RawClient:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        self.codec = MQTTConnection(Role.CLIENT, protocol_version=version)
        self._next_pid = 0
        # Packets read ahead (a PUBLISH that came before the SUBACK being waited for), handed
        # out first by recv.
        self._read_ahead: list[Packet] = []

    @classmethod
    async def open(cls, port: int, version: int = 4) -> RawClient:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer, version)

    @classmethod
    async def connect(
        cls,
        port: int,
        client_id: str,
        *,
        version: int = 4,
        clean_start: bool = True,
        keepalive: int = 60,
        properties: Properties = NO_PROPERTIES,
        will: Will | None = None,
        timeout: float | None = None,
    ) -> tuple[RawClient, ConnAck]:
        client = await cls.open(port, version)
        await client.send(
            Connect(
                client_id=client_id,
                protocol_version=version,
                clean_start=clean_start,
                keepalive=keepalive,
                will=will,
                properties=properties,
            )
        )
        connack = await client.expect(ConnAck, timeout)
        return client, connack

    def next_packet_id(self) -> int:
        self._next_pid = self._next_pid % 65535 + 1
        return self._next_pid

    async def send(self, packet: Packet) -> None:
        self.writer.write(self.codec.send(packet))
        await self.writer.drain()

    async def send_bytes(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def recv(self, timeout: float | None = None) -> Packet | None:
        """The next packet, or None when the server closed the connection. The default bound
        is generous (a loaded machine), never what a test asserts."""
        if self._read_ahead:
            return self._read_ahead.pop(0)
        async with asyncio.timeout(WAIT_S if timeout is None else timeout):
            while True:
                event = self.codec.next_event()
                if event is not NEED_DATA:
                    return event
                data = await self.reader.read(65536)
                if not data:
                    return None
                self.codec.receive_data(data)

    async def silent(self, timeout: float = 0.5) -> bool:
        """True when nothing arrives (and the connection stays open) for `timeout` seconds."""
        try:
            packet = await self.recv(timeout)
        except TimeoutError:
            return True
        raise AssertionError(f"expected silence, got {packet!r}")

    async def expect(self, kind: type[P], timeout: float | None = None) -> P:
        packet = await self.recv(timeout)
        assert isinstance(packet, kind), f"expected {kind.__name__}, got {packet!r}"
        return packet

    async def subscribe(self, *filters: str, qos: int = 1, live_first: bool = False) -> SubAck:
        """SUBSCRIBE and its SUBACK. `live_first`: PUBLISH packets of these subscriptions may
        come before the SUBACK (the server is permitted to start sending them, MQTT 5.0
        3.8.4); they are kept for the next `recv`s."""
        pid = self.next_packet_id()
        await self.send(Subscribe(pid, tuple(Subscription(f, qos) for f in filters)))
        if not live_first:
            return await self.expect(SubAck)
        early: list[Packet] = []
        while isinstance(packet := await self.recv(), Publish):
            early.append(packet)
        assert isinstance(packet, SubAck), f"expected SubAck, got {packet!r}"
        self._read_ahead.extend(early)
        return packet

    async def publish(
        self, topic: str, payload: bytes, qos: int = 1, timeout: float | None = None
    ) -> PubAck | None:
        pid = self.next_packet_id() if qos else None
        await self.send(Publish(topic, payload, qos=qos, packet_id=pid))
        return await self.expect(PubAck, timeout) if qos else None

    async def wait_closed(self, timeout: float = 5.0) -> list[Packet]:
        """Read until the server closes; returns the packets that came before."""
        seen: list[Packet] = []
        while (packet := await self.recv(timeout)) is not None:
            seen.append(packet)
        return seen

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
