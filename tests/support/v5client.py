"""MQTT 5.0 raw-client steps for tests that check exact packets and properties: connect with
CONNECT properties, subscribe with a Subscription Identifier, publish with properties, receive
(acknowledging), leave with DISCONNECT properties. Every client opened here is closed when its
test ends, pass or fail (the autouse fixture of tests/conformance/conftest.py).

"Nothing else arrives" is shown without sleeping where the broker's ordering allows it: a
sentinel that must come after the message that must not arrive (one publisher's messages reach
a session in publish order; a session's queued messages come right after CONNACK; retained
messages of one SUBSCRIBE come in one batch, in topic order)."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from hexmq.mqtt import (
    NO_PROPERTIES,
    ConnAck,
    Connect,
    Disconnect,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.support.rawclient import RawClient
from tests.support.unique import uid

KEEP = 600  # a Session Expiry Interval that outlives the test


# Every client a test opens, closed when it ends (pass or fail).
_open: list[RawClient] = []


async def close_open_clients() -> None:
    """Close every client open_v5 opened (tests/conformance/conftest.py, after each test)."""
    while _open:
        await _open.pop().close()


async def open_v5(port: int) -> RawClient:
    client = await RawClient.open(port, 5)
    _open.append(client)
    return client


async def connect(
    port: int, client_id: str | None = None, *, clean_start: bool = True, **props: object
) -> tuple[RawClient, ConnAck]:
    """A 5.0 connection; `props` are CONNECT properties (e.g. session_expiry_interval=60)."""
    client = await open_v5(port)
    await client.send(
        Connect(
            client_id=client_id or f"c-{uid()}",
            protocol_version=5,
            clean_start=clean_start,
            properties=Properties(**props) if props else NO_PROPERTIES,
        )
    )
    connack = await client.expect(ConnAck)
    assert connack.reason_code == 0, connack
    return client, connack


async def subscribe(
    client: RawClient, *subscriptions: Subscription, sub_id: int | None = None
) -> tuple[int, ...]:
    """SUBSCRIBE (with a Subscription Identifier if given); the SUBACK's reason codes."""
    pid = client.next_packet_id()
    props = Properties(subscription_identifiers=(sub_id,)) if sub_id else NO_PROPERTIES
    await client.send(Subscribe(pid, subscriptions, props))
    suback = await client.expect(SubAck)
    assert suback.packet_id == pid  # MQTT-3.8.4-2
    return suback.reason_codes


async def publish(
    client: RawClient,
    topic: str,
    payload: bytes,
    *,
    qos: int = 1,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    properties: Properties | None = None,
    **props: object,
) -> PubAck | None:
    """PUBLISH with `properties` (or `props` as its properties); for QoS 1 the PUBACK, which
    must carry the PUBLISH's packet id (MQTT-2.2.1-5) and not be a failure."""
    pid = (packet_id or client.next_packet_id()) if qos else None
    if properties is None:
        properties = Properties(**props) if props else NO_PROPERTIES
    await client.send(Publish(topic, payload, qos, retain, dup, pid, properties))
    if not qos:
        return None
    ack = await client.expect(PubAck)
    assert ack.packet_id == pid
    assert ack.reason_code < 0x80, ack
    return ack


async def receive(client: RawClient, timeout: float = 10.0) -> Publish:
    """The next PUBLISH, acknowledged if QoS 1."""
    packet = await client.expect(Publish, timeout)
    if packet.qos:
        assert packet.packet_id is not None
        await client.send(PubAck(packet.packet_id))
    return packet


async def receive_resumed(
    client: RawClient, acknowledged: Collection[bytes], timeout: float = 10.0
) -> Publish:
    """The next PUBLISH on a session resumed on another node that is not a redelivery of one
    `acknowledged` on the earlier connection. That node may not have read the PUBACK yet (or
    its DeliveryAck may still be on its way) when the session resumes here: the message then
    comes once more, as QoS 1 allows, and only marked DUP (MQTT-3.3.1-1). Seen in CI at
    ab12b80 on a loaded machine."""
    while True:
        packet = await receive(client, timeout)
        if not (packet.dup and packet.payload in acknowledged):
            return packet


async def leave(client: RawClient, **props: object) -> None:
    """A normal DISCONNECT (with `props`, e.g. a new session_expiry_interval), then close."""
    properties = Properties(**props) if props else NO_PROPERTIES
    await client.send(Disconnect(0, properties))
    await client.close()


async def nothing_within(client: RawClient, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        await client.recv(timeout=seconds)
