"""The load generator's MQTT clients: asyncio protocols around our sans-IO codec.

Everything a client receives goes through :class:`hexmq.mqtt.MQTTConnection`, so a broker that
sends a malformed or out-of-place packet fails the run. The two frames sent per message (PUBLISH
from a publisher, PUBACK from the subscriber) are built from byte templates instead: the codec
builds and validates a frozen dataclass per packet (~5 us for a PUBLISH here), which in one
Python process would cap the generator well below what mosquitto can take. Each template is cut
from the codec's own encoding and checked against it when built, so the bytes are the codec's.

Times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC): one clock for every process on the
machine, so a timestamp written by a publisher process is comparable in the subscriber process.
"""

from __future__ import annotations

import asyncio
import struct
import time
from array import array
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, cast

from hexmq.mqtt import (
    ConnAck,
    Connect,
    Disconnect,
    MQTTConnection,
    NeedData,
    Packet,
    PubAck,
    Publish,
    Role,
    SubAck,
    Subscribe,
    Subscription,
    encode,
)

# Payload header: publisher index, sequence number (from 0, per publisher), send time in ns.
# The rest of the payload is zero padding up to the configured size.
PAYLOAD_HEADER = struct.Struct("<HQQ")

# Saturated QoS 0 publishers write this many messages per turn of the event loop: enough to
# amortise the loop's per-turn cost, small enough that the subscriber in the same loop gets
# its turn often (its receive time is the latency measurement).
QOS0_BATCH = 32

now_ns = time.monotonic_ns


@dataclass(frozen=True, slots=True)
class Timeline:
    """The phases of one run, as absolute ``monotonic_ns`` times (shared by all processes)."""

    start: int  # publishers begin
    window: int  # warm-up over: measurement begins
    window_end: int  # measurement ends
    stop: int  # publishers stop sending (a little after window_end, so the window is steady)

    @property
    def window_s(self) -> float:
        return (self.window_end - self.window) / 1e9


NO_TIMELINE = Timeline(0, 0, 0, 0)


class PublishFrames:
    """PUBLISH bytes for one topic and payload size, cut from the codec's own encoding."""

    def __init__(self, version: int, topic: str, qos: int, payload_size: int) -> None:
        if payload_size < PAYLOAD_HEADER.size:
            raise ValueError(f"payload must be at least {PAYLOAD_HEADER.size} bytes")
        self.qos = qos
        self._padding = bytes(payload_size - PAYLOAD_HEADER.size)
        sample = bytes(payload_size)
        reference = encode(Publish(topic, sample, qos=qos, packet_id=1 if qos else None), version)
        head = reference[: len(reference) - payload_size]
        # The packet id (QoS > 0) ends the fixed part of the variable header; 5.0 follows it with
        # the property length, 0 here (3.3.2).
        after = 1 if version == 5 else 0
        pid_end = len(head) - after
        self._before_pid = head[: pid_end - 2] if qos else head
        self._after_pid = head[pid_end:] if qos else b""
        for pid in (1, 0x1234, 65535):
            expected = encode(
                Publish(topic, sample, qos=qos, packet_id=pid if qos else None), version
            )
            if self.frame(pid, sample) != expected:
                raise AssertionError(f"PUBLISH template differs from the codec for {topic!r}")

    def payload(self, publisher: int, seq: int, sent_ns: int) -> bytes:
        return PAYLOAD_HEADER.pack(publisher, seq, sent_ns) + self._padding

    def frame(self, packet_id: int, payload: bytes) -> bytes:
        if self.qos:
            return self._before_pid + packet_id.to_bytes(2, "big") + self._after_pid + payload
        return self._before_pid + payload


