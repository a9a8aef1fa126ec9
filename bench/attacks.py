"""Hostile and careless clients against a 3-node RF 3 cluster: `python -m bench.attacks`
(`make bench-attacks`; issue 25).

Each attack runs on a fresh `hexmq cluster up --nodes 3 --rf 3` (its defaults, plus any
HEXMQ_* variable set in this process's environment, which `hexmq cluster` passes on to every
service). The figures are the resident memory (VmRSS) of every process of the cluster (edges,
partition services, Redis, membership agents), read before the attack, once it is done and
(where the attacker leaves) after it left, and the round trip of a well-behaved pair of
clients meanwhile: a QoS 1 publisher on node 3 and a subscriber on node 2, one message every
200 ms, from before the attack until the last reading.

Attacks:

- `deep_filters`: one client sends 40 SUBSCRIBEs, each one filter of about 64 KB with
  32,000 levels, then leaves.
- `inflight`: a 5.0 subscriber on node 1 with Receive Maximum 65535 that never reads its
  socket, fed 12,000 x 16 KB QoS 1 messages by a publisher on node 2.
- `offline_queue`: a persistent session (3.1.1, clean session 0) subscribes and leaves; a
  publisher sends it 5,000 x 16 KB QoS 1; the session then comes back and counts what it gets.
- `subscriptions`: one anonymous client subscribes 20,000 filters (100 per SUBSCRIBE).
- `sessions`: 3,000 3.1.1 clean-session-0 sessions made in a loop, each connecting once.
- `retained`: 50,000 retained messages (10 per `ret/<group>/+`), then SUBSCRIBEs of
  `ret/<group>/+` (each matching 10): the partition services' CPU per SUBSCRIBE, beside the
  same with 1,000 stored.

Results go to bench/results/attacks-<stamp>.json; `--label` names the run (before/after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.brokers import LOOPBACK, Hexmq
from bench.report import RESULTS_DIR, machine_facts, result_stem
from bench.stats import CLOCK_TICKS, latency_summary, process_ticks
from hexmq.mqtt import (
    NEED_DATA,
    ConnAck,
    Connect,
    Disconnect,
    MQTTConnection,
    Packet,
    Properties,
    PubAck,
    Publish,
    Role,
    SubAck,
    Subscribe,
    Subscription,
)

ATTACKS = ("deep_filters", "inflight", "offline_queue", "subscriptions", "sessions", "retained")
PROBE_INTERVAL_S = 0.2
# A probe message not back within this counts as lost for the run.
PROBE_TIMEOUT_S = 10.0
SETTLE_S = 3.0


class Client:
    """A minimal MQTT client on hexmq's own codec (no library hides what the broker does)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int):
        self.reader = reader
        self.writer = writer
        self.codec = MQTTConnection(Role.CLIENT, protocol_version=version)
        self.pid = 0

    @classmethod
    async def connect(
        cls,
        port: int,
        client_id: str,
        *,
        version: int = 4,
        clean: bool = True,
        properties: Properties | None = None,
        keepalive: int = 0,
    ) -> tuple[Client, ConnAck]:
        reader, writer = await asyncio.open_connection(LOOPBACK, port, limit=1 << 22)
        client = cls(reader, writer, version)
        await client.send(
            Connect(
                client_id,
                protocol_version=version,
                clean_start=clean,
                keepalive=keepalive,
                properties=properties or Properties(),
            )
        )
        connack = await client.recv(30)
        assert isinstance(connack, ConnAck), connack
        return client, connack

    def next_pid(self) -> int:
        self.pid = self.pid % 65535 + 1
        return self.pid

    async def send(self, packet: Packet) -> None:
        self.writer.write(self.codec.send(packet))
        await self.writer.drain()

    async def recv(self, timeout: float = 30) -> Packet | None:  # noqa: ASYNC109
        async with asyncio.timeout(timeout):
            while True:
                event = self.codec.next_event()
                if event is not NEED_DATA:
                    return event
                data = await self.reader.read(1 << 20)
                if not data:
                    return None
                self.codec.receive_data(data)

    async def subscribe(self, filters: list[str], qos: int = 1) -> SubAck | None:
        await self.send(Subscribe(self.next_pid(), tuple(Subscription(f, qos) for f in filters)))
        while True:
            packet = await self.recv(60)
            if packet is None or isinstance(packet, SubAck):
                return packet

    async def close(self) -> None:
        try:
            self.writer.write(self.codec.send(Disconnect()))
        except Exception:
            pass
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def publish_many(client: Client, topic_of: Any, n: int, payload: bytes, window: int) -> int:
    """Publish `n` QoS 1 messages (`topic_of(i)`) with up to `window` unacknowledged; returns
    how many PUBACKs came with a success code."""
    done = asyncio.Event()
    ok = 0
    acked = 0
    free = asyncio.Semaphore(window)

    async def reader() -> None:
        nonlocal ok, acked
        while acked < n:
            packet = await client.recv(120)
            if packet is None:
                break
            if isinstance(packet, PubAck):
                acked += 1
                ok += packet.reason_code < 0x80
                free.release()
        done.set()

    task = asyncio.create_task(reader())
    for i in range(n):
        await free.acquire()
        client.writer.write(
            client.codec.send(Publish(topic_of(i), payload, qos=1, packet_id=client.next_pid()))
        )
        if i % 32 == 31:
            await client.writer.drain()
    await client.writer.drain()
    await done.wait()
    task.cancel()
    return ok


