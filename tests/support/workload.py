"""A client workload for failover and fault tests, and the checker that counts what it saw.

Publishers send unique payloads "<client id>:<counter>" (QoS 1 or 2, MQTT 5.0 or 3.1.1) one at
a time, each waiting for its acknowledgement, and record what was acknowledged, refused or
never answered, with when. Subscribers hold persistent sessions (clean start 0, a long
expiry), record every delivery in arrival order (payload and DUP flag) and can be moved to
another node (disconnect, then connect elsewhere with the same client id), as a client behind a
load balancer is when its node dies.

`check()` compares them: acknowledged messages a subscriber never got (lost), messages nobody
published (unexpected), duplicates (allowed for QoS 1, an error for QoS 2), messages delivered
though never acknowledged (recovered: allowed), and order violations per publisher at each
subscriber (G2). Everything runs on paho-mqtt's own threads; a test drives it from its thread.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

SESSION_EXPIRY = 3600


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


def _connect(client: mqtt.Client, port: int, version: int, *, clean: bool, timeout: float) -> bool:
    """Connect and wait for CONNACK; True if accepted. The client's loop runs on a thread of
    its own (client.workload_loop), which ends when the connection does."""
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def on_connect(c: mqtt.Client, u: Any, flags: Any, rc: Any, props: Any = None) -> None:
        outcome["rc"] = rc
        outcome["present"] = bool(flags.session_present)
        done.set()

    client.on_connect = on_connect
    if version == 5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = SESSION_EXPIRY
        client.connect("127.0.0.1", port, keepalive=30, clean_start=clean, properties=props)
    else:
        client.connect("127.0.0.1", port, keepalive=30)
    client.workload_loop = _Loop(client)  # type: ignore[attr-defined]
    if not done.wait(timeout):
        return False
    client.session_present = outcome["present"]  # type: ignore[attr-defined]
    rc = outcome["rc"]
    return not rc.is_failure if hasattr(rc, "is_failure") else rc == 0


def _stop(client: mqtt.Client) -> None:
    loop = getattr(client, "workload_loop", None)
    if loop is not None:
        loop.stop()


def open_client(
    client_id: str, port: int, *, will: tuple[str, bytes] | None = None, timeout: float = 30.0
) -> mqtt.Client:
    """A connected MQTT 5.0 client (clean start) on the workload's loop: for retained
    messages, wills and takeovers in a test."""
    client = _client(client_id, 5, clean=True)
    if will is not None:
        client.will_set(will[0], will[1], qos=1)
    assert _connect(client, port, 5, clean=True, timeout=timeout), f"{client_id}: not connected"
    return client


def persistent_client(client_id: str, version: int = 5) -> mqtt.Client:
    """An unconnected client for `resume()`: clean start 0 (3.1.1: clean session 0)."""
    return _client(client_id, version, clean=False)


def resume(client: mqtt.Client, port: int, *, version: int = 5, timeout: float = 30.0) -> bool:
    """Connect with clean start 0; True if accepted within `timeout` with session present 1."""
    if not _connect(client, port, version, clean=False, timeout=timeout):
        return False
    return bool(client.session_present)  # type: ignore[attr-defined]


def still_connected(client: mqtt.Client) -> bool:
    loop = getattr(client, "workload_loop", None)
    return loop is not None and loop.running


def close_client(client: mqtt.Client) -> None:
    """DISCONNECT if still connected, and close the socket whatever happened (a server that
    died leaves it open on our side). The loop thread stops first: paho's loop is not safe
    to run from two threads."""
    _stop(client)
    if client.is_connected():
        client.disconnect()
        client.loop(timeout=0.1)  # lets the DISCONNECT out
    sock = client.socket()
    if sock is not None:
        sock.close()


@dataclass
class Publisher:
    client_id: str
    port: int
    topic: str
    qos: int = 1
    version: int = 5
    # counter -> when acknowledged (monotonic); refused: counter -> reason; unanswered: sent,
    # no acknowledgement within the wait (the connection failed).
    acked: dict[int, float] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    unanswered: set[int] = field(default_factory=set)
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

    def _run(self, interval: float, wait: float) -> None:
        client = _client(self.client_id, self.version, clean=True)
        failed: dict[int, str] = {}

        def on_publish(c: mqtt.Client, u: Any, mid: int, rc: Any, props: Any) -> None:
            if rc.is_failure:
                failed[mid] = str(rc)

        client.on_publish = on_publish
        if not _connect(client, self.port, self.version, clean=True, timeout=wait):
            return
        try:
            while not self._stop.is_set():
                self.sent += 1
                n = self.sent
                info = client.publish(self.topic, self.payload(n), qos=self.qos)
                try:
                    info.wait_for_publish(timeout=wait)
                except (RuntimeError, ValueError):
                    self.unanswered.add(n)
                    return  # the connection is gone: this publisher stops
                if not info.is_published():
                    self.unanswered.add(n)
                    return
                if info.mid in failed:
                    self.refused[n] = failed.pop(info.mid)
                else:
                    self.acked[n] = time.monotonic()
                time.sleep(interval)
        finally:
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
    # (payload, dup, qos) in arrival order, across connections.
    received: list[tuple[str, bool, int]] = field(default_factory=list)
    # session present of every connection after the first.
    resumed: list[bool] = field(default_factory=list)
    # The topic of each delivery, in the same order.
    topic_log: list[str] = field(default_factory=list)
    _client: mqtt.Client | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _on_message(self, c: mqtt.Client, u: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.received.append((msg.payload.decode(), bool(msg.dup), msg.qos))
            self.topic_log.append(msg.topic)

    def connect(self, *, timeout: float = 30.0) -> None:
        """First connection: a fresh session, subscribed once SUBACK is back."""
        # 5.0: clean start and a long expiry; 3.1.1: clean session 0 (a fresh client id).
        client = _client(self.client_id, self.version, clean=False)
        client.on_message = self._on_message
        assert _connect(client, self.port, self.version, clean=True, timeout=timeout), (
            f"{self.client_id} could not connect to {self.port}"
        )
        subscribed = threading.Event()
        client.on_subscribe = lambda *args: subscribed.set()
        client.subscribe(self.topic_filter, qos=self.qos)
        assert subscribed.wait(timeout), f"{self.client_id}: no SUBACK"
        self._client = client

    def move(self, port: int, *, timeout: float = 30.0) -> bool:
        """Connect again (its node died, or the balancer chose another), resuming the session,
        with the same client object: as a real client, it keeps its QoS 2 state (packet ids
        PUBREC'd and awaiting PUBREL) across the reconnect. True if the server said session
        present."""
        client = self._client
        assert client is not None
        _stop(client)
        sock = client.socket()
        if sock is not None:
            sock.close()
        self.port = port
        assert _connect(client, port, self.version, clean=False, timeout=timeout), (
            f"{self.client_id} could not reconnect to {port}"
        )
        present = bool(client.session_present)  # type: ignore[attr-defined]
        self.resumed.append(present)
        return present

    def drop(self) -> None:
        """End the connection without DISCONNECT, as a network cut does: the session stays on
        the server and queues what arrives for it until `move()` resumes it."""
        client = self._client
        assert client is not None
        _stop(client)
        sock = client.socket()
        if sock is not None:
            sock.close()

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


@dataclass
class Report:
    acknowledged: int
    lost: dict[str, list[str]]
    unexpected: dict[str, list[str]]
    duplicates_qos1: dict[str, list[str]]
    duplicates_qos2: dict[str, list[str]]
    order_violations: dict[str, list[str]]
    recovered: int
    refused: int

    def assert_clean(self) -> None:
        """G1 (nothing acknowledged lost), G2 (order per publisher), G3 (QoS 2 once)."""
        problems = {
            "lost": {k: v[:10] for k, v in self.lost.items() if v},
            "unexpected": {k: v[:10] for k, v in self.unexpected.items() if v},
            "QoS 2 duplicates": {k: v[:10] for k, v in self.duplicates_qos2.items() if v},
            "order violations": {k: v[:10] for k, v in self.order_violations.items() if v},
        }
        problems = {k: v for k, v in problems.items() if v}
        assert not problems, problems


def check(publishers: list[Publisher], subscribers: list[Subscriber]) -> Report:
    """What each subscriber (subscribed to every publisher's topic) got, against what was
    published and acknowledged."""
    published = {p.payload(n): p for p in publishers for n in range(1, p.sent + 1)}
    lost: dict[str, list[str]] = {}
    unexpected: dict[str, list[str]] = {}
    dup1: dict[str, list[str]] = {}
    dup2: dict[str, list[str]] = {}
    order: dict[str, list[str]] = {}
    recovered = 0
    for s in subscribers:
        got = s.payloads()
        counts = Counter(got)
        lost[s.client_id] = [
            p.payload(n) for p in publishers for n in sorted(p.acked) if p.payload(n) not in counts
        ]
        unexpected[s.client_id] = [m for m in counts if m not in published]
        # A duplicate counts by the QoS it was delivered at (the lower of the publish's and
        # the subscription's): twice at QoS 1 is allowed, twice at QoS 2 never (G3).
        delivered_qos = {p: qos for p, _dup, qos in s.received}
        dup1[s.client_id] = [m for m, k in counts.items() if k > 1 and delivered_qos[m] < 2]
        dup2[s.client_id] = [m for m, k in counts.items() if k > 1 and delivered_qos[m] == 2]
        recovered += sum(
            1
            for m in counts
            if m in published and int(m.rsplit(":", 1)[1]) not in published[m].acked
        )
        # Order: per publisher, first deliveries must come in counter order (a redelivery of
        # an earlier message is a duplicate, not an order violation).
        last: dict[str, int] = {}
        violations = []
        seen: set[str] = set()
        for m in got:
            if m in seen or m not in published:
                continue
            seen.add(m)
            who, n = m.rsplit(":", 1)
            if int(n) < last.get(who, 0):
                violations.append(f"{m} after {who}:{last[who]}")
            last[who] = max(last.get(who, 0), int(n))
        order[s.client_id] = violations
    return Report(
        acknowledged=sum(len(p.acked) for p in publishers),
        lost=lost,
        unexpected=unexpected,
        duplicates_qos1=dup1,
        duplicates_qos2=dup2,
        order_violations=order,
        recovered=recovered,
        refused=sum(len(p.refused) for p in publishers),
    )
