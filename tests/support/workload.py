"""A client workload for failover and fault tests (the checker is tests/support/checker.py).

Publishers send unique payloads "<client id>:<counter>" (QoS 1 or 2, MQTT 5.0 or 3.1.1) one at
a time, each waiting for its acknowledgement, and record what was sent, acknowledged, refused
or never answered, with when and through which node. Given a `reconnect` function, a publisher
whose connection ends connects again (clean start) to the node that function names and goes on
with new counters, as a client behind a load balancer does; without one it stops there.
Subscribers hold persistent sessions (clean start 0, a long expiry), record every delivery in
arrival order (payload, DUP flag, QoS) and can be moved to another node (disconnect, then
connect elsewhere with the same client id, as when their node dies) or take their session over
from another node while the old connection is still open (the server must close that one:
DISCONNECT 0x8E in 5.0, G5). Every connection of every client goes into a `ConnectionLog`:
when its CONNACK came, when and how it ended (by the client, by the server, by a takeover), so
a checker can tell whether a client id ever had two live connections, or whether a client was
disconnected during a network split. Everything runs on paho-mqtt's own threads; a test drives
it from its thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.support.checker import Report, check

# The workload's subscribers are away for seconds (a killed node, a move) while its publishers
# go on at hundreds of messages a second: more than the default --max-queued-messages of 1,000
# (issue 25) would drop what G1 says must arrive. Clusters that run it raise the cap to the
# 100,000 it was before (an option every release has, so the upgrade test can pass it too).
DEEP_QUEUES = "--partition-arg=--max-queued-messages=100000"

__all__ = [
    "SESSION_EXPIRY",
    "Connection",
    "ConnectionLog",
    "Publisher",
    "Report",
    "Subscriber",
    "check",
    "close_client",
    "open_client",
    "still_connected",
]

SESSION_EXPIRY = 3600
LOOPBACK = "127.0.0.1"
# MQTT 5.0 DISCONNECT reason: another connection took the session over (MQTT-3.1.4-3).
SESSION_TAKEN_OVER = 0x8E

Endpoint = tuple[str, int]


@dataclass
class Connection:
    """One network connection of one client id, as the client saw it (monotonic times)."""

    client_id: str
    host: str
    port: int
    started: float  # CONNACK (accepted) received
    ended: float | None = None
    # "client": the client closed it (a move, the end of the run); "server": the server closed
    # it or the link broke; "takeover": DISCONNECT 0x8E (another connection took the session).
    cause: str = ""
    reason: str = ""
    # The reason code of the server's DISCONNECT (5.0; 0: none came), e.g. 0x89 Server busy
    # for a session whose master stayed unreachable; its Reason String is in `reason`.
    code: int = 0
    closing: bool = False  # the client is closing it: the end is the client's doing
    # "takeover": opened by Subscriber.take_over while the previous one was still open.
    purpose: str = ""
    requested: float | None = None  # its CONNECT sent (None: not recorded)

    def to_json(self, t0: float) -> dict[str, Any]:
        return {
            "client_id": self.client_id,
            "node": f"{self.host}:{self.port}",
            "started": round(self.started - t0, 3),
            "ended": None if self.ended is None else round(self.ended - t0, 3),
            "cause": self.cause,
            "reason": self.reason,
            "code": self.code,
            "purpose": self.purpose,
            "requested": None if self.requested is None else round(self.requested - t0, 3),
        }


class ConnectionLog:
    """Every connection of every client of a workload, thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: list[Connection] = []

    def opened(
        self,
        client_id: str,
        host: str,
        port: int,
        purpose: str = "",
        requested: float | None = None,
    ) -> Connection:
        conn = Connection(
            client_id, host, port, time.monotonic(), purpose=purpose, requested=requested
        )
        with self._lock:
            self._connections.append(conn)
        return conn

    def closed(self, conn: Connection, cause: str, reason: str = "", code: int = 0) -> None:
        with self._lock:
            if conn.ended is None:
                conn.ended = time.monotonic()
                conn.cause = "client" if conn.closing else cause
                conn.reason = reason
                conn.code = code

    def snapshot(self) -> list[Connection]:
        with self._lock:
            return list(self._connections)


def _client(client_id: str, version: int, *, clean: bool) -> mqtt.Client:
    protocol = mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311
    if version == 5:
        return mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=protocol)
    return mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=protocol,
        clean_session=clean,
    )


class _Loop:
    """Runs one paho client's network loop on a thread until the connection ends or stop():
    paho's own loop_start() would reconnect by itself, to the same port and with the first
    connection's clean start, which a test must decide (and a clean start would drop the very
    session under test)."""

    def __init__(self, client: mqtt.Client) -> None:
        self.client = client
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.client.loop(timeout=0.05) != mqtt.MQTT_ERR_SUCCESS:
                return

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(10)

    @property
    def running(self) -> bool:
        """False once the connection ended (paho's own state can lag behind a server's close)."""
        return self._thread.is_alive()


