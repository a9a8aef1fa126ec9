"""What a workload saw, checked against what the guarantees promise (DESIGN.md G1-G7).

Pure functions over what tests/support/workload.py records (no I/O, no clock), so every rule
is unit-tested on hand-made histories (tests/unit/test_checker.py):

- `check`: per subscriber (subscribed to every publisher's topic before they started),
  acknowledged messages it never got (lost, G1), messages nobody published (unexpected),
  duplicates (a count at QoS 1, an error at QoS 2: G3), messages delivered though never
  acknowledged (recovered: allowed), and order violations per publisher (G2).
- `check_shared`: the same per shared-subscription group: each acknowledged message must reach
  one member of the group; twice at QoS 2 is an error.
- `overlaps`: pairs of connections of one client id that were live at the same time (G5).
- `ack_stats`: acknowledgement latencies and the longest gap between acknowledgements.
- `retained_check`: per retained topic, whether every node answers the same retained message
  and that it is the last acknowledged update or a later one (G6).

Order (G2): a publisher sends one message at a time and waits for its answer, so a message
answered (acknowledged or refused) was answered before any later one was sent, and must reach
every subscriber before them. A message that got no answer (its connection ended) carries no
order promise towards what the publisher sent on its next connection; if it turns up after
them it is counted in `late_unanswered`, not as a violation.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class PublisherRecord(Protocol):
    client_id: str
    sent: int
    acked: dict[int, float]
    refused: dict[int, str]
    unanswered: set[int]
    sent_at: dict[int, float]

    def payload(self, n: int) -> str: ...


class SubscriberRecord(Protocol):
    client_id: str
    received: list[tuple[str, bool, int]]

    def payloads(self) -> list[str]: ...


class ResumingRecord(Protocol):
    client_id: str
    # One entry per (re)connect: whether the server had the session (session present).
    resumed: list[bool]


class ConnectionRecord(Protocol):
    client_id: str
    host: str
    port: int
    started: float
    ended: float | None
    cause: str


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
    attempted: int = 0
    delivered: int = 0
    late_unanswered: int = 0
    # Refused messages (PUBACK 0x80) that a subscriber got all the same.
    refused_delivered: int = 0

    def assert_clean(self) -> None:
        """G1 (nothing acknowledged lost), G2 (order per publisher), G3 (QoS 2 once)."""
        problems = self.problems()
        assert not problems, problems

    def problems(self) -> dict[str, dict[str, list[str]]]:
        found = {
            "lost": {k: v[:10] for k, v in self.lost.items() if v},
            "unexpected": {k: v[:10] for k, v in self.unexpected.items() if v},
            "QoS 2 duplicates": {k: v[:10] for k, v in self.duplicates_qos2.items() if v},
            "order violations": {k: v[:10] for k, v in self.order_violations.items() if v},
        }
        return {k: v for k, v in found.items() if v}

    def assert_once_while_connected(self, subscribers: Sequence[ResumingRecord]) -> None:
        """A subscriber that kept its connection throughout got every message once, at QoS 1
        too: a broker resends only on a reconnect (MQTT-4.4.0-1), and a publish its edge sent
        again after a failover is not stored twice."""
        stayed = [s.client_id for s in subscribers if not s.resumed]
        twice = {c: self.duplicates_qos1[c][:10] for c in stayed if self.duplicates_qos1[c]}
        assert not twice, twice

    def counts(self) -> dict[str, int]:
        return {
            "attempted": self.attempted,
            "acknowledged": self.acknowledged,
            "refused": self.refused,
            "delivered": self.delivered,
            "lost": sum(map(len, self.lost.values())),
            "unexpected": sum(map(len, self.unexpected.values())),
            "duplicated_qos1": sum(map(len, self.duplicates_qos1.values())),
            "duplicated_qos2": sum(map(len, self.duplicates_qos2.values())),
            "recovered": self.recovered,
            "order_violations": sum(map(len, self.order_violations.values())),
            "late_unanswered": self.late_unanswered,
            "refused_delivered": self.refused_delivered,
        }


def _counter(message: str) -> tuple[str, int]:
    who, n = message.rsplit(":", 1)
    return who, int(n)


def _order_violations(
    got: Iterable[str], published: Mapping[str, PublisherRecord]
) -> tuple[list[str], int]:
    """(violations, late unanswered) over first deliveries in arrival order."""
    last: dict[str, int] = {}
    violations = []
    late = 0
    seen: set[str] = set()
    for m in got:
        if m in seen or m not in published:
            continue
        seen.add(m)
        who, n = _counter(m)
        if n < last.get(who, 0):
            pub = published[m]
            if n in pub.acked or n in pub.refused:
                violations.append(f"{m} after {who}:{last[who]}")
            else:
                late += 1
        last[who] = max(last.get(who, 0), n)
    return violations, late


def check(publishers: Sequence[PublisherRecord], subscribers: Sequence[SubscriberRecord]) -> Report:
    """What each subscriber (subscribed to every publisher's topic) got, against what was
    published and acknowledged."""
    published = {p.payload(n): p for p in publishers for n in range(1, p.sent + 1)}
    lost: dict[str, list[str]] = {}
    unexpected: dict[str, list[str]] = {}
    dup1: dict[str, list[str]] = {}
    dup2: dict[str, list[str]] = {}
    order: dict[str, list[str]] = {}
    recovered = delivered = late = refused_delivered = 0
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
        ours = [m for m in counts if m in published]
        delivered += len(ours)
        recovered += sum(1 for m in ours if _counter(m)[1] not in published[m].acked)
        refused_delivered += sum(1 for m in ours if _counter(m)[1] in published[m].refused)
        order[s.client_id], late_here = _order_violations(got, published)
        late += late_here
    return Report(
        acknowledged=sum(len(p.acked) for p in publishers),
        lost=lost,
        unexpected=unexpected,
        duplicates_qos1=dup1,
        duplicates_qos2=dup2,
        order_violations=order,
        recovered=recovered,
        refused=sum(len(p.refused) for p in publishers),
        attempted=sum(p.sent for p in publishers),
        delivered=delivered,
        late_unanswered=late,
        refused_delivered=refused_delivered,
    )


@dataclass
class GroupReport:
    """One shared-subscription group: every acknowledged message reaches one member."""

    group: str
    delivered: int
    lost: list[str] = field(default_factory=list)
    duplicates_qos1: list[str] = field(default_factory=list)
    duplicates_qos2: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)


def check_shared(
    publishers: Sequence[PublisherRecord], group: str, members: Sequence[SubscriberRecord]
) -> GroupReport:
    """A group of members of `$share/<group>/...` (every publisher's topic matches it): the
    group as a whole is one subscriber. Order is checked per member (each member's share of
    one publisher's messages comes in order)."""
    published = {p.payload(n): p for p in publishers for n in range(1, p.sent + 1)}
    counts: Counter[str] = Counter()
    qos: dict[str, int] = {}
    violations: list[str] = []
    for member in members:
        counts.update(member.payloads())
        qos.update({p: q for p, _dup, q in member.received})
        violations += _order_violations(member.payloads(), published)[0]
    return GroupReport(
        group=group,
        delivered=sum(1 for m in counts if m in published),
        lost=[
            p.payload(n) for p in publishers for n in sorted(p.acked) if p.payload(n) not in counts
        ],
        duplicates_qos1=[m for m, k in counts.items() if k > 1 and qos[m] < 2],
        duplicates_qos2=[m for m, k in counts.items() if k > 1 and qos[m] == 2],
        unexpected=[m for m in counts if m not in published],
        order_violations=violations,
    )


@dataclass(frozen=True)
class Overlap:
    client_id: str
    first: str  # node of the earlier connection
    second: str  # node of the later one
    start: float  # when the later connection's CONNACK came
    seconds: float  # how long both were live


def overlaps(
    connections: Sequence[ConnectionRecord], *, end: float, tolerance: float = 0.0
) -> list[Overlap]:
    """Pairs of connections of one client id live at the same time for more than `tolerance`
    seconds (a connection still open is live until `end`). The client sees a takeover's close
    a moment after the new CONNACK (the server closes the old one first, but the two sockets
    are read by different threads): `tolerance` absorbs that."""
    found = []
    by_client: dict[str, list[ConnectionRecord]] = {}
    for c in connections:
        by_client.setdefault(c.client_id, []).append(c)
    for client_id, conns in by_client.items():
        conns.sort(key=lambda c: c.started)
        for a, b in itertools.combinations(conns, 2):
            a_end = end if a.ended is None else a.ended
            b_end = end if b.ended is None else b.ended
            both = min(a_end, b_end) - max(a.started, b.started)
            if both > tolerance:
                found.append(
                    Overlap(client_id, f"{a.host}:{a.port}", f"{b.host}:{b.port}", b.started, both)
                )
    return found


@dataclass(frozen=True)
class AckStats:
    count: int
    p50: float
    p99: float
    max: float
    longest_gap: float  # the longest time without any acknowledgement, all publishers together
    longest_gap_at: float  # when it began


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ack_stats(publishers: Sequence[PublisherRecord], *, start: float, end: float) -> AckStats:
    """Latencies (send -> acknowledgement) and the longest stretch of [start, end] in which no
    publisher got an acknowledgement."""
    latencies = [p.acked[n] - p.sent_at[n] for p in publishers for n in p.acked if n in p.sent_at]
    times = sorted(t for p in publishers for t in p.acked.values() if start <= t <= end)
    points = [start, *times, end]
    gap, at = 0.0, start
    for a, b in itertools.pairwise(points):
        if b - a > gap:
            gap, at = b - a, a
    return AckStats(
        count=len(latencies),
        p50=_quantile(latencies, 0.5),
        p99=_quantile(latencies, 0.99),
        max=max(latencies, default=0.0),
        longest_gap=gap,
        longest_gap_at=at,
    )


@dataclass
class RetainedReport:
    topics: int
    converged: bool
    # topic -> {node: payload or None}: nodes that answer differently
    diverged: dict[str, dict[str, str | None]] = field(default_factory=dict)
    # topic -> (payload every node answers, last acknowledged payload): older than acknowledged
    stale: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "topics": self.topics,
            "converged": self.converged,
            "diverged": self.diverged,
            "stale": {t: list(v) for t, v in self.stale.items()},
        }


def retained_check(
    writers: Mapping[str, PublisherRecord], answers: Mapping[str, Mapping[str, str]]
) -> RetainedReport:
    """`writers`: topic -> the publisher of its retained updates; `answers`: node -> {topic:
    retained payload a fresh subscriber got there}. Every node must answer the same payload
    per topic, and it must be the last acknowledged update or a later one (a later update may
    have been placed though its acknowledgement was lost)."""
    diverged: dict[str, dict[str, str | None]] = {}
    stale: dict[str, tuple[str | None, str]] = {}
    for topic, writer in writers.items():
        seen = {node: got.get(topic) for node, got in answers.items()}
        if len(set(seen.values())) > 1:
            diverged[topic] = seen
            continue
        if not writer.acked:
            continue
        last = max(writer.acked)
        value = next(iter(seen.values()), None)
        if value is None or _counter(value)[1] < last:
            stale[topic] = (value, writer.payload(last))
    return RetainedReport(
        topics=len(writers), converged=not diverged and not stale, diverged=diverged, stale=stale
    )
