"""The edge's TLS, WebSocket and WebSocket-over-TLS listeners with real clients (aiomqtt,
mosquitto_pub/sub, the websockets client), and the TLS files it refuses at startup.

An extra `hexmq edge` (tests.support.edgeproc) joins a one-node cluster with the listeners on
free ports and certificates made by openssl for the module."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
import websockets
from websockets.asyncio.client import connect as ws_connect

from hexmq.mqtt import (
    ConnAck,
    Connect,
    MQTTConnection,
    PingReq,
    PingResp,
    Role,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.support.certs import CertFiles, make_certs
from tests.support.edgeproc import edge_process, run_edge_expecting_failure
from tests.support.ports import free_ports
from tests.support.unique import uid
from tests.support.wsclient import ws_packets

VERSIONS = {"3.1.1": aiomqtt.ProtocolVersion.V311, "5.0": aiomqtt.ProtocolVersion.V5}


@dataclass
class Listeners:
    plain: int
    tls: int
    ws: int
    wss: int
    certs: CertFiles


@pytest.fixture(scope="module")
def cluster(hexmq_cluster_module):
    return hexmq_cluster_module(nodes=1)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def edge(
    cluster: Any, certs: CertFiles, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Listeners]:
    tls, ws, wss = free_ports(3)
    args = [
        f"--tls-listen=127.0.0.1:{tls}",
        f"--ws-listen=127.0.0.1:{ws}",
        f"--wss-listen=127.0.0.1:{wss}",
        f"--tls-cert={certs.server_cert}",
        f"--tls-key={certs.server_key}",
        f"--tls-ca={certs.ca}",
        "--tls-require-client-cert",
    ]
    with edge_process(cluster, tmp_path_factory.mktemp("edge"), args, name="tls1") as proc:
        yield Listeners(proc.port, tls, ws, wss, certs)


def client_tls(certs: CertFiles, *, with_cert: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs.ca))
    if with_cert:
        ctx.load_cert_chain(certs.client_cert, certs.client_key)
    return ctx


async def round_trip(sub_kwargs: dict[str, Any], pub_kwargs: dict[str, Any], version: str) -> None:
    topic = f"rt/{uid()}"
    protocol = VERSIONS[version]
    async with (
        aiomqtt.Client(identifier=f"sub-{uid()}", protocol=protocol, **sub_kwargs) as sub,
        aiomqtt.Client(identifier=f"pub-{uid()}", protocol=protocol, **pub_kwargs) as pub,
    ):
        await sub.subscribe(f"{topic}/#", qos=1)
        await pub.publish(f"{topic}/a", b"one", qos=1)
        await pub.publish(f"{topic}/b", b"two", qos=0)
        got = []
        async with asyncio.timeout(10):
            async for message in sub.messages:
                got.append((str(message.topic), message.payload))
                if len(got) == 2:
                    break
    assert got == [(f"{topic}/a", b"one"), (f"{topic}/b", b"two")]


@pytest.mark.parametrize("version", VERSIONS)
async def test_s4_2_tls_round_trip(edge: Listeners, version: str) -> None:
    """§4.2: MQTT over TLS with a client certificate: aiomqtt round trip, 3.1.1 and 5.0."""
    tls = {"hostname": "127.0.0.1", "port": edge.tls, "tls_context": client_tls(edge.certs)}
    await round_trip(tls, tls, version)


async def test_s4_2_tls_and_plain_clients_share_the_broker(edge: Listeners) -> None:
    """§4.2: a client over TLS and a client over plain TCP exchange messages."""
    tls = {"hostname": "127.0.0.1", "port": edge.tls, "tls_context": client_tls(edge.certs)}
    await round_trip(tls, {"hostname": "127.0.0.1", "port": edge.plain}, "5.0")


def test_s4_2_tls_with_mosquitto_clients(edge: Listeners) -> None:
    """§4.2: mosquitto_pub and mosquitto_sub over TLS with client certificates."""
    certs = edge.certs
    topic = f"mosq/{uid()}"
    common = [
        *("-h", "127.0.0.1", "-p", str(edge.tls), "--cafile", str(certs.ca)),
        *("--cert", str(certs.client_cert), "--key", str(certs.client_key)),
    ]
    with subprocess.Popen(
        ["mosquitto_sub", *common, "-t", topic, "-q", "1", "-C", "1", "-W", "15"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as sub:
        # mosquitto_pub until the subscriber has its subscription (it prints the first message).
        for _ in range(50):
            subprocess.run(
                ["mosquitto_pub", *common, "-t", topic, "-m", "over-tls", "-q", "1"],
                check=True,
                capture_output=True,
                timeout=10,
            )
            try:
                out, err = sub.communicate(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            sub.kill()
            out, err = sub.communicate()
    assert out.strip() == "over-tls", err


async def no_connack_over_tls(port: int, ctx: ssl.SSLContext) -> bytes:
    answer = b""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        writer.write(MQTTConnection(Role.CLIENT).send(Connect(client_id=f"tls-{uid()}")))
        await writer.drain()
        async with asyncio.timeout(5):
            answer = await reader.read(4)
        writer.close()
    except (ssl.SSLError, ConnectionError):
        pass
    return answer


async def test_s5_4_1_tls_without_a_client_certificate_is_refused(edge: Listeners) -> None:
    """§5.4.1: with --tls-require-client-cert, a client without a certificate gets no CONNACK."""
    # No CONNACK: the handshake (TLS 1.3: just after it) failed.
    assert await no_connack_over_tls(edge.tls, client_tls(edge.certs, with_cert=False)) == b""


async def test_s5_4_1_tls_client_certificate_of_another_ca_is_refused(
    edge: Listeners, tmp_path: Path
) -> None:
    """§5.4.1: a client certificate signed by another CA gets no CONNACK."""
    stranger = make_certs(tmp_path / "stranger")
    ctx = ssl.create_default_context(cafile=str(edge.certs.ca))
    ctx.load_cert_chain(stranger.client_cert, stranger.client_key)
    assert await no_connack_over_tls(edge.tls, ctx) == b""


async def test_s4_2_plain_mqtt_on_the_tls_port_gets_no_connack(edge: Listeners) -> None:
    """§4.2: plain MQTT on the TLS port gets no CONNACK."""
    reader, writer = await asyncio.open_connection("127.0.0.1", edge.tls)
    writer.write(MQTTConnection(Role.CLIENT).send(Connect(client_id=f"plain-{uid()}")))
    await writer.drain()
    async with asyncio.timeout(15):
        data = await reader.read(100)
    assert not data.startswith(b"\x20\x02")
    writer.close()


@pytest.mark.parametrize("version", VERSIONS)
async def test_s6_websocket_round_trip(edge: Listeners, version: str) -> None:
    """§6: MQTT over WebSocket (aiomqtt) both ways with a plain TCP client, 3.1.1 and 5.0."""
    ws = {
        "hostname": "127.0.0.1",
        "port": edge.ws,
        "transport": "websockets",
        "websocket_path": "/mqtt",
    }
    await round_trip(ws, {"hostname": "127.0.0.1", "port": edge.plain}, version)
    await round_trip({"hostname": "127.0.0.1", "port": edge.plain}, ws, version)


async def test_s6_websocket_over_tls_round_trip(edge: Listeners) -> None:
    """§6: MQTT over WebSocket over TLS (wss) round trip."""
    wss = {
        "hostname": "127.0.0.1",
        "port": edge.wss,
        "transport": "websockets",
        "websocket_path": "/mqtt",
        "tls_context": client_tls(edge.certs),
    }
    await round_trip(wss, wss, "5.0")


async def test_mqtt_6_0_0_2_websocket_frames_may_split_and_join_packets(edge: Listeners) -> None:
    """MQTT-6.0.0-2: MQTT packets need not align with WebSocket frames.

    CONNECT in three frames, SUBSCRIBE and PINGREQ in one. Also MQTT-6.0.0-4 (the server
    selects the "mqtt" subprotocol) and MQTT-3.12.4-1 (PINGRESP).
    """
    codec = MQTTConnection(Role.CLIENT, protocol_version=5)
    connect = codec.send(Connect(client_id=f"frames-{uid()}", protocol_version=5))
    subscribe = codec.send(Subscribe(1, (Subscription(f"f/{uid()}", 1),)))
    ping = codec.send(PingReq())
    async with ws_connect(f"ws://127.0.0.1:{edge.ws}/mqtt", subprotocols=["mqtt"]) as ws:
        assert ws.subprotocol == "mqtt"
        # CONNECT in three frames (one of them a single byte), then SUBSCRIBE + PINGREQ in one.
        for part in (connect[:1], connect[1:5], connect[5:]):
            await ws.send(part)
        (connack,) = await ws_packets(ws, codec, 1)
        assert isinstance(connack, ConnAck)
        assert connack.reason_code == 0
        await ws.send(subscribe + ping)
        # PINGRESP may come first: SUBACK waits for the session's partition.
        answers = await ws_packets(ws, codec, 2)
        (suback,) = [p for p in answers if isinstance(p, SubAck)]
        assert suback.reason_codes == (1,)
        assert any(isinstance(p, PingResp) for p in answers)


async def test_s6_websocket_wrong_path_is_404(edge: Listeners) -> None:
    """§6: a WebSocket handshake on a path other than /mqtt gets HTTP 404."""
    with pytest.raises(websockets.InvalidStatus) as err:
        async with ws_connect(f"ws://127.0.0.1:{edge.ws}/other", subprotocols=["mqtt"]):
            pass
    assert err.value.response.status_code == 404


async def test_mqtt_6_0_0_3_websocket_without_the_mqtt_subprotocol_is_refused(
    edge: Listeners,
) -> None:
    """MQTT-6.0.0-3: the client offers the "mqtt" subprotocol; without it the edge says 400."""
    with pytest.raises(websockets.InvalidStatus) as err:
        async with ws_connect(f"ws://127.0.0.1:{edge.ws}/mqtt", subprotocols=["chat"]):
            pass
    assert err.value.response.status_code == 400


async def test_mqtt_6_0_0_1_websocket_text_frames_close_the_connection(edge: Listeners) -> None:
    """MQTT-6.0.0-1: MQTT travels in binary frames; a text frame closes the connection."""
    async with ws_connect(f"ws://127.0.0.1:{edge.ws}/mqtt", subprotocols=["mqtt"]) as ws:
        await ws.send("CONNECT")  # a text frame: MQTT-6.0.0-1
        with pytest.raises(websockets.ConnectionClosed) as err:
            async with asyncio.timeout(5):
                await ws.recv()
    assert err.value.rcvd is not None
    assert err.value.rcvd.code == 1003


# ----- startup errors ----------------------------------------------------------------------


def test_s4_2_tls_files_that_cannot_be_used_are_named(tmp_path: Path) -> None:
    """§4.2: TLS files the edge cannot use stop it at startup, naming the file or the fault."""
    certs = make_certs(tmp_path / "certs")
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    other = make_certs(tmp_path / "other")
    cases = [
        ([f"--tls-cert={tmp_path}/missing.crt", f"--tls-key={certs.server_key}"], "missing.crt"),
        ([f"--tls-cert={tmp_path}/junk.pem", f"--tls-key={certs.server_key}"], "junk.pem"),
        ([f"--tls-cert={certs.server_cert}", f"--tls-key={tmp_path}/junk.pem"], "junk.pem"),
        (
            [f"--tls-cert={certs.server_cert}", f"--tls-key={other.server_key}"],
            "does not match the certificate",
        ),
        ([f"--tls-cert={certs.server_cert}"], "need --tls-cert and --tls-key"),
    ]
    for args, named in cases:
        code, stderr = run_edge_expecting_failure(["--tls-listen=127.0.0.1:1", *args])
        assert code == 2, stderr
        assert named in stderr, stderr
