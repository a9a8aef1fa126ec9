"""Several edge processes per node (`hexmq cluster up --edges-per-node 2`, issue 28): they
share the node's MQTT port (SO_REUSEPORT), the kernel spreads clients over them, and when one
is killed its clients reconnect to the other and find their sessions while the other's
clients are untouched (docs/operations.md, "Several edges per node")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any

import pytest

from hexmq.mqtt import Properties, PubAck, Publish
from tests.conftest import HexmqCluster
from tests.support.rawclient import RawClient
from tests.support.unique import uid

PERSISTENT = Properties(session_expiry_interval=600)
CLIENTS = 24
# How long a client of the surviving edge must see its connection stay open after the kill.
QUIET_S = 3.0


def edge_connections(cluster: HexmqCluster) -> dict[str, int]:
    """Each edge of node 1's open client connections, as `hexmq cluster status` reads them
    from its metrics."""
    links: dict[str, Any] = cluster.status()["nodes"][0]["links"]
    connections: dict[str, int] = links.get("connections", {})
    return connections


def wait_for_connections(
    cluster: HexmqCluster, wanted: int, timeout: float = 30.0
) -> dict[str, int]:
    """The edges' connection counts once they add up to `wanted` (the metrics follow within
    a second)."""
    deadline = time.monotonic() + timeout
    while True:
        counts = edge_connections(cluster)
        if sum(counts.values()) == wanted or time.monotonic() > deadline:
            return counts
        time.sleep(0.5)


async def closed_by_the_server(client: RawClient) -> bool:
    """True if the server ends the connection within QUIET_S, False if it stays open."""
    try:
        await client.wait_closed(QUIET_S)
    except TimeoutError:
        return False
    except (ConnectionError, OSError):
        return True
    return True


async def sys_value(port: int, topic: str, wanted: bytes, timeout: float = 30.0) -> bytes:
    """The retained $SYS value on `topic` once it is `wanted` (or the last one seen)."""
    client, _ = await RawClient.connect(port, f"sys-{uid()}", version=5)
    seen = b""
    try:
        await client.subscribe(topic, qos=0, live_first=True)
        deadline = time.monotonic() + timeout
        while seen != wanted and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                packet = await client.recv(timeout=2.0)
                if isinstance(packet, Publish):
                    seen = packet.payload
    finally:
        await client.close()
    return seen


@pytest.mark.timeout(300)
async def test_a_nodes_two_edges_share_its_port_and_one_can_die(hexmq_cluster) -> None:
    cluster: HexmqCluster = hexmq_cluster(
        nodes=1,
        partitions=16,
        extra=["--edges-per-node", "2", "--edge-arg=--sys-interval=1"],
    )
    port = cluster.mqtt_port(1)
    before = cluster.pids(1)
    assert set(before) == {"redis", "membership", "partition", "edge", "edge2"}
    processes = cluster.status()["nodes"][0]["processes"]
    assert processes["edge2"]["alive"]
    assert processes["edge2"]["port"] == port

    topic = f"edges/{uid()}"
    clients: dict[str, RawClient] = {}
    try:
        for k in range(CLIENTS):
            cid = f"e{k}-{uid()}"
            client, connack = await RawClient.connect(
                port, cid, version=5, clean_start=True, properties=PERSISTENT
            )
            assert connack.reason_code == 0
            assert (await client.subscribe(f"{topic}/{cid}", qos=1)).reason_codes == (1,)
            clients[cid] = client

        # The kernel spread them over both edges.
        counts = wait_for_connections(cluster, CLIENTS)
        assert sum(counts.values()) == CLIENTS, counts
        assert counts["edge"] > 0, counts
        assert counts["edge2"] > 0, counts
        # The node's $SYS figures count both edges' clients (and the $SYS reader's own).
        connected = await sys_value(
            port, "$SYS/broker/nodes/n1/clients/connected", str(CLIENTS + 1).encode()
        )
        assert connected == str(CLIENTS + 1).encode()

        os.kill(before["edge2"], signal.SIGKILL)
        closed = await asyncio.gather(*(closed_by_the_server(c) for c in clients.values()))
        gone = [cid for cid, was in zip(clients, closed, strict=True) if was]
        # Exactly the killed edge's clients lost their connection; the others stayed open.
        assert len(gone) == counts["edge2"], (gone, counts)

        # A publisher (on the surviving edge, the only one left listening) reaches every
        # session: live on the open connections, queued for the gone ones.
        publisher, _ = await RawClient.connect(port, f"pub-{uid()}", version=5)
        try:
            for cid in clients:
                ack = await publisher.publish(f"{topic}/{cid}", cid.encode(), qos=1)
                assert isinstance(ack, PubAck)
                assert ack.reason_code == 0
        finally:
            await publisher.close()
        for cid, client in clients.items():
            if cid in gone:
                await client.close()
                client, connack = await RawClient.connect(
                    port, cid, version=5, clean_start=False, properties=PERSISTENT
                )
                clients[cid] = client
                assert connack.reason_code == 0, cid
                assert connack.session_present, cid
            delivery = await client.expect(Publish)
            assert (delivery.topic, delivery.payload) == (f"{topic}/{cid}", cid.encode())

        # `start` brings the killed edge back beside its running sibling.
        cluster.start(1)
        after = cluster.pids(1)
        assert after["edge"] == before["edge"]
        assert after["edge2"] != before["edge2"]
        processes = cluster.status()["nodes"][0]["processes"]
        assert all(p["alive"] for p in processes.values()), processes
    finally:
        for client in clients.values():
            await client.close()