class Probe:
    """A well-behaved pair: QoS 1 from node 3 to a subscriber on node 2, every 200 ms."""

    def __init__(self, pub_port: int, sub_port: int, tag: str) -> None:
        self.pub_port = pub_port
        self.sub_port = sub_port
        self.topic = f"probe/{tag}"
        self.samples: list[int] = []
        self.lost = 0
        self.sent: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None
        self.mark = 0

    async def start(self) -> None:
        self.sub, _ = await Client.connect(self.sub_port, f"probe-sub-{self.topic}")
        await self.sub.subscribe([self.topic], qos=1)
        self.pub, _ = await Client.connect(self.pub_port, f"probe-pub-{self.topic}")
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        reader = asyncio.create_task(self._read())
        pub_reader = asyncio.create_task(self._drain_pub())
        try:
            seq = 0
            while True:
                seq += 1
                self.sent[seq] = time.monotonic_ns()
                await self.pub.send(
                    Publish(
                        self.topic,
                        seq.to_bytes(8, "big"),
                        qos=1,
                        packet_id=self.pub.next_pid(),
                    )
                )
                now = time.monotonic_ns()
                for s, at in list(self.sent.items()):
                    if now - at > PROBE_TIMEOUT_S * 1e9:
                        del self.sent[s]
                        self.lost += 1
                await asyncio.sleep(PROBE_INTERVAL_S)
        finally:
            reader.cancel()
            pub_reader.cancel()

    async def _drain_pub(self) -> None:
        while await self.pub.recv(3600) is not None:
            pass

    async def _read(self) -> None:
        while True:
            packet = await self.sub.recv(3600)
            if packet is None:
                return
            if isinstance(packet, Publish):
                if packet.packet_id is not None:
                    await self.sub.send(PubAck(packet.packet_id))
                seq = int.from_bytes(packet.payload[:8], "big")
                at = self.sent.pop(seq, None)
                if at is not None:
                    self.samples.append(time.monotonic_ns() - at)

    def begin(self) -> None:
        """Round trips from here on count for the attack."""
        self.mark = len(self.samples)
        self.lost = 0

    def summary(self) -> dict[str, Any]:
        return {**latency_summary(self.samples[self.mark :]), "lost": self.lost}

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.sub.close()
        await self.pub.close()


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def memory(broker: Hexmq) -> dict[str, Any]:
    """Resident memory of the cluster's processes, MiB, by role and in all."""
    by_role: dict[str, float] = {}
    for node in broker.node_pids:
        for role, pid in node.items():
            kib = rss_kib(pid) or 0
            by_role[role] = by_role.get(role, 0.0) + kib / 1024
    return {
        "total_mib": round(sum(by_role.values()), 1),
        **{f"{role}_mib": round(v, 1) for role, v in sorted(by_role.items())},
    }


