"""Persistent sessions as the conformance tests make them: a subscriber that subscribes and
leaves (its session kept), a publisher whose QoS 1 messages are acknowledged."""

from __future__ import annotations

from hexmq.mqtt import Disconnect, Properties
from tests.support.rawclient import RawClient
from tests.support.unique import uid


def session_props(version: int) -> Properties:
    # 3.1.1: clean session 0 keeps the session; 5.0 also needs a Session Expiry Interval.
    return Properties(session_expiry_interval=600) if version == 5 else Properties()


async def subscribe_then_leave(port: int, client_id: str, version: int, topic: str) -> None:
    sub, connack = await RawClient.connect(
        port, client_id, version=version, clean_start=False, properties=session_props(version)
    )
    assert connack.reason_code == 0
    assert connack.session_present is False
    suback = await sub.subscribe(topic, qos=1)
    assert suback.reason_codes == (1,)
    await sub.send(Disconnect())
    await sub.close()


async def publish_acked(port: int, version: int, topic: str, count: int) -> None:
    pub, _ = await RawClient.connect(port, f"pub-{uid()}", version=version)
    for i in range(count):
        ack = await pub.publish(topic, f"{i}".encode(), qos=1)
        assert ack is not None
        assert ack.reason_code == 0
    await pub.send(Disconnect())
    await pub.close()