def _on_disconnect(c: mqtt.Client, u: Any, flags: Any, rc: Any, props: Any = None) -> None:
    conn: Connection | None = getattr(c, "workload_connection", None)
    log: ConnectionLog | None = getattr(c, "workload_log", None)
    if conn is None or log is None:
        return
    code = getattr(rc, "value", rc)
    from_server = bool(getattr(flags, "is_disconnect_packet_from_server", False))
    if from_server and code == SESSION_TAKEN_OVER:
        log.closed(conn, "takeover", str(rc), code)
    elif from_server:
        why = getattr(props, "ReasonString", None)
        log.closed(conn, "server", f"DISCONNECT {rc}" + (f": {why}" if why else ""), code)
    else:
        log.closed(conn, "server", str(rc))


def _connect(
    client: mqtt.Client,
    endpoint: Endpoint,
    version: int,
    *,
    clean: bool,
    timeout: float,
    log: ConnectionLog | None = None,
    purpose: str = "",
) -> bool:
    """Connect and wait for CONNACK; True if accepted. The client's loop runs on a thread of
    its own (client.workload_loop), which ends when the connection does."""
    done = threading.Event()
    outcome: dict[str, Any] = {}
    host, port = endpoint
    requested = time.monotonic()

    def on_connect(c: mqtt.Client, u: Any, flags: Any, rc: Any, props: Any = None) -> None:
        outcome["rc"] = rc
        outcome["present"] = bool(flags.session_present)
        accepted = not rc.is_failure if hasattr(rc, "is_failure") else rc == 0
        if accepted and log is not None:
            c.workload_connection = log.opened(client_id_of(c), host, port, purpose, requested)
            c.workload_log = log
        done.set()

    client.on_connect = on_connect
    client.on_disconnect = _on_disconnect
    try:
        if version == 5:
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = SESSION_EXPIRY
            client.connect(host, port, keepalive=30, clean_start=clean, properties=props)
        else:
            client.connect(host, port, keepalive=30)
    except OSError:
        return False
    client.workload_loop = _Loop(client)
    if not done.wait(timeout):
        _drop(client)
        return False
    client.session_present = outcome["present"]
    rc = outcome["rc"]
    return not rc.is_failure if hasattr(rc, "is_failure") else rc == 0


def client_id_of(client: mqtt.Client) -> str:
    raw = client._client_id
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _stop(client: mqtt.Client) -> None:
    loop = getattr(client, "workload_loop", None)
    if loop is not None:
        loop.stop()


def _drop(client: mqtt.Client) -> None:
    """End the client's connection from its side without a DISCONNECT (a client that gave up
    on it, or moves on): the server sees the link break."""
    conn: Connection | None = getattr(client, "workload_connection", None)
    if conn is not None:
        conn.closing = True
    _stop(client)
    sock = client.socket()
    if sock is not None:
        sock.close()
    log: ConnectionLog | None = getattr(client, "workload_log", None)
    if conn is not None and log is not None:
        log.closed(conn, "client")


def open_client(
    client_id: str,
    port: int,
    *,
    host: str = LOOPBACK,
    will: tuple[str, bytes] | None = None,
    timeout: float = 30.0,
) -> mqtt.Client:
    """A connected MQTT 5.0 client (clean start) on the workload's loop: for retained
    messages, wills and takeovers in a test."""
    client = _client(client_id, 5, clean=True)
    if will is not None:
        client.will_set(will[0], will[1], qos=1)
    assert _connect(client, (host, port), 5, clean=True, timeout=timeout), (
        f"{client_id}: not connected"
    )
    return client


def persistent_client(client_id: str, version: int = 5) -> mqtt.Client:
    """An unconnected client for `resume()`: clean start 0 (3.1.1: clean session 0)."""
    return _client(client_id, version, clean=False)


def resume(client: mqtt.Client, port: int, *, version: int = 5, timeout: float = 30.0) -> bool:
    """Connect with clean start 0; True if accepted within `timeout` with session present 1."""
    if not _connect(client, ("127.0.0.1", port), version, clean=False, timeout=timeout):
        return False
    return bool(client.session_present)


def still_connected(client: mqtt.Client) -> bool:
    loop = getattr(client, "workload_loop", None)
    return loop is not None and loop.running


def close_client(client: mqtt.Client) -> None:
    conn: Connection | None = getattr(client, "workload_connection", None)
    if conn is not None:
        conn.closing = True
    if client.is_connected():
        client.disconnect()
        client.loop(timeout=0.1)
    _drop(client)