def growth(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    return {k: round(after[k] - before[k], 1) for k in before if k in after}


def partition_ticks(broker: Hexmq) -> int:
    return sum(process_ticks(node["partition"]) or 0 for node in broker.node_pids)


async def attack_deep_filters(broker: Hexmq, result: dict[str, Any]) -> None:
    client, _ = await Client.connect(broker.ports[0], "attacker-deep")
    codes: list[int] = []
    closed = False
    for i in range(40):
        levels = ["x"] * 32000
        levels[0] = f"d{i}"
        try:
            suback = await client.subscribe(["/".join(levels)])
        except (ConnectionError, TimeoutError):
            suback = None
        if suback is None:
            closed = True
            break
        codes.extend(suback.reason_codes)
    result["suback_codes"] = {f"0x{c:02x}": codes.count(c) for c in sorted(set(codes))}
    result["disconnected"] = closed
    await asyncio.sleep(SETTLE_S)
    result["memory_after_attack"] = memory(broker)
    await client.close()
    await asyncio.sleep(SETTLE_S)
    result["memory_after_leaving"] = memory(broker)


async def attack_inflight(broker: Hexmq, result: dict[str, Any]) -> None:
    sub, _ = await Client.connect(
        broker.ports[0],
        "attacker-slow",
        version=5,
        properties=Properties(receive_maximum=65535),
    )
    await sub.subscribe(["flood/#"], qos=1)
    # From here the subscriber never reads its socket.
    pub, _ = await Client.connect(broker.ports[1], "flood-pub")
    t0 = time.monotonic()
    result["acknowledged"] = await publish_many(
        pub, lambda i: f"flood/{i % 16}", 12000, os.urandom(16 * 1024), window=64
    )
    result["publish_s"] = round(time.monotonic() - t0, 1)
    await asyncio.sleep(SETTLE_S)
    result["memory_after_attack"] = memory(broker)
    await pub.close()
    sub.writer.close()
    await asyncio.sleep(SETTLE_S)
    result["memory_after_leaving"] = memory(broker)


async def attack_offline_queue(broker: Hexmq, result: dict[str, Any]) -> None:
    sub, _ = await Client.connect(broker.ports[0], "attacker-offline", clean=False)
    await sub.subscribe(["offline/#"], qos=1)
    await sub.close()
    pub, _ = await Client.connect(broker.ports[1], "offline-pub")
    result["acknowledged"] = await publish_many(
        pub, lambda i: f"offline/{i % 16}", 5000, os.urandom(16 * 1024), window=64
    )
    await pub.close()
    await asyncio.sleep(SETTLE_S)
    result["memory_after_attack"] = memory(broker)
    sub, _ = await Client.connect(broker.ports[0], "attacker-offline", clean=False)
    got = 0
    while True:
        try:
            packet = await sub.recv(3)
        except TimeoutError:
            break
        if packet is None:
            break
        if isinstance(packet, Publish):
            got += 1
            if packet.packet_id is not None:
                await sub.send(PubAck(packet.packet_id))
    result["queued_messages_delivered"] = got
    await sub.close()


async def attack_subscriptions(broker: Hexmq, result: dict[str, Any]) -> None:
    client, _ = await Client.connect(broker.ports[0], "attacker-subs")
    granted = refused = 0
    for batch in range(200):
        suback = await client.subscribe([f"subs/{batch}/{i}/+" for i in range(100)])
        if suback is None:
            result["disconnected_after"] = granted + refused
            break
        granted += sum(c < 0x80 for c in suback.reason_codes)
        refused += sum(c >= 0x80 for c in suback.reason_codes)
    result["granted"] = granted
    result["refused"] = refused
    await asyncio.sleep(SETTLE_S)
    result["memory_after_attack"] = memory(broker)
    await client.close()


async def attack_sessions(broker: Hexmq, result: dict[str, Any]) -> None:
    made = 0
    for i in range(3000):
        client, connack = await Client.connect(
            broker.ports[i % 3], f"attacker-session-{i}", clean=False
        )
        made += connack.reason_code == 0
        await client.close()
    result["sessions_made"] = made
    await asyncio.sleep(SETTLE_S)
    result["memory_after_attack"] = memory(broker)


async def store_retained(
    port: int, first: int, last: int, *, payload: int, pause_s: float, settle_s: float
) -> None:
    """Publish retained messages `ret/<i // 10>/<i % 10>` for i in [first, last) through the
    node at `port` (QoS 0, `pause_s` after every 256), then wait `settle_s` for the
    partitions to take them."""
    pub, _ = await Client.connect(port, f"retained-store-{first}")
    for i in range(first, last):
        pub.writer.write(
            pub.codec.send(Publish(f"ret/{i // 10}/{i % 10}", b"r" * payload, retain=True))
        )
        if i % 256 == 255:
            await pub.writer.drain()
            await asyncio.sleep(pause_s)
    await pub.writer.drain()
    await pub.close()
    await asyncio.sleep(settle_s)


async def subscribe_cost(
    port: int,
    stored: int,
    cpu_ticks: Callable[[], int],
    *,
    wait_s: float,
    strict: bool,
    rounds: int = 40,
) -> dict[str, Any]:
    """`rounds` SUBSCRIBEs of `ret/<group>/+` through the node at `port`, each waiting for its
    10 retained messages (at most `wait_s` for the next one: past it, `strict` raises
    TimeoutError, else the round ends with what came); the CPU `cpu_ticks` counts, per
    SUBSCRIBE."""
    client, _ = await Client.connect(port, f"retained-sub-{stored}")
    before = cpu_ticks()
    t0 = time.monotonic()
    got = 0
    for r in range(rounds):
        await client.subscribe([f"ret/{(r * 37) % (stored // 10)}/+"], qos=0)
        matched = 0
        while matched < 10:
            try:
                packet = await client.recv(wait_s)
            except TimeoutError:
                if strict:
                    raise
                break
            if isinstance(packet, Publish):
                matched += 1
        got += matched
    elapsed = time.monotonic() - t0
    ticks = cpu_ticks() - before
    await client.close()
    return {
        "stored": stored,
        "subscribes": rounds,
        "retained_received": got,
        "partition_cpu_ms_per_subscribe": round(ticks / CLOCK_TICKS * 1000 / rounds, 1),
        "wall_ms_per_subscribe": round(elapsed * 1000 / rounds, 1),
    }


async def attack_retained(broker: Hexmq, result: dict[str, Any]) -> None:
    def cpu() -> int:
        return partition_ticks(broker)

    await store_retained(broker.ports[1], 0, 1000, payload=64, pause_s=0.02, settle_s=SETTLE_S)
    result["small"] = await subscribe_cost(broker.ports[0], 1000, cpu, wait_s=2, strict=False)
    await store_retained(broker.ports[1], 1000, 50000, payload=64, pause_s=0.02, settle_s=SETTLE_S)
    result["large"] = await subscribe_cost(broker.ports[0], 50000, cpu, wait_s=2, strict=False)
    result["memory_after_attack"] = memory(broker)


async def run_attack(name: str) -> dict[str, Any]:
    broker = Hexmq(3, 3, settings={})  # the defaults (and this process's HEXMQ_*)
    result: dict[str, Any] = {"attack": name}
    broker.start()
    try:
        probe = Probe(broker.ports[2], broker.ports[1], name)
        await probe.start()
        await asyncio.sleep(2)
        result["memory_before"] = memory(broker)
        probe.begin()
        t0 = time.monotonic()
        await globals()[f"attack_{name}"](broker, result)
        result["seconds"] = round(time.monotonic() - t0, 1)
        result["probe_round_trip"] = probe.summary()
        await probe.stop()
        for key in ("memory_after_attack", "memory_after_leaving"):
            if key in result:
                result[key.replace("memory", "growth")] = growth(
                    result["memory_before"], result[key]
                )
        result["findings"] = broker.findings()
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        broker.stop()
        broker.cleanup(keep=False)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.attacks", description=__doc__)
    parser.add_argument("--attacks", default=",".join(ATTACKS), help="comma-separated")
    parser.add_argument("--label", default="", help="names the run in its results (before, after)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    names = [a for a in args.attacks.split(",") if a]
    for name in names:
        if name not in ATTACKS:
            parser.error(f"unknown attack {name!r} (one of {', '.join(ATTACKS)})")
    machine = machine_facts()
    doc: dict[str, Any] = {
        "label": args.label,
        "machine": machine,
        "environment": {k: v for k, v in os.environ.items() if k.startswith("HEXMQ_")},
        "attacks": [],
    }
    for name in names:
        print(f"bench.attacks: {name} ...", file=sys.stderr, flush=True)
        result = asyncio.run(run_attack(name))
        doc["attacks"].append(result)
        print(json.dumps(result, indent=1), file=sys.stderr, flush=True)
    path = args.out or RESULTS_DIR / f"attacks-{args.label or 'run'}-{result_stem(machine)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
