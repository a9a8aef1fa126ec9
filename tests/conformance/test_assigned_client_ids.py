"""Assigned Client Identifiers (MQTT 5.0 3.2.2.3.7) are unique across the cluster: clients with
an empty ClientID connecting at once through every node each get their own, and each keeps its
connection (a shared id would make the later CONNECT take the earlier session over)."""

from __future__ import annotations

import asyncio

from hexmq.mqtt import ConnAck, Connect, PingReq, PingResp, Properties
from tests.support.rawclient import RawClient

PER_NODE = 8


async def connect_empty_id(port: int) -> tuple[RawClient, ConnAck]:
    client = await RawClient.open(port, 5)
    props = Properties(session_expiry_interval=300)
    await client.send(Connect(client_id="", protocol_version=5, properties=props))
    return client, await client.expect(ConnAck)


async def test_mqtt_3_2_2_16_assigned_client_ids_are_unique_across_nodes(hexmq_cluster) -> None:  # type: ignore[no-untyped-def]
    """MQTT-3.2.2-16: an Assigned Client Identifier "MUST be a new Client Identifier"."""
    c = hexmq_cluster(nodes=3)
    ports = [c.mqtt_port(i) for i in (1, 2, 3)] * PER_NODE
    connected = await asyncio.gather(*(connect_empty_id(port) for port in ports))
    ids = []
    for _, connack in connected:
        assert connack.reason_code == 0
        assert connack.session_present is False
        assert connack.properties.assigned_client_identifier
        ids.append(connack.properties.assigned_client_identifier)
    assert len(set(ids)) == len(ports), ids
    # Every one still holds its connection: none was taken over by another's CONNECT.
    for client, _ in connected:
        await client.send(PingReq())
        assert isinstance(await client.recv(), PingResp)
    for client, _ in connected:
        await client.close()