class PubAckFrames:
    """PUBACK bytes (success) for a packet id, cut from the codec's own encoding."""

    def __init__(self, version: int) -> None:
        reference = encode(PubAck(0x1234), version)
        at = reference.index(b"\x12\x34")
        self._head = reference[:at]
        self._tail = reference[at + 2 :]
        for pid in (1, 65535):
            if self.frame(pid) != encode(PubAck(pid), version):
                raise AssertionError("PUBACK template differs from the codec")

    def frame(self, packet_id: int) -> bytes:
        return self._head + packet_id.to_bytes(2, "big") + self._tail


class BrokerError(Exception):
    """The broker refused us, closed on us, or sent something we did not expect."""


class _Client(asyncio.Protocol):
    """What publishers and the subscriber share: connect, CONNACK, write backpressure."""

    def __init__(self, client_id: str, version: int) -> None:
        self.client_id = client_id
        self.version = version
        self.codec = MQTTConnection(Role.CLIENT, protocol_version=version)
        self.transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        self.loop = loop
        self.connack: asyncio.Future[ConnAck] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.write_paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.failure: str | None = None

    async def open(self, host: str, port: int) -> None:
        await self.loop.create_connection(lambda: self, host, port)
        # keepalive 0: a run is shorter than any useful keepalive, and a PINGREQ would only add
        # noise to the measurement.
        self.write(
            self.codec.send(
                Connect(client_id=self.client_id, protocol_version=self.version, keepalive=0)
            )
        )
        connack = await asyncio.wait_for(asyncio.shield(self.connack), 10)
        if connack.reason_code:
            raise BrokerError(f"{self.client_id}: CONNACK refused 0x{connack.reason_code:02X}")

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            try:
                self.transport.write(self.codec.send(Disconnect()))
            except ValueError:
                pass  # a DISCONNECT went already
            self.transport.close()

    # --- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        if not self.connack.done():
            self.connack.set_exception(BrokerError(f"{self.client_id}: closed before CONNACK"))

    def pause_writing(self) -> None:
        self.write_paused = True
        self.writable.clear()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        self.codec.receive_data(data)
        try:
            while True:
                packet = self.codec.next_event()
                if isinstance(packet, NeedData):
                    break
                self.on_packet(packet)
        except Exception as exc:  # any codec error is the broker's fault here; stop the client
            self.fail(f"{type(exc).__name__}: {exc}")
        self.after_packets()

    def on_packet(self, packet: Packet) -> None:
        if isinstance(packet, ConnAck) and not self.connack.done():
            self.connack.set_result(packet)
        else:
            self.fail(f"unexpected {type(packet).__name__}")

    def after_packets(self) -> None:
        """Called once per read, after its packets: where replies are written, batched."""

    def fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
        if self.transport is not None:
            self.transport.abort()


@dataclass(slots=True)
class PublisherStats:
    sent: int = 0  # messages written; their sequence numbers are 0..sent-1
    acked: int = 0
    window_sent: int = 0  # sends whose timestamp fell in the measurement window
    unexpected_acks: int = 0
    failed_acks: int = 0  # PUBACK with a failure reason code (5.0)
    window_resets: int = 0  # QoS 0 window given up on after a stall (messages dropped)
    # Paced runs: how late each send was against its schedule (generator lag), in ns.
    lag_ns: array[int] = field(default_factory=lambda: array("q"))


# How a publisher decides when to send:
#   "window" - saturated, but bounded: QoS 1 keeps `inflight` publishes unacknowledged; QoS 0,
#              which has no acknowledgement, keeps `inflight` messages beyond the last one the
#              subscriber reported (shared `progress`), so the broker is kept busy without
#              building queues whose only effect would be to measure buffer sizes.
#   "flood"  - QoS 0 as fast as the socket takes it (what a naive client does; shows whether the
#              broker pushes back or drops).
#   "paced"  - open loop at `rate` messages/s, still within the QoS 1 window.
PUBLISH_MODES = ("window", "flood", "paced")

# A QoS 0 window that has not moved for this long is written off: its messages were dropped.
QOS0_STALL_NS = 200_000_000


