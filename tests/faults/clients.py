"""The clients of one fault run, built on tests/support/workload.py.

On every node: a QoS 1 (5.0) and a QoS 2 (3.1.1) publisher to topics of their own under
f/<tag>/, and a QoS 1 (3.1.1) and a QoS 2 (5.0) persistent subscriber to f/<tag>/#. Besides:
a shared-subscription group of two QoS 2 members on different nodes ($share/g/f/<tag>/#), and
writers of retained messages (one topic each, under r/<tag>/). A keeper thread moves a random
subscriber to a random node every few seconds (a QoS 1 one sometimes by taking its session
over without closing the old connection: G5), reconnects subscribers whose connection ended
(their node was killed), and publishers reconnect on their own to a random node. Only QoS 1
subscribers move: the QoS 2 one of each node stays connected through every fault that spares
its node (G9 judges it after each heal). Nodes that are down or paused are avoided; which
they are is the runner's to say (`down`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.faults.cluster import NodeInfo
from tests.faults.verdict import Arrivals
from tests.support.workload import (
    ConnectionLog,
    Endpoint,
    Publisher,
    Subscriber,
    close_client,
    open_client,
)

PUBLISH_INTERVAL_PER_NODE = 0.02  # a publisher's pause between messages, times the nodes
RETAINED_TOPICS = 3
RETAINED_INTERVAL = 0.4
MOVE_EVERY = (4.0, 8.0)


@dataclass
class TopicView:
    """A subscriber's deliveries on the topics under one prefix only (the checker's input)."""

    client_id: str
    received: list[tuple[str, bool, int]]

    def payloads(self) -> list[str]:
        return [p for p, _dup, _qos in self.received]


def on_topics(sub: Subscriber, prefix: str) -> TopicView:
    with sub._lock:
        pairs = zip(sub.received, sub.topic_log, strict=True)
        kept = [r for r, topic in pairs if topic.startswith(prefix)]
    return TopicView(sub.client_id, kept)


def arrivals(sub: Subscriber, prefix: str, t0: float) -> Arrivals:
    """When a subscriber's deliveries on the topics under one prefix came (s after t0): the
    first of each message, and every one (G9, tests/faults/verdict.py)."""
    first: dict[str, float] = {}
    times = []
    with sub._lock:
        for (payload, _dup, _qos), topic, at in zip(
            sub.received, sub.topic_log, sub.received_at, strict=True
        ):
            if topic.startswith(prefix):
                first.setdefault(payload, at - t0)
                times.append(at - t0)
    return Arrivals(sub.client_id, first, sorted(times))


@dataclass
class SplitSubscription:
    """A subscription made during a network fault by a client on one side (G7)."""

    fault: int
    side: str  # "minority" / "majority" / "node n3" ...
    client_id: str
    node: str
    topic_filter: str
    granted: bool | None = None  # None: no answer yet
    delivered: bool = False


class RunClients:
    def __init__(self, tag: str, nodes: Sequence[NodeInfo], seed: int, hold_s: float) -> None:
        self.tag = tag
        self.nodes = {n.node: n for n in nodes}
        self.rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        self.hold_s = hold_s
        self.log = ConnectionLog()
        self.down: set[int] = set()  # nodes the runner killed or paused: clients avoid them
        self.publishers: list[Publisher] = []
        self.subscribers: list[Subscriber] = []
        self.group: list[Subscriber] = []
        self.retained: dict[str, Publisher] = {}
        self.moves: list[dict[str, object]] = []
        self.split_subscriptions: list[SplitSubscription] = []
        self._busy: set[str] = set()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self.t0 = time.monotonic()

    # --- endpoints ----------------------------------------------------------------------

    def endpoint(self, node: int) -> Endpoint:
        return self.nodes[node].endpoint

    def node_of(self, host: str) -> int:
        return next(n for n, info in self.nodes.items() if info.host == host)

    def random_live(self) -> Endpoint:
        with self._rng_lock:
            live = sorted(set(self.nodes) - self.down) or sorted(self.nodes)
            return self.endpoint(self.rng.choice(live))

    # --- start --------------------------------------------------------------------------

    def start(self) -> None:
        f = f"f/{self.tag}"
        log = self.log
        for node, info in sorted(self.nodes.items()):
            host, port = info.endpoint
            self.subscribers += [
                Subscriber(f"s1-{self.tag}-n{node}", port, f"{f}/#", 1, 4, host, log),
                Subscriber(f"s2-{self.tag}-n{node}", port, f"{f}/#", 2, 5, host, log),
            ]
        members = sorted(self.nodes)[:2]
        self.group = [
            Subscriber(
                f"g{i}-{self.tag}",
                self.nodes[n].mqtt_port,
                f"$share/g/{f}/#",
                2,
                5,
                self.nodes[n].host,
                log,
            )
            for i, n in enumerate(members, start=1)
        ]
        for sub in [*self.subscribers, *self.group]:
            sub.connect()
        interval = PUBLISH_INTERVAL_PER_NODE * len(self.nodes)
        for node, info in sorted(self.nodes.items()):
            host, port = info.endpoint
            for name, qos, version in (("p1", 1, 5), ("p2", 2, 4)):
                pub = Publisher(
                    f"{name}-{self.tag}-n{node}",
                    port,
                    f"{f}/{name}n{node}",
                    qos,
                    version,
                    host,
                    reconnect=self.random_live,
                    log=log,
                )
                self.publishers.append(pub)
        for k in range(RETAINED_TOPICS):
            host, port = self.random_live()
            topic = f"r/{self.tag}/k{k}"
            self.retained[topic] = Publisher(
                f"r{k}-{self.tag}",
                port,
                topic,
                1,
                5,
                host,
                retain=True,
                reconnect=self.random_live,
                log=log,
            )
        self.t0 = time.monotonic()
        for pub in self.publishers:
            pub.start(interval=interval)
        for pub in self.retained.values():
            pub.start(interval=RETAINED_INTERVAL)
        self._keeper = threading.Thread(target=self._keep, name="keeper", daemon=True)
        self._keeper.start()

    # --- keeping clients connected and moving -------------------------------------------

    def _keep(self) -> None:
        next_move = time.monotonic() + self.rng.uniform(*MOVE_EVERY)
        while not self._stop.wait(0.25):
            for sub in [*self.subscribers, *self.group]:
                if not sub.connected() and sub.client_id not in self._busy:
                    self._spawn(sub, "reconnect")
            if time.monotonic() >= next_move:
                next_move = time.monotonic() + self.rng.uniform(*MOVE_EVERY)
                with self._rng_lock:
                    sub = self.rng.choice(self.movers())
                    takeover = sub.qos == 1 and self.rng.random() < 0.5
                if sub.connected() and sub.client_id not in self._busy:
                    self._spawn(sub, "takeover" if takeover else "move")

    def movers(self) -> list[Subscriber]:
        """The subscribers the keeper moves: the QoS 1 ones. The QoS 2 subscriber of each node
        stays where it is (reconnected only when its connection ends): G9 judges it at every
        heal, and a move within 20 s of one would end its connection before the verdict's
        deadline (tests/faults/verdict.py, nothing_silent)."""
        return [s for s in self.subscribers if s.qos == 1]

    def _spawn(self, sub: Subscriber, how: str) -> None:
        self._busy.add(sub.client_id)
        threading.Thread(target=self._relocate, args=(sub, how), daemon=True).start()

    def _relocate(self, sub: Subscriber, how: str) -> None:
        try:
            target = self.random_live()
            at = time.monotonic() - self.t0
            timeout = self.hold_s + 5
            if how == "takeover":
                present = sub.take_over(target, timeout=timeout)
            else:
                present = sub.try_move(target, timeout=timeout)
            self.moves.append(
                {
                    "client_id": sub.client_id,
                    "how": how,
                    "to": f"{target[0]}:{target[1]}",
                    "at": round(at, 3),
                    "session_present": present,
                }
            )
            if present is None:
                self._stop.wait(1.0)  # refused (a node cut off holds it): try elsewhere later
        finally:
            self._busy.discard(sub.client_id)

    # --- G7: subscriptions made on both sides of a split ---------------------------------

    def subscribe_during(self, fault: int, sides: dict[str, Sequence[int]]) -> None:
        """On each side, a connected subscriber of a node there subscribes to a filter of its
        own (in the background: the SUBSCRIBE may be held until the split heals)."""
        for side, side_nodes in sides.items():
            hosts = {self.nodes[n].host for n in side_nodes}
            candidates = [
                s
                for s in self.subscribers
                if s.connected() and s.host in hosts and s.client_id not in self._busy
            ]
            if not candidates:
                continue
            with self._rng_lock:
                sub = self.rng.choice(candidates)
            record = SplitSubscription(
                fault,
                side,
                sub.client_id,
                f"{sub.host}:{sub.port}",
                f"x/{self.tag}/{fault}/{sub.client_id}",
            )
            self.split_subscriptions.append(record)
            self._busy.add(sub.client_id)
            threading.Thread(target=self._split_subscribe, args=(sub, record), daemon=True).start()

    def _split_subscribe(self, sub: Subscriber, record: SplitSubscription) -> None:
        try:
            record.granted = sub.subscribe(record.topic_filter, timeout=self.hold_s + 5)
        finally:
            self._busy.discard(sub.client_id)

    def probe_split_subscriptions(self, timeout: float = 20.0) -> None:
        """After the heal: one QoS 1 message to each granted split filter; it must arrive."""
        granted = [r for r in self.split_subscriptions if r.granted]
        if not granted:
            return
        host, port = self.random_live()
        probe = open_client(f"probe-{self.tag}", port, host=host)
        for record in granted:
            probe.publish(record.topic_filter, f"probe:{record.fault}", qos=1).wait_for_publish(30)
        deadline = time.monotonic() + timeout
        subs = {s.client_id: s for s in self.subscribers}
        while time.monotonic() < deadline:
            for record in granted:
                record.delivered = record.topic_filter in subs[record.client_id].topics()
            if all(r.delivered for r in granted):
                break
            time.sleep(0.2)
        close_client(probe)

    # --- the end ------------------------------------------------------------------------

    def stop_moving(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(10)
        deadline = time.monotonic() + self.hold_s + 10
        while self._busy and time.monotonic() < deadline:
            time.sleep(0.1)

    def reconnect_all(self, timeout: float = 60.0) -> list[str]:
        """Every subscriber connected again (after the heal); the ones that could not be."""
        failed = []
        for sub in [*self.subscribers, *self.group]:
            deadline = time.monotonic() + timeout
            while not sub.connected() and time.monotonic() < deadline:
                if sub.try_move(self.random_live(), timeout=self.hold_s + 5) is None:
                    time.sleep(0.5)
            if not sub.connected():
                failed.append(sub.client_id)
        return failed

    def stop_publishers(self) -> None:
        for pub in [*self.publishers, *self.retained.values()]:
            pub._stop.set()
        for pub in [*self.publishers, *self.retained.values()]:
            pub.stop()

    def drain(self, timeout: float) -> float:
        """Until every subscriber has every acknowledged message (or the timeout); seconds
        it took."""
        start = time.monotonic()
        prefix = f"f/{self.tag}/"
        wanted = {p.payload(n) for p in self.publishers for n in p.acked}
        while time.monotonic() - start < timeout:
            complete = all(wanted <= set(on_topics(s, prefix).payloads()) for s in self.subscribers)
            group: set[str] = set()
            for member in self.group:
                group |= set(on_topics(member, prefix).payloads())
            if complete and wanted <= group:
                break
            time.sleep(0.3)
        return time.monotonic() - start

    def close(self) -> None:
        for sub in [*self.subscribers, *self.group]:
            try:
                sub.close()
            except Exception:  # closing after a run must not hide its result
                pass


@dataclass
class RetainedAnswers:
    by_node: dict[str, dict[str, str]] = field(default_factory=dict)


def read_retained(tag: str, nodes: Sequence[NodeInfo], timeout: float = 10.0) -> RetainedAnswers:
    """What a fresh subscriber to r/<tag>/# gets as retained messages on each node."""
    answers = RetainedAnswers()
    for info in nodes:
        sub = Subscriber(
            f"rr-{tag}-n{info.node}-{time.monotonic_ns() % 100000}",
            info.mqtt_port,
            f"r/{tag}/#",
            1,
            5,
            info.host,
        )
        try:
            sub.connect(timeout=timeout)
            deadline = time.monotonic() + 3.0
            seen = -1
            while time.monotonic() < deadline:  # retained messages come right after SUBACK
                time.sleep(0.5)
                if len(sub.received) == seen:
                    break
                seen = len(sub.received)
            with sub._lock:
                got = dict(zip(sub.topic_log, (p for p, _d, _q in sub.received), strict=True))
            answers.by_node[info.node_id] = got
        finally:
            sub.close()
    return answers
