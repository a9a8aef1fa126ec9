"""Synthetic hexmq traces in OTLP JSON, for sizing and demonstrating the trace job.

    python -m spark.hexmq_traces.synth --spans 1000000 --out /tmp/traces

Simulates a cluster publishing at a steady rate: each message is an mqtt.publish trace with
route, per-partition append/replicate/ack, per-subscriber deliver and client ack spans, exactly
as docs/traces.md specifies. Topic popularity is skewed (Zipf), so some partitions are hot. A
small share of deliveries is lost or duplicated, a few publish spans are dropped (orphans), and
one node is lost halfway through: a membership view change, failovers of its partitions, and
publishes to those partitions held until the failover ends. Spans are batched per process
(resource) the way the SDK's batch processor exports them, one request per line.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

MS = 1_000_000  # ns
DEFAULT_START_NS = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z: reproducible output
BATCH_SPANS = 512  # the SDK's default max export batch size

KIND_INTERNAL, KIND_SERVER, KIND_CLIENT, KIND_PRODUCER = 1, 2, 3, 4
STATUS_ERROR = 2


def _value(v: object) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}  # OTLP JSON: 64-bit integers are strings
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


@dataclass
class SpanWriter:
    """Buffers spans per (service, node) resource and writes a request line per full batch,
    spreading lines over the output files round-robin."""

    files: Sequence[IO[str]]
    written: int = 0
    _buffers: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    _next_file: int = 0

    def add(
        self,
        service: str,
        node: str,
        trace_id: str,
        span_id: str,
        parent: str | None,
        name: str,
        kind: int,
        start_ns: int,
        end_ns: int,
        attrs: dict[str, object],
        error: bool = False,
    ) -> None:
        span: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": span_id,
            "name": name,
            "kind": kind,
            "startTimeUnixNano": str(start_ns),
            "endTimeUnixNano": str(end_ns),
            "attributes": [{"key": k, "value": _value(v)} for k, v in attrs.items()],
            "status": {"code": STATUS_ERROR} if error else {},
        }
        if parent:  # a root has no parentSpanId at all, as protobuf's JSON printer leaves it
            span["parentSpanId"] = parent
        buffer = self._buffers.setdefault((service, node), [])
        buffer.append(span)
        self.written += 1
        if len(buffer) >= BATCH_SPANS:
            self._flush((service, node))

    def _flush(self, key: tuple[str, str]) -> None:
        spans = self._buffers.pop(key, [])
        if not spans:
            return
        service, node = key
        request = {
            "resourceSpans": [
                {
                    "resource": {
                        "attributes": [
                            {"key": "service.name", "value": {"stringValue": f"hexmq-{service}"}},
                            {"key": "hexmq.node", "value": {"stringValue": node}},
                        ]
                    },
                    "scopeSpans": [{"scope": {"name": f"hexmq.{service}"}, "spans": spans}],
                }
            ]
        }
        out = self.files[self._next_file % len(self.files)]
        self._next_file += 1
        out.write(json.dumps(request, separators=(",", ":")) + "\n")

    def close(self) -> None:
        for key in list(self._buffers):
            self._flush(key)


@dataclass
class Cluster:
    nodes: list[str]
    partitions: int
    rf: int
    lost: str | None = None  # the node that is gone, once the failover began

    def live(self) -> list[str]:
        return [n for n in self.nodes if n != self.lost]

    def replicas(self, partition: int) -> list[str]:
        """Master first: the partition's nodes clockwise, skipping the lost node."""
        ring = self.live()
        first = partition % len(self.nodes)
        ordered = [self.nodes[(first + i) % len(self.nodes)] for i in range(len(self.nodes))]
        return [n for n in ordered if n in ring][: self.rf]