class Publisher(_Client):
    """One publisher on its own topic (see PUBLISH_MODES)."""

    def __init__(
        self,
        index: int,
        client_id: str,
        version: int,
        frames: PublishFrames,
        *,
        mode: str,
        inflight: int,
        rate: float | None = None,
        phase: float = 0.0,
        progress: memoryview | None = None,
    ) -> None:
        super().__init__(client_id, version)
        if mode not in PUBLISH_MODES:
            raise ValueError(f"mode must be one of {PUBLISH_MODES}, got {mode!r}")
        if mode == "paced" and not rate:
            raise ValueError("a paced publisher needs a rate")
        if mode == "window" and not frames.qos and progress is None:
            raise ValueError("a QoS 0 window needs the subscriber's progress")
        self.index = index
        self.frames = frames
        self.qos = frames.qos
        self.mode = mode
        self.timeline = NO_TIMELINE
        self.inflight_limit = inflight
        self.rate = rate or 0.0
        self.phase = phase
        self.progress = progress
        self._schedule_start = 0
        self.stats = PublisherStats()
        self.unacked: dict[int, int] = {}  # packet id -> sequence number
        self._next_pid = 0
        # Nothing is sent before begin(): a CONNACK or PUBACK must not start the flow early.
        self.started = False
        self.stopping = False
        self.done: asyncio.Future[None] = self.loop.create_future()
        self._timer: asyncio.TimerHandle | None = None
        self._stalled_since = 0
        self._written_off = 0  # QoS 0 window: sequence numbers below this are given up on

    def begin(self, timeline: Timeline) -> None:
        """Start publishing (called by the worker at ``timeline.start``)."""
        self.timeline = timeline
        self.started = True
        # Paced publishers start `phase` of an interval apart, so the total stream is even.
        offset = int(self.phase * 1e9 / self.rate) if self.mode == "paced" else 0
        self._schedule_start = timeline.start + offset
        self.loop.call_later(max(0.0, (self.timeline.stop - now_ns()) / 1e9), self._stop)
        if self.mode == "paced":
            self._tick()
        elif self.qos:
            self._pump()
        else:
            self.loop.create_task(self._qos0_loop())

    async def _qos0_loop(self) -> None:
        # Saturated QoS 0: nothing comes back on this connection to clock the sends, so write
        # whenever the socket and the window allow, yielding to the loop after every batch.
        while not self.stopping and self.failure is None:
            if self.write_paused:
                await self.writable.wait()
            elif self._pump():
                await asyncio.sleep(0)
            else:
                # Window full: the subscriber's progress lives in another process (no wake-up
                # call), so look again shortly; a window that stays full was dropped.
                now = now_ns()
                if not self._stalled_since:
                    self._stalled_since = now
                elif now - self._stalled_since > QOS0_STALL_NS:
                    self._written_off = self.stats.sent
                    self.stats.window_resets += 1
                    self._stalled_since = 0
                await asyncio.sleep(0.0005)

    def _allowance(self, now: int) -> int:
        sent = self.stats.sent
        if self.mode == "paced":
            due = int((now - self._schedule_start) * self.rate / 1e9) + 1 - sent
        elif self.qos:
            due = self.inflight_limit
        elif self.mode == "flood":
            due = QOS0_BATCH
        else:
            assert self.progress is not None
            seen = max(self.progress[self.index], self._written_off)
            due = min(QOS0_BATCH, self.inflight_limit - (sent - seen))
            if due > 0:
                self._stalled_since = 0
        if self.qos:
            due = min(due, self.inflight_limit - len(self.unacked))
        return due

    def _pump(self) -> bool:
        """Send what is allowed now, in one write; False if nothing was."""
        if not self.started or self.stopping or self.write_paused or self.transport is None:
            return False
        now = now_ns()
        n = self._allowance(now)
        if n <= 0:
            return False
        stats = self.stats
        frames = self.frames
        first = stats.sent
        if self.mode == "paced":
            # Scheduled time of the first message due; the rest of the burst is later still.
            scheduled = self._schedule_start + int(first * 1e9 / self.rate)
            stats.lag_ns.append(max(0, now - scheduled))
        parts = []
        for seq in range(first, first + n):
            payload = frames.payload(self.index, seq, now)
            if self.qos:
                pid = self._allocate_pid()
                self.unacked[pid] = seq
                parts.append(frames.frame(pid, payload))
            else:
                parts.append(frames.frame(0, payload))
        stats.sent += n
        if self.timeline.window <= now < self.timeline.window_end:
            stats.window_sent += n
        self.write(b"".join(parts))
        return True

    def _allocate_pid(self) -> int:
        pid = self._next_pid
        while True:
            pid = pid % 65535 + 1
            if pid not in self.unacked:
                self._next_pid = pid
                return pid

    def _tick(self) -> None:
        self._timer = None
        if self.stopping:
            return
        self._pump()
        next_due = self._schedule_start + int(self.stats.sent * 1e9 / self.rate)
        self._timer = self.loop.call_later(max(0.0, (next_due - now_ns()) / 1e9), self._tick)

    def _stop(self) -> None:
        self.stopping = True
        if self._timer is not None:
            self._timer.cancel()
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.stopping and not self.unacked and not self.done.done():
            self.done.set_result(None)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.qos or self.mode == "paced":
            self._pump()

    def on_packet(self, packet: Packet) -> None:
        if type(packet) is PubAck:
            seq = self.unacked.pop(packet.packet_id, None)
            if seq is None:
                self.stats.unexpected_acks += 1
            elif packet.reason_code >= 0x80:
                self.stats.failed_acks += 1
            else:
                self.stats.acked += 1
        else:
            super().on_packet(packet)

    def after_packets(self) -> None:
        if self.qos:
            if self.stopping:
                self._maybe_done()
            else:
                self._pump()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.done.done() and not self.stopping:
            self.failure = self.failure or f"connection lost: {exc}"
        self.stopping = True
        if not self.done.done():
            self.done.set_result(None)


