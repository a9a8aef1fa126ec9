"""Bounded by default (issue 25): what one hostile or careless client can make the cluster hold.
Each limit refuses with its own reason code and nothing else (the connection stays, other
clients are served, round trip measured during each attack), and is counted in
`hexmq_limit_refusals_total{limit}` and `$SYS/broker/nodes/<node>/limits/<limit>`:

- topic levels (--max-topic-levels, 128): deeper filters get SUBACK 0x8F / 0x80;
- subscriptions per session (--max-subscriptions, 1,000): further filters 0x97 / 0x80;
- deliveries in flight (--max-inflight-messages, 1,024): fewer than a large Receive Maximum;
- a session's queue by count (--max-queued-messages, 1,000) and bytes (--max-queued-bytes);
- the Session Expiry Interval (--max-session-expiry, a day), 3.1.1 persistent sessions too;
- the cluster's retained messages by count and bytes: PUBACK 0x97, delivered all the same.

The defaults are tested on the package's one-node cluster (`node`); the caps themselves on a
node of its own with small ones (`capped`). The attacks' memory figures, before and after, are
bench/attacks.py's (docs/benchmarks.md, "Hostile clients").
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hexmq.mqtt import (
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.support.edgeproc import run_edge_expecting_failure
from tests.support.metrics import scrape
from tests.support.rawclient import RawClient
from tests.support.unique import uid

CAP_QUEUED_BYTES = 65536
CAP_RETAINED = 5
CAP_INFLIGHT = 20
CAP_EXPIRY = 2


@pytest.fixture(scope="module")
def capped(hexmq_cluster_module: Any) -> Any:
    """One node with small caps, $SYS every second."""
    return hexmq_cluster_module(
        nodes=1,
        extra=[
            f"--edge-arg=--max-inflight-messages={CAP_INFLIGHT}",
            f"--edge-arg=--max-session-expiry={CAP_EXPIRY}",
            "--edge-arg=--sys-interval=1",
            f"--partition-arg=--max-queued-bytes={CAP_QUEUED_BYTES}",
            f"--partition-arg=--max-retained-messages={CAP_RETAINED}",
        ],
    )


def rss_mib(cluster: Any, roles: tuple[str, ...] = ("edge", "partition", "redis")) -> float:
    total = 0
    for i in range(1, len(cluster.nodes) + 1):
        # A co-located node's process once for the services it runs (make test-colocated).
        for pid in {cluster.service_pid(i, role) for role in roles}:
            status = Path(f"/proc/{pid}/status").read_text()
            total += next(int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS"))
    return total / 1024


class Probe:
    """A well-behaved pair on the same node: QoS 1 round trips while an attack runs."""

    def __init__(self) -> None:
        self.round_trips: list[float] = []
        self.failures: list[str] = []

    @contextlib.asynccontextmanager
    async def running(self, port: int) -> AsyncIterator[Probe]:
        topic = f"probe/{uid()}"
        sub, _ = await RawClient.connect(port, f"probe-s-{uid()}", version=5)
        await sub.subscribe(topic, qos=1)
        pub, _ = await RawClient.connect(port, f"probe-p-{uid()}", version=5)
        stop = asyncio.Event()

        async def run() -> None:
            n = 0
            while not stop.is_set():
                n += 1
                t0 = time.monotonic()
                try:
                    await pub.publish(topic, b"%d" % n, qos=1, timeout=10)
                    while True:
                        got = await sub.expect(Publish, timeout=10)
                        assert got.packet_id is not None
                        await sub.send(PubAck(got.packet_id))
                        if got.payload == b"%d" % n:
                            break
                    self.round_trips.append(time.monotonic() - t0)
                except (TimeoutError, AssertionError) as exc:
                    self.failures.append(repr(exc))
                    return
                await asyncio.sleep(0.2)

        task = asyncio.create_task(run())
        try:
            yield self
        finally:
            stop.set()
            await task
            await sub.close()
            await pub.close()

    def assert_served(self, bound_s: float = 5.0) -> None:
        assert not self.failures, self.failures
        assert self.round_trips, "no round trip completed during the attack"
        assert max(self.round_trips) < bound_s, sorted(self.round_trips)[-5:]


async def subscribe_many(client: RawClient, filters: list[str]) -> list[int]:
    await client.send(
        Subscribe(client.next_packet_id(), tuple(Subscription(f, 1) for f in filters))
    )
    suback = await client.expect(SubAck, timeout=60)
    return list(suback.reason_codes)


async def publish_qos1(port: int, topic: str, payloads: list[bytes], window: int = 32) -> list[int]:
    """PUBACK reason codes of QoS 1 publishes with up to `window` unacknowledged."""
    client, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    codes: dict[int, int] = {}
    sent = 0
    while len(codes) < len(payloads):
        while sent < len(payloads) and sent - len(codes) < window:
            await client.send(Publish(topic, payloads[sent], qos=1, packet_id=sent % 65535 + 1))
            sent += 1
        ack = await client.expect(PubAck, timeout=30)
        codes[ack.packet_id] = ack.reason_code
    await client.close()
    return list(codes.values())


async def drain(client: RawClient, quiet: float = 2.0) -> list[bytes]:
    """Every PUBLISH until `quiet` seconds of silence, acknowledged; their payloads."""
    got: list[bytes] = []
    while True:
        try:
            packet = await client.recv(timeout=quiet)
        except TimeoutError:
            return got
        if packet is None:
            return got
        if isinstance(packet, Publish):
            got.append(packet.payload)
            if packet.packet_id is not None:
                await client.send(PubAck(packet.packet_id))


# ----- topic levels -------------------------------------------------------------------------


@pytest.mark.parametrize(("version", "code"), [(5, 0x8F), (4, 0x80)])
async def test_s4_7_3_filters_deeper_than_128_levels_get_0x8f_by_default(
    node: Any, version: int, code: int
) -> None:
    """40 SUBSCRIBEs of 64 KB filters with 32,000 levels: each cost every edge about 9 MiB and
    its partition as much (1.9 GiB across a 3-node cluster, kept after the client left). By
    default a filter has at most 128 levels (as EMQX): each is refused, 0x8F Topic Filter
    invalid (3.1.1: 0x80), nothing is stored, the connection stays, and the node's memory and
    other clients do not notice."""
    port = node.mqtt_port(1)
    before = rss_mib(node)
    client, _ = await RawClient.connect(port, f"deep-{uid()}", version=version)
    probe = Probe()
    async with probe.running(port):
        for i in range(40):
            levels = ["x"] * 32000
            levels[0] = f"d{i}-{uid()}"
            assert await subscribe_many(client, ["/".join(levels)]) == [code]
    probe.assert_served()
    # A filter of 128 levels is still a filter.
    assert await subscribe_many(client, ["/".join(["y"] * 128)]) == [1]
    assert rss_mib(node) - before < 100  # was some 700 MiB for one node
    await client.close()


# ----- subscriptions per session ---------------------------------------------------------------


@pytest.mark.parametrize(("version", "code"), [(5, 0x97), (4, 0x80)])
async def test_s3_9_3_subscriptions_past_the_sessions_cap_get_0x97(
    node: Any, version: int, code: int
) -> None:
    """One anonymous client subscribing 20,000 filters had them all. A session holds at most
    1,000 by default: the SUBACK refuses each filter past it with 0x97 Quota exceeded (3.1.1:
    0x80), grants the rest; a filter the session has already is replaced, not counted again;
    an UNSUBSCRIBE makes room."""
    port = node.mqtt_port(1)
    client, _ = await RawClient.connect(port, f"many-{uid()}", version=version)
    tag = uid()
    codes: list[int] = []
    for batch in range(7):
        codes += await subscribe_many(client, [f"m/{tag}/{batch}/{i}" for i in range(150)])
    assert codes == [1] * 1000 + [code] * 50
    assert await subscribe_many(client, [f"m/{tag}/0/0", f"m/{tag}/new"]) == [1, code]
    await client.close()


# ----- deliveries in flight, and the queue --------------------------------------------------


async def test_mqtt_3_3_4_9_the_server_sends_fewer_than_a_large_receive_maximum(
    capped: Any,
) -> None:
    """MQTT-3.3.4-9: the server sends at most Receive Maximum unacknowledged QoS 1/2
    PUBLISHes; MQTT 5.0 lets it send fewer (3.3.4). A client announcing 65535 gets at most
    --max-inflight-messages (20 here; 1,024 by default) in flight, then one more for each
    PUBACK."""
    port = capped.mqtt_port(1)
    topic = f"inflight/{uid()}"
    sub, _ = await RawClient.connect(
        port, f"sub-{uid()}", version=5, properties=Properties(receive_maximum=65535)
    )
    await sub.subscribe(topic, qos=1)
    assert set(await publish_qos1(port, topic, [b"%d" % i for i in range(50)])) == {0}
    first = [await sub.expect(Publish) for _ in range(CAP_INFLIGHT)]
    assert await sub.silent(1.0)
    for packet in first[:5]:
        assert packet.packet_id is not None
        await sub.send(PubAck(packet.packet_id))
    more = [await sub.expect(Publish) for _ in range(5)]
    assert await sub.silent(1.0)
    assert [p.payload for p in first + more] == [b"%d" % i for i in range(25)]
    await sub.close()


async def test_s4_9_a_subscriber_that_never_reads_holds_at_most_its_queue(node: Any) -> None:
    """A 5.0 subscriber announcing Receive Maximum 65535 and never reading, fed 16 KB QoS 1
    messages: before, every one was kept on every replica and pushed at its edge (1.4 GB for
    12,000). Now its session holds at most 1,000 (the rest are not queued for it, counted),
    the publisher is acknowledged throughout, another client is served meanwhile, and when
    the subscriber reads at last it finds the first 1,000."""
    port = node.mqtt_port(1)
    topic = f"slow/{uid()}"
    sub, _ = await RawClient.connect(
        port, f"slow-{uid()}", version=5, properties=Properties(receive_maximum=65535)
    )
    await sub.subscribe(topic, qos=1)
    payload = b"p" * 16384
    probe = Probe()
    async with probe.running(port):
        codes = await publish_qos1(port, topic, [b"%05d" % i + payload for i in range(1500)])
    probe.assert_served()
    assert set(codes) == {0}
    got = await drain(sub)
    assert sorted({p[:5] for p in got}) == [b"%05d" % i for i in range(1000)]
    await sub.close()


async def test_s4_1_1_an_offline_sessions_queue_is_capped_at_1000_by_default(node: Any) -> None:
    """An offline persistent session was kept every message (default 100,000, no byte cap):
    now 1,000 by default, as mosquitto and EMQX; the publisher is acknowledged for each."""
    port = node.mqtt_port(1)
    cid, topic = f"offline-{uid()}", f"offline/{uid()}"
    sub, _ = await RawClient.connect(port, cid, version=4, clean_start=False)
    await sub.subscribe(topic, qos=1)
    await sub.close()
    codes = await publish_qos1(port, topic, [b"%05d" % i for i in range(1200)])
    assert set(codes) == {0}
    back, connack = await RawClient.connect(port, cid, version=4, clean_start=False)
    assert connack.session_present
    got = await drain(back)
    assert got == [b"%05d" % i for i in range(1000)]
    await back.close()


async def test_s4_1_1_a_sessions_queue_is_capped_by_bytes(capped: Any) -> None:
    """--max-queued-bytes (64 KiB here, 16 MiB by default) counts payload and topic of every
    message the session holds, sent or not: of 40 messages of 4 KiB to a subscriber that
    does not read, the first 15 fit."""
    port = capped.mqtt_port(1)
    topic = f"bytes/{uid()}"
    sub, _ = await RawClient.connect(port, f"bytes-{uid()}", version=5)
    await sub.subscribe(topic, qos=1)
    payloads = [b"%02d" % i + b"b" * 4094 for i in range(40)]
    assert set(await publish_qos1(port, topic, payloads)) == {0}
    fit = CAP_QUEUED_BYTES // (4096 + len(topic))
    assert [p[:2] for p in await drain(sub)] == [b"%02d" % i for i in range(fit)]
    await sub.close()


# ----- session expiry --------------------------------------------------------------------------


async def test_s3_2_2_3_2_the_session_expiry_interval_is_capped(capped: Any) -> None:
    """MQTT 5.0 3.2.2.3.2: a server that uses another Session Expiry Interval than the
    client's says so in CONNACK. A 5.0 client asking for an hour is granted
    --max-session-expiry (2 s here, a day by default), and so is a 3.1.1 clean-session-0
    session, which used to be kept forever: gone once the cap has passed."""
    port = capped.mqtt_port(1)
    v5, connack = await RawClient.connect(
        port, f"exp5-{uid()}", version=5, properties=Properties(session_expiry_interval=3600)
    )
    assert connack.properties.session_expiry_interval == CAP_EXPIRY
    await v5.close()
    within, connack = await RawClient.connect(
        port, f"exp1-{uid()}", version=5, properties=Properties(session_expiry_interval=1)
    )
    assert connack.properties.session_expiry_interval is None  # granted as asked
    await within.close()
    cid = f"exp4-{uid()}"
    old, _ = await RawClient.connect(port, cid, version=4, clean_start=False)
    await old.subscribe(f"exp/{uid()}", qos=1)
    await old.close()
    back, connack = await RawClient.connect(port, cid, version=4, clean_start=False)
    assert connack.session_present  # within the cap
    await back.close()
    await asyncio.sleep(CAP_EXPIRY + 1.5)
    gone, connack = await RawClient.connect(port, cid, version=4, clean_start=False)
    assert not connack.session_present
    await gone.close()


# ----- retained messages ------------------------------------------------------------------------


async def test_s3_3_1_5_retained_messages_past_the_clusters_cap_get_0x97(capped: Any) -> None:
    """The cluster holds at most --max-retained-messages (5 here, 1,000,000 by default) and
    --max-retained-bytes. A retained PUBLISH for a new topic past it still reaches the current
    subscribers, but is not retained: a 5.0 publisher hears PUBACK 0x97 Quota exceeded with
    the reason, a 3.1.1 one is acknowledged (it has no failing code). A topic's own retained
    message may always be replaced or deleted."""
    port = capped.mqtt_port(1)
    tag = uid()
    live, _ = await RawClient.connect(port, f"live-{uid()}", version=5)
    await live.subscribe(f"cap/{tag}/#", qos=1)
    pub, _ = await RawClient.connect(port, f"ret-{uid()}", version=5)
    codes = []
    for i in range(CAP_RETAINED + 1):
        await pub.send(Publish(f"cap/{tag}/{i}", b"v%d" % i, qos=1, retain=True, packet_id=i + 1))
        ack = await pub.expect(PubAck)
        codes.append(ack.reason_code)
    assert codes == [0] * CAP_RETAINED + [0x97]
    assert "retained messages" in (ack.properties.reason_string or "")
    delivered = [(await live.expect(Publish)).payload for _ in range(CAP_RETAINED + 1)]
    assert delivered == [b"v%d" % i for i in range(CAP_RETAINED + 1)]
    # Replacing one is no new one.
    await pub.send(Publish(f"cap/{tag}/0", b"new", qos=1, retain=True, packet_id=50))
    assert (await pub.expect(PubAck)).reason_code == 0
    v311, _ = await RawClient.connect(port, f"ret4-{uid()}", version=4)
    assert (await v311.publish(f"cap/{tag}/x", b"x", qos=1)).reason_code == 0
    later, _ = await RawClient.connect(port, f"later-{uid()}", version=5)
    await later.subscribe(f"cap/{tag}/#", qos=1, live_first=True)
    kept = sorted([(await later.expect(Publish)).payload for _ in range(CAP_RETAINED)])
    assert kept == sorted([b"new", *[b"v%d" % i for i in range(1, CAP_RETAINED)]])
    assert await later.silent(1.0)
    for c in (live, pub, v311, later):
        await c.close()
    # Deleting makes room again (for the next test's topics too).
    cleaner, _ = await RawClient.connect(port, f"clean-{uid()}", version=5)
    for i in range(CAP_RETAINED):
        await cleaner.send(Publish(f"cap/{tag}/{i}", b"", qos=1, retain=True, packet_id=i + 1))
        await cleaner.expect(PubAck)
    await cleaner.close()


# ----- counted ---------------------------------------------------------------------------------


async def test_s4_7_2_each_refusal_is_counted_in_metrics_and_sys(capped: Any) -> None:
    """Every limit counts what it turned away: hexmq_limit_refusals_total{limit} on the
    service that judged it (edge or partition), and $SYS/broker/nodes/<node>/limits/<limit>
    (both services' figures, through the node's edge)."""
    port = capped.mqtt_port(1)
    client, _ = await RawClient.connect(
        port, f"count-{uid()}", version=5, properties=Properties(session_expiry_interval=99)
    )
    assert await subscribe_many(client, ["/".join(["z"] * 200)]) == [0x8F]
    await client.close()
    metrics = capped.node(1)["metrics_ports"]

    def refusals(service: str, limit: str) -> float:
        return scrape(metrics[service]).get(
            ("hexmq_limit_refusals_total", (("limit", limit),)), 0.0
        )

    deadline = time.monotonic() + 10
    while refusals("edge", "topic_levels") < 1 or refusals("edge", "session_expiry") < 1:
        assert time.monotonic() < deadline, "edge limit counters not exported"
        await asyncio.sleep(0.3)
    sys_watch, _ = await RawClient.connect(port, f"sys-{uid()}", version=5)
    await sys_watch.subscribe("$SYS/broker/nodes/n1/limits/#", qos=0)
    seen: dict[str, int] = {}
    deadline = time.monotonic() + 10
    while not {"topic_levels", "queued_bytes", "retained_messages"} <= seen.keys():
        assert time.monotonic() < deadline, f"$SYS limits seen: {seen}"
        packet = await sys_watch.expect(Publish, timeout=5)
        seen[packet.topic.rsplit("/", 1)[1]] = int(packet.payload)
    assert seen["topic_levels"] >= 1
    await sys_watch.close()


def test_bad_limit_values_stop_the_services() -> None:
    """A limit the service cannot keep stops it at startup, naming the option (exit 2)."""
    for args, named in (
        (["--max-inflight-messages=0"], "--max-inflight-messages"),
        (["--max-session-expiry=-1"], "--max-session-expiry"),
        (["--clientid-prefixes=%u"], "--clientid-prefixes"),
    ):
        code, err = run_edge_expecting_failure(args)
        assert code == 2, err
        assert named in err
