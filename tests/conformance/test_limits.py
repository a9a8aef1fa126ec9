"""A session's queue is bounded (--max-queued-messages): past it the newest message is not
queued for that session, or (--queue-overflow drop-oldest) the oldest makes room."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hexmq.mqtt import Disconnect, PubAck, Publish
from tests.integration.test_metrics import scrape
from tests.support.rawclient import RawClient


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("drop-newest", [b"0", b"1", b"2", b"3", b"4"]),
        ("drop-oldest", [b"3", b"4", b"5", b"6", b"7"]),
    ],
)
async def test_a_full_session_queue_drops_by_policy(
    hexmq_cluster, policy: str, expected: list[bytes]
) -> None:  # type: ignore[no-untyped-def]
    cluster = hexmq_cluster(
        nodes=1,
        extra=[
            "--partition-arg=--max-queued-messages=5",
            f"--partition-arg=--queue-overflow={policy}",
        ],
    )
    port = cluster.mqtt_port(1)
    client_id, topic = f"bounded-{uuid.uuid4().hex[:8]}", f"b/{uuid.uuid4().hex[:8]}"
    sub, _ = await RawClient.connect(port, client_id, clean_start=False)
    await sub.subscribe(topic, qos=1)
    await sub.send(Disconnect())
    await sub.close()
    pub, _ = await RawClient.connect(port, f"pub-{uuid.uuid4().hex[:8]}")
    for i in range(8):
        ack = await pub.publish(topic, f"{i}".encode(), qos=1)
        assert ack is not None
        assert ack.reason_code == 0  # the publisher is not punished for a slow subscriber
    await pub.close()

    sub, connack = await RawClient.connect(port, client_id, clean_start=False)
    assert connack.session_present is True
    got = []
    for _ in range(5):
        packet = await sub.expect(Publish)
        got.append(packet.payload)
        assert packet.packet_id is not None
        await sub.send(PubAck(packet.packet_id))
    assert got == expected
    # Nothing beyond the limit was kept: a marker published now is the next delivery.
    pub, _ = await RawClient.connect(port, f"pub-{uuid.uuid4().hex[:8]}")
    await pub.publish(topic, b"marker", qos=1)
    assert (await sub.expect(Publish)).payload == b"marker"
    for client in (pub, sub):
        await client.close()

    # The three messages the limit turned away are counted.
    port = cluster.node(1)["metrics_ports"]["partition"]
    dropped = ("hexmq_dropped_messages_total", (("reason", "queue_full"),))
    counted = None
    async with asyncio.timeout(10):  # the partition copies its counters out once a second
        while counted != 3:
            await asyncio.sleep(0.2)
            counted = (await asyncio.to_thread(scrape, port)).get(dropped)