class Generator:
    def __init__(self, args: argparse.Namespace, writer: SpanWriter) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.w = writer
        self.cluster = Cluster([f"n{i + 1}" for i in range(args.nodes)], args.partitions, args.rf)
        weights = [1 / (rank + 1) ** 1.1 for rank in range(args.topics)]
        self.topics = [f"sensors/site{t % 17}/dev{t}" for t in range(args.topics)]
        self.topic_weights = weights
        self.failover_ns: int | None = None
        self.failover_done_ns: int | None = None
        self.moved: set[int] = set()

    def _id(self, bits: int) -> str:
        return f"{self.rng.getrandbits(bits):0{bits // 4}x}"

    def _dur(self, median_ms: float) -> int:
        return max(1000, int(self.rng.lognormvariate(0, 0.5) * median_ms * MS))

    def _subscribers(self, topic_index: int) -> dict[int, list[str]]:
        """Subscriber sessions per partition, fixed per topic (subscriptions do not churn)."""
        rng = random.Random(topic_index)
        targets = rng.sample(range(self.args.partitions), 1 if rng.random() < 0.8 else 2)
        return {
            p: [f"{rng.getrandbits(64):016x}" for _ in range(rng.choice((1, 1, 2, 3)))]
            for p in targets
        }

    def fail_node(self, at_ns: int) -> None:
        """The master of a third of the partitions dies: a view change, then their failovers."""
        w, c = self.w, self.cluster
        lost = c.nodes[1 % len(c.nodes)]
        before = {p: c.replicas(p)[0] for p in range(c.partitions)}
        c.lost = lost
        trace = self._id(128)
        installed = at_ns + 1500 * MS  # suspicion timeout
        w.add(
            "membership", c.live()[0], trace, self._id(64), None, "membership.view",
            KIND_INTERNAL, at_ns, installed,
            {"hexmq.view.epoch": 2, "hexmq.node.lost": lost, "hexmq.node": c.live()[0]},
        )  # fmt: skip
        done = installed
        for p, master in before.items():
            if master != lost:
                continue
            self.moved.add(p)
            new = c.replicas(p)[0]
            end = installed + self._dur(150)
            done = max(done, end)
            w.add(
                "partition", new, self._id(128), self._id(64), None, "partition.failover",
                KIND_INTERNAL, installed, end,
                {"hexmq.partition": p, "hexmq.partition.epoch": 2, "hexmq.view.epoch": 2,
                 "hexmq.node.lost": lost, "hexmq.node": new},
            )  # fmt: skip
        self.failover_ns, self.failover_done_ns = at_ns, done

    def message(self, t0: int) -> None:
        a, w, rng, c = self.args, self.w, self.rng, self.cluster
        trace = self._id(128)
        topic_index = rng.choices(range(a.topics), self.topic_weights)[0]
        topic = self.topics[topic_index]
        qos = rng.choice((0, 1, 1, 2))
        edge = rng.choice(c.live())
        targets = self._subscribers(topic_index)
        root = self._id(64)
        route_id, route_start = self._id(64), t0 + 20_000
        route_end = route_start + self._dur(0.05)
        w.add(
            "edge", edge, trace, route_id, root, "edge.route", KIND_INTERNAL, route_start,
            route_end, {"hexmq.route.partitions": len(targets), "hexmq.node": edge},
        )  # fmt: skip
        last = route_end
        for p, subscribers in targets.items():
            master, *followers = c.replicas(p)
            start = route_end + self._dur(0.2)
            # A write to a partition without master waits for the failover to finish.
            held = (
                self.failover_ns is not None
                and p in self.moved
                and self.failover_done_ns is not None
                and start < self.failover_done_ns
            )
            if held and self.failover_done_ns is not None:
                start = self.failover_done_ns + self._dur(1)
            append_id = self._id(64)
            attrs: dict[str, object] = {
                "hexmq.partition": p,
                "hexmq.partition.epoch": 2 if p in self.moved else 1,
                "hexmq.node": master,
                "hexmq.subscribers": len(subscribers),
            }
            rep_end = start + 50_000
            for follower in followers:
                r_start = start + 50_000
                r_end = r_start + self._dur(0.5)
                rep_end = max(rep_end, r_end)
                w.add(
                    "partition", master, trace, self._id(64), append_id, "partition.replicate",
                    KIND_CLIENT, r_start, r_end,
                    {"hexmq.follower": follower, "hexmq.partition": p, "hexmq.node": master,
                     "hexmq.replication.lag": rng.choice((0, 0, 0, 1, 2, 5))},
                )  # fmt: skip
            end = rep_end + self._dur(0.05)
            if qos >= 1:
                w.add(
                    "partition", master, trace, self._id(64), append_id, "partition.ack",
                    KIND_INTERNAL, rep_end, end, {"hexmq.partition": p, "hexmq.node": master},
                )  # fmt: skip
            for sub in subscribers:
                sub_edge = c.live()[int(sub[:4], 16) % len(c.live())]
                copies = 2 if rng.random() < a.dup else 1
                if rng.random() < a.loss:
                    copies = 0  # the deliver span is missing: a lost delivery
                for _ in range(copies):
                    d_id, d_start = self._id(64), end + self._dur(0.3)
                    d_end = d_start + self._dur(0.2)
                    w.add(
                        "edge", sub_edge, trace, d_id, append_id, "mqtt.deliver", KIND_PRODUCER,
                        d_start, d_end,
                        {"hexmq.subscriber_hash": sub, "hexmq.node": sub_edge, "hexmq.qos": qos,
                         "messaging.system": "mqtt", "messaging.destination.name": topic},
                    )  # fmt: skip
                    if qos >= 1 and rng.random() >= a.loss:
                        w.add(
                            "edge", sub_edge, trace, self._id(64), d_id, "mqtt.client_ack",
                            KIND_SERVER, d_end, d_end + self._dur(2),
                            {"hexmq.subscriber_hash": sub, "hexmq.node": sub_edge},
                        )  # fmt: skip
                    last = max(last, d_end)
            w.add(
                "partition", master, trace, append_id, root, "partition.append", KIND_SERVER,
                start, end, attrs,
            )  # fmt: skip
        if rng.random() >= a.drop_root:  # else: the edge's span was dropped, an orphan trace
            w.add(
                "edge", edge, trace, root, None, "mqtt.publish", KIND_SERVER, t0,
                max(last, route_end) + 10_000,
                {"messaging.system": "mqtt", "messaging.destination.name": topic,
                 "messaging.message.id": str(rng.getrandbits(16)), "hexmq.qos": qos,
                 "hexmq.node": edge, "hexmq.client_id_hash": self._id(64)},
            )  # fmt: skip

    def run(self) -> None:
        a = self.args
        gap_ns = int(1e9 / a.rate)
        t = a.start_ns
        # ~9 spans per message on average: fail the node about halfway through.
        fail_at = a.start_ns + int(a.spans / 9 / 2) * gap_ns if a.failover else None
        while self.w.written < a.spans:
            if fail_at is not None and t >= fail_at and self.failover_ns is None:
                self.fail_node(t)
            self.message(t)
            t += gap_ns


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="hexmq-traces-synth", description="Synthetic hexmq traces in OTLP JSON."
    )
    p.add_argument("--spans", type=int, default=100_000, help="spans to write (about)")
    p.add_argument("--out", required=True, type=Path, help="directory for traces-NNN.jsonl")
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--partitions", type=int, default=64)
    p.add_argument("--rf", type=int, default=2, help="replicas per partition, master included")
    p.add_argument("--topics", type=int, default=2000)
    p.add_argument("--rate", type=float, default=500.0, help="publishes per second")
    p.add_argument("--loss", type=float, default=0.001, help="share of deliveries lost")
    p.add_argument("--dup", type=float, default=0.001, help="share of deliveries duplicated")
    p.add_argument("--drop-root", type=float, default=0.0005, help="share of publish spans lost")
    p.add_argument("--no-failover", dest="failover", action="store_false")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start-ns", type=int, default=DEFAULT_START_NS)
    args = p.parse_args(argv)
    if args.nodes < 2 or args.rf < 1 or args.files < 1 or args.rate <= 0:
        p.error("need --nodes >= 2, --rf >= 1, --files >= 1, --rate > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    handles = [
        (args.out / f"traces-{i:03d}.jsonl").open("w", encoding="utf-8") for i in range(args.files)
    ]
    try:
        writer = SpanWriter(handles)
        Generator(args, writer).run()
        writer.close()
    finally:
        for h in handles:
            h.close()
    print(f"wrote {writer.written:,} spans to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
