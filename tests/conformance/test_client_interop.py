"""Real MQTT clients (aiomqtt, paho-mqtt, mosquitto_pub/sub) through a node started with
`hexmq cluster up`, at QoS 0 and 1, with and without wildcards."""

from __future__ import annotations

import asyncio
import subprocess
import threading

import aiomqtt
import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.support.unique import uid

PROTOCOLS = {
    "3.1.1": (aiomqtt.ProtocolVersion.V311, paho.MQTTv311),
    "5.0": (aiomqtt.ProtocolVersion.V5, paho.MQTTv5),
}


async def collect(sub: aiomqtt.Client, count: int, timeout: float = 10.0) -> list[aiomqtt.Message]:
    got: list[aiomqtt.Message] = []
    async with asyncio.timeout(timeout):
        async for message in sub.messages:
            got.append(message)
            if len(got) == count:
                break
    return got


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("qos", [0, 1])
async def test_s4_7_1_aiomqtt_publish_subscribe_with_wildcards(
    node,
    protocol: str,
    qos: int,
) -> None:
    """§4.7.1: `+` matches one whole level, `#` any number of levels, its parent's included.

    With aiomqtt, 3.1.1 and 5.0, QoS 0 and 1. Also MQTT-3.3.2-3 (the delivered Topic Names).
    """
    version = PROTOCOLS[protocol][0]
    port = node.mqtt_port(1)
    base = f"t/{uid()}"
    async with (
        aiomqtt.Client("127.0.0.1", port, identifier=f"sub-{uid()}", protocol=version) as sub,
        aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{uid()}", protocol=version) as pub,
    ):
        await sub.subscribe(f"{base}/+/temp", qos=qos)
        await sub.subscribe(f"{base}/alerts/#", qos=qos)
        topics = [
            f"{base}/kitchen/temp",
            f"{base}/kitchen/humidity",  # matches neither filter
            f"{base}/alerts",  # "#" also matches the parent level
            f"{base}/alerts/fire/floor1",
            f"{base}/hall/temp",
        ]
        for i, topic in enumerate(topics):
            await pub.publish(topic, f"m{i}".encode(), qos=qos)
        got = await collect(sub, 4)
    assert [(str(m.topic), m.payload) for m in got] == [
        (topics[0], b"m0"),
        (topics[2], b"m2"),
        (topics[3], b"m3"),
        (topics[4], b"m4"),
    ]
    assert all(m.qos == qos for m in got)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_mqtt_3_8_4_8_paho_publish_subscribe(node, protocol: str) -> None:
    """MQTT-3.8.4-8: a message goes at the minimum of its QoS and the granted QoS.

    With paho-mqtt, 3.1.1 and 5.0: QoS 0 and 1 publishes to a QoS 1 subscription. Also
    MQTT-4.6.0-5 (one publisher's messages arrive in publish order).
    """
    version = PROTOCOLS[protocol][1]
    port = node.mqtt_port(1)
    base = f"paho/{uid()}"
    received: list[tuple[str, bytes, int]] = []
    done = threading.Event()
    subscribed = threading.Event()

    sub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"sub-{uid()}", protocol=version)
    sub.on_message = lambda c, u, m: (
        received.append((m.topic, m.payload, m.qos)),
        len(received) == 20 and done.set(),
    )
    sub.on_subscribe = lambda *a: subscribed.set()
    pub = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"pub-{uid()}", protocol=version)
    sub.connect("127.0.0.1", port)
    pub.connect("127.0.0.1", port)
    sub.loop_start()
    pub.loop_start()
    try:
        sub.subscribe(f"{base}/#", qos=1)
        assert subscribed.wait(5)
        infos = [pub.publish(f"{base}/{i % 3}", f"p{i}".encode(), qos=i % 2) for i in range(20)]
        for info in infos:
            info.wait_for_publish(5)
        assert done.wait(10), f"got {len(received)} of 20"
    finally:
        for client in (sub, pub):
            client.disconnect()
            client.loop_stop()
    assert [payload for _, payload, _ in received] == [f"p{i}".encode() for i in range(20)]
    assert [qos for _, _, qos in received] == [i % 2 for i in range(20)]


@pytest.mark.parametrize("protocol", ["mqttv311", "mqttv5"])
def test_mqtt_3_1_2_5_mosquitto_clients(node, protocol: str) -> None:
    """MQTT-3.1.2-5: a CONNECT with Clean Start 0 resumes the existing session.

    mosquitto_sub creates a persistent session (-c) and exits once subscribed (-E);
    mosquitto_pub publishes at QoS 0, then at QoS 1; the second mosquitto_sub gets the QoS 1
    ones and not the QoS 0 one, which hexmq does not queue for an offline session.
    Also MQTT-4.5.0-1 (the QoS 1 messages were added to the offline session).
    """
    port = str(node.mqtt_port(1))
    base = f"mosq/{uid()}"
    common = ["-h", "127.0.0.1", "-p", port, "-V", protocol]
    session = ["-c", "-i", f"mosq-sub-{uid()}", "-q", "1", "-t", f"{base}/+"]
    if protocol == "mqttv5":
        session += ["-x", "300"]  # 5.0 needs a session expiry interval to keep the session

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(args, capture_output=True, text=True, timeout=20, check=False)
        assert done.returncode == 0, f"{args[0]} failed: {done.stderr}"
        return done

    run("mosquitto_sub", *common, *session, "-E")
    # Before the QoS 1 ones: were it queued for the offline session, it would come first.
    run("mosquitto_pub", *common, "-q", "0", "-t", f"{base}/x", "-m", "qos0 offline: dropped")
    for i in range(3):
        run("mosquitto_pub", *common, "-q", "1", "-t", f"{base}/{i}", "-m", f"hello {i}")
    out = run("mosquitto_sub", *common, *session, "-C", "3", "-W", "10", "-v").stdout
    assert out.splitlines() == [f"{base}/{i} hello {i}" for i in range(3)]