@dataclass(slots=True)
class SubscriberStats:
    deliveries: int = 0  # every PUBLISH received, duplicates included
    window_deliveries: int = 0
    dup_flagged: int = 0  # deliveries with the DUP flag set (redeliveries)
    wrong_qos: int = 0  # deliveries at a QoS other than the subscription's
    foreign: int = 0  # payloads that are not ours (another publisher on the topics?)
    stray: int = 0  # ours, but from a publisher this subscriber's filter does not match
    latency_ns: array[int] = field(default_factory=lambda: array("q"))


class Subscriber(_Client):
    """A subscriber: counts by sequence number per publisher, timestamps, acks every QoS 1
    delivery. One wildcard subscriber of every publisher is the fan-in; one per publisher topic
    makes fan-out (many on one topic) and pairs (one each)."""

    def __init__(
        self,
        client_id: str,
        version: int,
        n_publishers: int,
        qos: int,
        progress: memoryview | None = None,
        expected: Collection[int] | None = None,
    ) -> None:
        super().__init__(client_id, version)
        self.qos = qos
        # The publishers whose messages this subscriber's filter matches (default: all of them).
        # A delivery from any other is a routing error, counted as `stray`.
        self.expected = sorted(range(n_publishers) if expected is None else expected)
        # Where QoS 0 window publishers (maybe in another process) read how far we got:
        # highest sequence number seen + 1, per publisher.
        self.progress = progress
        # Set by the worker on "go"; until then nothing counts as inside the window.
        self.timeline = NO_TIMELINE
        self._now = 0
        self._in_window = False
        self.stats = SubscriberStats()
        self.n_publishers = n_publishers
        # One byte per sequence number per expected publisher: exact loss and duplicate counts,
        # cheaply (None for the others: 100 pairs must not cost 100 x 100 of these).
        self.seen: list[bytearray | None] = [None] * n_publishers
        for i in self.expected:
            self.seen[i] = bytearray(1 << 16)
        self.unique = [0] * n_publishers
        self.duplicates = [0] * n_publishers
        self.reordered = [0] * n_publishers
        self.highest = [-1] * n_publishers
        self.last_delivery = 0
        self.suback: asyncio.Future[SubAck] = self.loop.create_future()
        self._acks = PubAckFrames(version)
        self._pending_acks: list[bytes] = []

    async def subscribe(self, topic_filter: str) -> None:
        self.write(self.codec.send(Subscribe(1, (Subscription(topic_filter, self.qos),))))
        suback = await asyncio.wait_for(asyncio.shield(self.suback), 10)
        if suback.reason_codes != (self.qos,):
            raise BrokerError(f"SUBSCRIBE {topic_filter!r} at QoS {self.qos}: {suback!r}")

    def data_received(self, data: bytes) -> None:
        # One receive time per read: the packets in it arrived together, and one clock call per
        # read instead of per packet keeps the subscriber's own cost down.
        self._now = now_ns()
        self._in_window = self.timeline.window <= self._now < self.timeline.window_end
        super().data_received(data)

    def on_packet(self, packet: Packet) -> None:
        if type(packet) is not Publish:
            if isinstance(packet, SubAck) and not self.suback.done():
                self.suback.set_result(packet)
            else:
                super().on_packet(packet)
            return
        stats = self.stats
        stats.deliveries += 1
        if packet.qos:
            assert packet.packet_id is not None
            self._pending_acks.append(self._acks.frame(packet.packet_id))
            if packet.dup:
                stats.dup_flagged += 1
        if packet.qos != self.qos:
            stats.wrong_qos += 1
        try:
            publisher, seq, sent = PAYLOAD_HEADER.unpack_from(packet.payload)
        except struct.error:
            stats.foreign += 1
            return
        if publisher >= self.n_publishers:
            stats.foreign += 1
            return
        seen = self.seen[publisher]
        if seen is None:
            stats.stray += 1
            return
        if seq >= len(seen):
            seen.extend(bytes(max(len(seen), seq + 1 - len(seen))))
        if seen[seq]:
            self.duplicates[publisher] += 1
        else:
            seen[seq] = 1
            self.unique[publisher] += 1
            if seq < self.highest[publisher]:
                self.reordered[publisher] += 1
            else:
                self.highest[publisher] = seq
                if self.progress is not None:
                    self.progress[publisher] = seq + 1
        self.last_delivery = self._now
        if self._in_window:
            stats.window_deliveries += 1
            stats.latency_ns.append(self._now - sent)

    def after_packets(self) -> None:
        if self._pending_acks:
            self.write(b"".join(self._pending_acks))
            self._pending_acks.clear()

    def missing(self, publisher: int, sent: int) -> tuple[int, list[int]]:
        """How many of sequence numbers 0..sent-1 never arrived, and the first few of them."""
        seen = self.seen[publisher]
        assert seen is not None, f"publisher {publisher} is not expected here"
        if len(seen) < sent:
            seen.extend(bytes(sent - len(seen)))
        window = seen[:sent]
        count = window.count(0)
        first: list[int] = []
        at = window.find(0)
        while at >= 0 and len(first) < 10:
            first.append(at)
            at = window.find(0, at + 1)
        return count, first

    def summary(self) -> dict[str, Any]:
        return {
            "deliveries": self.stats.deliveries,
            "window_deliveries": self.stats.window_deliveries,
            "unique": sum(self.unique),
            "duplicates": sum(self.duplicates),
            "reordered": sum(self.reordered),
            "dup_flagged": self.stats.dup_flagged,
            "wrong_qos": self.stats.wrong_qos,
            "foreign": self.stats.foreign,
            "stray": self.stats.stray,
        }
