"""Killing the partition process makes the edge refuse new work with a clear error instead of
acknowledging it; restarting the partition restores service without restarting the edge."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid

from hexmq.mqtt import ConnAck, Disconnect, Properties, PubAck, Publish
from tests.support.rawclient import RawClient


def uid() -> str:
    return uuid.uuid4().hex[:10]


async def until_connack(
    port: int, version: int, timeout: float = 20.0
) -> tuple[RawClient, ConnAck]:
    """Connect until the node accepts again (the edge re-links on its own)."""
    async with asyncio.timeout(timeout):
        while True:
            client, connack = await RawClient.connect(port, f"probe-{uid()}", version=version)
            if connack.reason_code == 0:
                return client, connack
            await client.close()
            await asyncio.sleep(0.2)


async def test_edge_refuses_while_partition_is_down_and_recovers(hexmq_cluster) -> None:  # type: ignore[no-untyped-def]
    cluster = hexmq_cluster(nodes=1)
    port = cluster.mqtt_port(1)
    edge_pid = cluster.pids(1)["edge"]
    topic = f"outage/{uid()}"
    sub, _ = await RawClient.connect(
        port,
        f"sub-{uid()}",
        version=5,
        clean_start=False,
        properties=Properties(session_expiry_interval=600),
    )
    await sub.subscribe(topic, qos=1)
    pub5, _ = await RawClient.connect(port, f"pub5-{uid()}", version=5)
    pub4, _ = await RawClient.connect(port, f"pub4-{uid()}", version=4)
    # Request Problem Information 0 [MQTT-3.1.2-29], and a Maximum Packet Size with no room
    # for a Reason String [MQTT-3.4.2-2]: both get the failing PUBACK bare.
    quiet, _ = await RawClient.connect(
        port, f"quiet-{uid()}", version=5, properties=Properties(request_problem_information=False)
    )
    small, _ = await RawClient.connect(
        port, f"small-{uid()}", version=5, properties=Properties(maximum_packet_size=16)
    )
    assert (await pub5.publish(topic, b"before", qos=1)).reason_code == 0  # type: ignore[union-attr]
    before = await sub.expect(Publish)
    assert before.payload == b"before"
    assert before.packet_id is not None
    await sub.send(PubAck(before.packet_id))

    os.kill(cluster.pids(1)["partition"], signal.SIGKILL)
    await asyncio.sleep(0.5)  # the edge sees its link drop

    # 5.0: a failing PUBACK with a reason string, never a success.
    await pub5.send(Publish(topic, b"during", qos=1, packet_id=7))
    refused = await pub5.expect(PubAck)
    assert refused.packet_id == 7
    assert refused.reason_code == 0x80
    assert refused.properties.reason_string
    assert "unavailable" in refused.properties.reason_string
    for client in (quiet, small):
        await client.send(Publish(topic, b"during", qos=1, packet_id=9))
        bare = await client.expect(PubAck)
        assert (bare.packet_id, bare.reason_code) == (9, 0x80)
        assert bare.properties.reason_string is None
        await client.close()
    # 3.1.1 has no failing PUBACK: the connection closes without acknowledging.
    await pub4.send(Publish(topic, b"during", qos=1, packet_id=8))
    assert await pub4.wait_closed() == []
    await pub4.close()
    # New connections are refused as "server unavailable", in each protocol's own terms.
    for version, code in ((5, 0x88), (4, 3)):
        client, connack = await RawClient.connect(port, f"late-{uid()}", version=version)
        assert connack.reason_code == code
        await client.close()

    cluster.start(1)  # starts only what is not running: the partition service
    assert cluster.pids(1)["edge"] == edge_pid
    probe, _ = await until_connack(port, 5)
    await probe.close()

    # The publisher that stayed connected works again, and the subscriber's session, which was
    # live on the edge throughout, is re-attached and gets the message.
    assert (await pub5.publish(topic, b"after", qos=1)).reason_code == 0  # type: ignore[union-attr]
    got = await sub.expect(Publish, timeout=10)
    if got.payload == b"before":
        # Its PUBACK may have been lost with the killed process: then it comes again, as a
        # duplicate with its original packet id, and before anything newer.
        assert (got.dup, got.packet_id) == (True, before.packet_id)
        await sub.send(PubAck(before.packet_id))
        got = await sub.expect(Publish, timeout=10)
    assert (got.payload, got.dup) == (b"after", False)
    await pub5.send(Disconnect())
    for client in (pub5, sub):
        await client.close()


async def test_a_stalled_redis_stops_the_partition_service_and_nothing_is_acknowledged(  # type: ignore[no-untyped-def]
    hexmq_cluster,
) -> None:
    """Redis stops answering (SIGSTOP): the partition service's write times out (the Redis
    client's 5 s socket timeout), it exits with 1 and a line naming the failure, and the QoS 1
    PUBLISH that was waiting is never acknowledged. Once Redis runs again, `cluster start`
    brings the node back."""
    cluster = hexmq_cluster(nodes=1)
    port = cluster.mqtt_port(1)
    pids = cluster.pids(1)
    topic = f"stall/{uid()}"
    sub, _ = await RawClient.connect(port, f"sub-{uid()}", version=5)
    await sub.subscribe(topic, qos=1)
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
    os.kill(pids["redis"], signal.SIGSTOP)
    try:
        await pub.send(Publish(topic, b"stalled", qos=1, packet_id=7))
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(20):
            while True:
                if not _alive(pids["partition"]):
                    break
                await asyncio.sleep(0.1)
        waited = asyncio.get_running_loop().time() - started
        assert 4 <= waited < 15, waited
    finally:
        os.kill(pids["redis"], signal.SIGCONT)
    log = (cluster.dir / "node1" / "partition.log").read_text(errors="replace")
    assert "redis write failed" in log
    # What came back for the PUBLISH: never a success.
    packets = []
    with contextlib.suppress(TimeoutError):
        while (packet := await pub.recv(timeout=2)) is not None:
            packets.append(packet)
    assert not any(isinstance(p, PubAck) and p.reason_code == 0 for p in packets), packets
    cluster.start(1)
    again, _ = await until_connack(port, 5)
    assert (await again.publish(topic, b"after", qos=1)).reason_code == 0  # type: ignore[union-attr]
    for client in (sub, pub, again):
        await client.close()


def _alive(pid: int) -> bool:
    """Running (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