@dataclass
class Publisher:
    client_id: str
    port: int
    topic: str
    qos: int = 1
    version: int = 5
    host: str = LOOPBACK
    retain: bool = False
    # Where to connect next once a connection ended (None: stop, as the failover tests want).
    reconnect: Callable[[], Endpoint] | None = None
    log: ConnectionLog | None = None
    # counter -> when acknowledged (monotonic); refused: counter -> reason; unanswered: sent,
    # no acknowledgement (the connection ended, or none within the wait).
    acked: dict[int, float] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    unanswered: set[int] = field(default_factory=set)
    # counter -> when sent (monotonic), and the node (host:port) it was sent to.
    sent_at: dict[int, float] = field(default_factory=dict)
    sent_via: dict[int, str] = field(default_factory=dict)
    # counter -> when refused or given up on (monotonic)
    answered_at: dict[int, float] = field(default_factory=dict)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def payload(self, n: int) -> str:
        return f"{self.client_id}:{n}"

    def start(self, *, interval: float = 0.005, wait: float = 30.0) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(interval, wait), name=self.client_id, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def _open(self, wait: float, failed: dict[int, str]) -> mqtt.Client | None:
        client = _client(self.client_id, self.version, clean=True)

        def on_publish(c: mqtt.Client, u: Any, mid: int, rc: Any, props: Any) -> None:
            if rc.is_failure:
                failed[mid] = str(rc)

        client.on_publish = on_publish
        endpoint = (self.host, self.port)
        if _connect(client, endpoint, self.version, clean=True, timeout=wait, log=self.log):
            return client
        _drop(client)
        return None

    def _await_ack(self, client: mqtt.Client, info: mqtt.MQTTMessageInfo, wait: float) -> bool:
        """True once acknowledged; False if the connection ended first or after `wait`."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                info.wait_for_publish(timeout=0.05)
            except (RuntimeError, ValueError):
                return False
            if info.is_published():
                return True
            if not still_connected(client):
                return info.is_published()
        return False

    def _next(self) -> bool:
        """Pick the next node after a connection ended; False: stop publishing."""
        if self.reconnect is None or self._stop.is_set():
            return False
        self.host, self.port = self.reconnect()
        self._stop.wait(0.2)
        return not self._stop.is_set()

    def _run(self, interval: float, wait: float) -> None:
        failed: dict[int, str] = {}
        client: mqtt.Client | None = None
        try:
            while not self._stop.is_set():
                if client is None:
                    client = self._open(wait, failed)
                    if client is None:
                        if not self._next():
                            return
                        continue
                self.sent += 1
                n = self.sent
                self.sent_at[n] = time.monotonic()
                self.sent_via[n] = f"{self.host}:{self.port}"
                info = client.publish(self.topic, self.payload(n), qos=self.qos, retain=self.retain)
                if not self._await_ack(client, info, wait):
                    self.unanswered.add(n)
                    self.answered_at[n] = time.monotonic()
                    _drop(client)
                    client = None
                    if not self._next():
                        return
                    continue
                if info.mid in failed:
                    self.refused[n] = failed.pop(info.mid)
                    self.answered_at[n] = time.monotonic()
                else:
                    self.acked[n] = time.monotonic()
                time.sleep(interval)
        finally:
            if client is not None:
                close_client(client)

    def longest_gap(self) -> float:
        """The longest time between two consecutive acknowledgements (seconds)."""
        times = sorted(self.acked.values())
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@dataclass
class Subscriber:
    client_id: str
    port: int
    topic_filter: str
    qos: int = 1
    version: int = 5
    host: str = LOOPBACK
    log: ConnectionLog | None = None
    # (payload, dup, qos) in arrival order, across connections.
    received: list[tuple[str, bool, int]] = field(default_factory=list)
    # session present of every connection after the first.
    resumed: list[bool] = field(default_factory=list)
    # The topic of each delivery, in the same order.
    topic_log: list[str] = field(default_factory=list)
    # When each delivery came (monotonic), in the same order.
    received_at: list[float] = field(default_factory=list)
    # More filters subscribed after the first: filter -> granted (False: refused or no SUBACK).
    extra_filters: dict[str, bool] = field(default_factory=dict)
    _client: mqtt.Client | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.append((msg.payload.decode(), bool(msg.dup), msg.qos))
            self.topic_log.append(msg.topic)
            self.received_at.append(time.monotonic())

    def connect(self, *, timeout: float = 30.0) -> None:
        """First connection: a fresh session, subscribed once SUBACK is back."""
        # 5.0: clean start and a long expiry; 3.1.1: clean session 0 (a fresh client id).
        client = _client(self.client_id, self.version, clean=False)
        client.on_message = self._on_message
        endpoint = (self.host, self.port)
        accepted = _connect(
            client, endpoint, self.version, clean=True, timeout=timeout, log=self.log
        )
        assert accepted, f"{self.client_id} could not connect to {self.host}:{self.port}"
        subscribed = threading.Event()
        client.on_subscribe = lambda *args: subscribed.set()
        client.subscribe(self.topic_filter, qos=self.qos)
        assert subscribed.wait(timeout), f"{self.client_id}: no SUBACK"
        self._client = client

    def subscribe(self, topic_filter: str, *, timeout: float = 30.0) -> bool:
        """Subscribe to one more filter on the live connection; True if SUBACK granted it."""
        client = self._client
        granted = False
        if client is not None and self.connected():
            done = threading.Event()
            codes: list[Any] = []

            def on_subscribe(c: mqtt.Client, u: Any, mid: int, rcs: Any, props: Any = None) -> None:
                codes.extend(rcs)
                done.set()

            client.on_subscribe = on_subscribe
            result, _mid = client.subscribe(topic_filter, qos=self.qos)
            if result == mqtt.MQTT_ERR_SUCCESS and done.wait(timeout) and codes:
                rc = codes[0]
                granted = not rc.is_failure if hasattr(rc, "is_failure") else int(rc) < 0x80
        self.extra_filters[topic_filter] = granted
        return granted

    def move(self, port: int, *, host: str | None = None, timeout: float = 30.0) -> bool:
        """Connect again (its node died, or the balancer chose another), resuming the session,
        with the same client object: as a real client, it keeps its QoS 2 state (packet ids
        PUBREC'd and awaiting PUBREL) across the reconnect. True if the server said session
        present."""
        client = self._client
        assert client is not None
        _drop(client)
        self.port = port
        self.host = host or self.host
        assert _connect(
            client, (self.host, port), self.version, clean=False, timeout=timeout, log=self.log
        ), f"{self.client_id} could not reconnect to {self.host}:{port}"
        present = bool(client.session_present)
        self.resumed.append(present)
        return present

    def try_move(self, endpoint: Endpoint, *, timeout: float = 30.0) -> bool | None:
        """move() that reports a refused or unanswered CONNECT as None instead of failing
        (a node on the minority side of a split may hold and refuse it)."""
        client = self._client
        assert client is not None
        _drop(client)
        self.host, self.port = endpoint
        if not _connect(client, endpoint, self.version, clean=False, timeout=timeout, log=self.log):
            _drop(client)
            return None
        present = bool(client.session_present)
        self.resumed.append(present)
        return present

    def take_over(self, endpoint: Endpoint, *, timeout: float = 30.0) -> bool | None:
        """Connect a second client with this id to `endpoint` while the current connection is
        still open, as a client that lost its path and came back through another node: the
        server must close the old one (G5). Only for QoS 1 subscribers: a client keeps its QoS 2
        receive state in one client object. Returns session present, or None if refused."""
        assert self.qos == 1, "takeovers are for QoS 1 subscribers"
        old = self._client
        client = _client(self.client_id, self.version, clean=False)
        client.on_message = self._on_message
        connected = _connect(
            client,
            endpoint,
            self.version,
            clean=False,
            timeout=timeout,
            log=self.log,
            purpose="takeover",
        )
        if not connected:
            _drop(client)
            return None
        self._client = client
        self.host, self.port = endpoint
        present = bool(client.session_present)
        self.resumed.append(present)
        if old is not None:
            # The old client's loop thread ends when the server closes it; stop it afterwards.
            threading.Thread(target=_retire, args=(old,), daemon=True).start()
        return present

    def drop(self) -> None:
        """End the connection without DISCONNECT, as a network cut does: the session stays on
        the server and queues what arrives for it until `move()` resumes it."""
        client = self._client
        assert client is not None
        _drop(client)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            close_client(client)

    def connected(self) -> bool:
        client = self._client
        loop = getattr(client, "workload_loop", None) if client is not None else None
        return loop is not None and loop.running

    def topics(self) -> list[str]:
        with self._lock:
            return list(self.topic_log)

    def payloads(self) -> list[str]:
        with self._lock:
            return [p for p, _dup, _qos in self.received]


def _retire(client: mqtt.Client, wait: float = 60.0) -> None:
    """Wait for the server to close a taken-over connection, then let it go (after `wait`
    the client closes it itself: the log then shows the overlap)."""
    deadline = time.monotonic() + wait
    while still_connected(client) and time.monotonic() < deadline:
        time.sleep(0.05)
    if still_connected(client):
        _drop(client)
