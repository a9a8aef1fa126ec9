"""MQTT 5.0 enhanced authentication (section 4.12) on a real edge: the AUTH exchange in CONNECT
and re-authentication, with SCRAM-SHA-512 over a password file (alice's entry a SCRAM
credential written by `hexmq passwd --scram`, the others mosquitto_passwd's) and with a plugin
loaded from an import path; and that the file gives nobody a SCRAM login (issue 25).

Every client here is raw packets over TCP through the project's codec (a client library would
hide the AUTH packets). The SCRAM edge joins a 2-node cluster through node 2's membership
service, so sessions live in partitions of both nodes; the cluster's own edges offer no method.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import time
from base64 import b64encode
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hexmq.mqtt import (
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.conftest import HEXMQ
from tests.support import authplugin

# The password and ACL files of the plain authentication tests: alice may use sensors/#, admin
# everything, every user clients/<user>/#.
from tests.support.access import ACL, uid, write_passwords
from tests.support.access import USERS as PASSWORDS
from tests.support.edgeproc import EdgeProcess, edge_process
from tests.support.eventually import eventually
from tests.support.rawclient import RawClient
from tests.support.scram import ScramClient, salted_password_final

ROOT = Path(__file__).resolve().parents[2]
SCRAM = "SCRAM-SHA-512"
CONNECT_TIMEOUT = 3.0
SHA512_USER = ("carol", "carol-pw")  # a $6$ line: CONNECT's password works, SCRAM cannot


def add_sha512_user(path: Path) -> None:
    """A `$6$` line, with mosquitto_passwd when installed (`make test` installs it), else made
    by hand in the same form."""
    user, password = SHA512_USER
    if shutil.which("mosquitto_passwd"):
        cmd = ["mosquitto_passwd", "-H", "sha512", "-b", str(path), user, password]
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        return
    salt = b"0123456789ab"
    digest = hashlib.sha512(password.encode() + salt).digest()
    with path.open("a") as f:
        f.write(f"{user}:$6${b64encode(salt).decode()}${b64encode(digest).decode()}\n")


@pytest.fixture(scope="module")
def cluster(hexmq_cluster_module: Any) -> Any:
    return hexmq_cluster_module(nodes=2)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("enhanced-auth")


@pytest.fixture(scope="module")
def edge(cluster: Any, work: Path) -> Iterator[EdgeProcess]:
    write_passwords(work / "passwd")  # $7$ lines for alice, bob, admin
    # alice's becomes a SCRAM credential (StoredKey, ServerKey): a $7$ line is SCRAM login
    # material and serves SCRAM only with --scram-from-pbkdf2.
    done = subprocess.run(
        [str(HEXMQ), "passwd", "--scram", str(work / "passwd"), "alice", PASSWORDS["alice"]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    add_sha512_user(work / "passwd")
    (work / "acl").write_text(ACL)
    args = [
        f"--password-file={work / 'passwd'}",
        f"--acl-file={work / 'acl'}",
        f"--auth-method={SCRAM}",
        "--auth-plugin=tests.support.authplugin:make",
        f"--connect-timeout={CONNECT_TIMEOUT}",
    ]
    # The plugin is imported by the edge process from the repository's tests package.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    with edge_process(cluster, work, args, name="scram-n2", node=2, env=env) as proc:
        yield proc


def scram_connect_packet(
    data: bytes | None, *, client_id: str = "", method: str = SCRAM, **props: Any
) -> Connect:
    return Connect(
        client_id=client_id or f"scram-{uid()}",
        protocol_version=5,
        clean_start=props.pop("clean_start", True),
        username=props.pop("username", None),
        properties=Properties(authentication_method=method, authentication_data=data, **props),
    )


async def expect_auth(client: RawClient, code: int = 0x18, method: str = SCRAM) -> Auth:
    """The next packet is AUTH `code` naming the CONNECT's method [MQTT-4.12.0-5]."""
    auth = await client.expect(Auth)
    assert (auth.reason_code, auth.properties.authentication_method) == (code, method)
    return auth


async def scram_login(
    port: int, user: str = "alice", password: str | None = None, **connect: Any
) -> tuple[RawClient, ConnAck, ScramClient]:
    """CONNECT with SCRAM-SHA-512 through to a successful CONNACK whose server signature
    verifies."""
    scram = ScramClient(user, password or PASSWORDS[user])
    client = await RawClient.open(port, 5)
    await client.send(scram_connect_packet(scram.first(), **connect))
    first = await expect_auth(client)
    assert first.properties.authentication_data is not None
    await client.send(auth_packet(0x18, scram.final(first.properties.authentication_data)))
    connack = await client.expect(ConnAck)
    assert connack.reason_code == 0, connack
    assert connack.properties.authentication_method == SCRAM  # [MQTT-4.12.0-5]
    scram.verify(connack.properties.authentication_data)
    return client, connack, scram


def auth_packet(code: int, data: bytes | None, method: str = SCRAM) -> Auth:
    return Auth(code, Properties(authentication_method=method, authentication_data=data))


async def publish(client: RawClient, topic: str, payload: bytes = b"m") -> int:
    """QoS 1 PUBLISH; its PUBACK's reason code (skipping deliveries that come first)."""
    pid = client.next_packet_id()
    await client.send(Publish(topic, payload, qos=1, packet_id=pid))
    while True:
        packet = await client.recv()
        if isinstance(packet, PubAck) and packet.packet_id == pid:
            return packet.reason_code
        assert isinstance(packet, Publish), packet


async def refused(client: RawClient) -> ConnAck:
    """A refusing CONNACK, then the server closes the connection [MQTT-4.12.0-4]."""
    connack = await client.expect(ConnAck)
    assert connack.reason_code >= 0x80
    assert connack.session_present is False
    assert await client.wait_closed() == []
    await client.close()
    return connack


async def disconnected(client: RawClient) -> Disconnect:
    """DISCONNECT, then the server closes the connection."""
    packets = await client.wait_closed()
    await client.close()
    assert packets, "closed without a DISCONNECT"
    assert isinstance(packets[-1], Disconnect), packets
    return packets[-1]


# ----- the exchange in CONNECT --------------------------------------------------------------


async def test_mqtt_4_12_0_2_scram_sha_512_exchange_ends_in_connack_0x00(
    edge: EdgeProcess,
) -> None:
    """The server asks for more with AUTH 0x18; the exchange ends with a successful CONNACK."""
    client, connack, _ = await scram_login(edge.port)
    # scram_login checked AUTH 0x18 and the CONNACK's method, and verified the server's
    # signature: the server knew the keys derived from alice's $7$ line.
    assert connack.properties.authentication_data is not None
    assert connack.properties.authentication_data.startswith(b"v=")
    assert await publish(client, f"sensors/{uid()}") in (0x00, 0x10)
    await client.close()


async def test_mqtt_4_12_0_5_every_auth_and_the_connack_carry_the_connect_method(
    edge: EdgeProcess,
) -> None:
    """With a method in CONNECT, every AUTH and a successful CONNACK carry that same method."""
    # A method whose exchange takes two steps of the plugin, loaded from an import path.
    client = await RawClient.open(edge.port, 5)
    await client.send(scram_connect_packet(b"alice", method=authplugin.NAME))
    challenge = await expect_auth(client, method=authplugin.NAME)
    assert challenge.properties.authentication_data is not None
    answer = authplugin.answer(challenge.properties.authentication_data)
    await client.send(auth_packet(0x18, answer, authplugin.NAME))
    connack = await client.expect(ConnAck)
    assert (connack.reason_code, connack.properties.authentication_method) == (0, authplugin.NAME)
    await client.close()
    # The same plugin refuses a wrong answer.
    client = await RawClient.open(edge.port, 5)
    await client.send(scram_connect_packet(b"alice", method=authplugin.NAME))
    await expect_auth(client, method=authplugin.NAME)
    await client.send(auth_packet(0x18, b"wrong", authplugin.NAME))
    assert (await refused(client)).reason_code == 0x87


@pytest.mark.parametrize(
    ("user", "password", "logged"),
    [
        ("alice", "not-alice-pw", "wrong password"),
        ("mallory", "alice-pw", "unknown user"),
        (*SHA512_USER, "has a $6$ entry"),
        ("admin", PASSWORDS["admin"], "has a $7$ entry"),
    ],
    ids=["wrong-password", "unknown-user", "sha512-entry", "pbkdf2-entry"],
)
async def test_mqtt_4_12_0_4_failed_scram_gets_connack_0x87_and_close(
    edge: EdgeProcess, user: str, password: str, logged: str
) -> None:
    """The server can reject the authentication at any point: CONNACK 0x80+, then close."""
    scram = ScramClient(user, password)
    client = await RawClient.open(edge.port, 5)
    await client.send(scram_connect_packet(scram.first()))
    first = await expect_auth(client)  # unknown and $6$ users get a salt too
    assert first.properties.authentication_data is not None
    await client.send(auth_packet(0x18, scram.final(first.properties.authentication_data)))
    connack = await refused(client)
    assert connack.reason_code == 0x87
    assert connack.properties.authentication_data == b"e=invalid-proof"
    assert connack.properties.reason_string == "authentication failed"
    # The client is told nothing more; the operator's log says why.
    await wait_for_log(edge, f"user {user!r}: ", logged)


async def wait_for_log(edge: EdgeProcess, *parts: str, timeout: float = 5) -> None:
    def logged() -> bool:
        return any(all(p in line for p in parts) for line in edge.log_text().splitlines())

    await eventually(logged, timeout, f"a log line with {parts}")


async def test_mqtt_4_12_0_1_unknown_method_gets_connack_0x8c(edge: EdgeProcess) -> None:
    """A method the server does not support: CONNACK 0x8C (or 0x87), then close."""
    client = await RawClient.open(edge.port, 5)
    await client.send(scram_connect_packet(b"n,,n=alice,r=abc", method="SCRAM-SHA-1"))
    connack = await refused(client)
    assert connack.reason_code == 0x8C
    assert connack.properties.reason_string is not None
    assert SCRAM in connack.properties.reason_string  # what this edge offers


async def test_mqtt_4_12_0_1_no_method_configured_gets_connack_0x8c(cluster: Any) -> None:
    """Without --auth-method every Authentication Method is unsupported: 0x8C, then close."""
    client = await RawClient.open(cluster.mqtt_port(1), 5)
    await client.send(scram_connect_packet(ScramClient("alice", "x").first()))
    connack = await refused(client)
    assert connack.reason_code == 0x8C
    assert connack.properties.reason_string == "no authentication method is configured"


@pytest.mark.parametrize(
    "interloper",
    [
        auth_packet(0x18, b"c=biws", method="SCRAM-SHA-256"),  # another method [MQTT-4.12.0-5]
        auth_packet(0x19, b"n,,n=alice,r=abc"),  # not 0x18 [MQTT-4.12.0-3]
        Publish("sensors/x", b"early", qos=0),  # not AUTH before CONNACK [MQTT-3.1.2-30]
    ],
    ids=["other-method", "reason-code-0x19", "publish"],
)
async def test_mqtt_4_12_0_3_the_client_answers_with_auth_0x18_and_the_same_method(
    edge: EdgeProcess, interloper: Packet
) -> None:
    """The client answers an AUTH from the server with AUTH 0x18; anything else: 0x82."""
    scram = ScramClient("alice", PASSWORDS["alice"])
    client = await RawClient.open(edge.port, 5)
    await client.send(scram_connect_packet(scram.first()))
    await expect_auth(client)
    await client.send(interloper)
    assert (await refused(client)).reason_code == 0x82


async def test_mqtt_4_12_0_7_auth_after_a_connect_without_method_gets_disconnect_0x82(
    edge: EdgeProcess,
) -> None:
    """A client whose CONNECT named no method sends no AUTH: a Protocol Error."""
    client = await RawClient.open(edge.port, 5)
    await client.send(
        Connect(f"plain-{uid()}", protocol_version=5, username="alice", password=b"alice-pw")
    )
    assert (await client.expect(ConnAck)).reason_code == 0  # CONNECT's password still works
    # Raw bytes: our client codec would not send AUTH on such a connection.
    await client.send_bytes(bytes.fromhex("f00c190a1500014d160003616263"))  # AUTH 0x19 "M"
    assert (await disconnected(client)).reason_code == 0x82


async def test_s3_1_2_11_10_authentication_data_without_a_method_gets_connack_0x82(
    edge: EdgeProcess,
) -> None:
    """3.1.2.11.10: Authentication Data without an Authentication Method is a Protocol Error."""
    client = await RawClient.open(edge.port, 5)
    props = Properties(authentication_data=b"x")
    await client.send(Connect(f"data-{uid()}", protocol_version=5, properties=props))
    assert (await refused(client)).reason_code == 0x82


async def test_mqtt_4_12_0_4_a_silent_exchange_ends_at_the_connect_timeout(
    edge: EdgeProcess,
) -> None:
    """An exchange the client leaves unfinished is bounded by --connect-timeout."""
    started = time.monotonic()
    client = await RawClient.open(edge.port, 5)
    await client.send(scram_connect_packet(ScramClient("alice", "x").first()))
    await expect_auth(client)
    connack = await client.expect(ConnAck, timeout=CONNECT_TIMEOUT + 5)
    elapsed = time.monotonic() - started
    assert connack.reason_code == 0x87
    assert connack.properties.reason_string == (
        f"authentication not completed within {CONNECT_TIMEOUT:g}s"
    )
    assert await client.wait_closed() == []
    await client.close()
    assert CONNECT_TIMEOUT - 0.5 <= elapsed < CONNECT_TIMEOUT + 5


# ----- who the client is --------------------------------------------------------------------


async def test_s5_4_2_the_acl_sees_the_scram_user_name_through_node_2(edge: EdgeProcess) -> None:
    """The user SCRAM authenticated is the one the ACL checks (not CONNECT's User Name)."""
    base = uid()
    # CONNECT says "admin" (who may do anything); SCRAM proves alice, and alice it is.
    sub, _, _ = await scram_login(edge.port, username="admin")
    pub, _, _ = await scram_login(edge.port)
    await sub.send(
        Subscribe(
            1,
            (
                Subscription(f"sensors/{base}", 1),
                Subscription(f"clients/alice/{base}", 1),
                Subscription(f"clients/admin/{base}", 1),
                Subscription(f"private/{base}", 1),
            ),
        )
    )
    granted = await sub.expect(SubAck)
    assert granted.reason_codes == (1, 1, 0x87, 0x87)
    assert await publish(pub, f"private/{base}") == 0x87
    assert await publish(pub, f"clients/admin/{base}") == 0x87
    assert await publish(pub, f"clients/alice/{base}", b"mine") == 0
    assert await publish(pub, f"sensors/{base}", b"temp") == 0
    got = [await sub.expect(Publish) for _ in range(2)]
    assert sorted((p.topic, p.payload) for p in got) == [
        (f"clients/alice/{base}", b"mine"),
        (f"sensors/{base}", b"temp"),
    ]
    await sub.close()
    await pub.close()


# ----- re-authentication --------------------------------------------------------------------


async def test_mqtt_4_12_1_1_reauthentication_while_messages_flow(edge: EdgeProcess) -> None:
    """A connected client re-authenticates with AUTH 0x19 and the CONNECT's method."""
    topic = f"sensors/{uid()}"
    client, _, _ = await scram_login(edge.port)
    await client.subscribe(topic)
    other, _, _ = await scram_login(edge.port)
    scram = ScramClient("alice", PASSWORDS["alice"])
    await client.send(auth_packet(0x19, scram.first()))
    first = await expect_auth(client)
    assert first.properties.authentication_data is not None
    # Mid-exchange, deliveries and the client's own publishes go on.
    assert await publish(other, topic, b"during") == 0
    delivered = await client.expect(Publish)
    assert delivered.payload == b"during"
    assert delivered.packet_id is not None
    await client.send(PubAck(delivered.packet_id))
    assert await publish(client, f"{topic}/own", b"own") in (0x00, 0x10)
    await client.send(auth_packet(0x18, scram.final(first.properties.authentication_data)))
    done = await expect_auth(client, code=0x00)
    scram.verify(done.properties.authentication_data)
    # And again: any number of re-authentications.
    scram = ScramClient("alice", PASSWORDS["alice"])
    await client.send(auth_packet(0x19, scram.first()))
    first = await expect_auth(client)
    assert first.properties.authentication_data is not None
    await client.send(auth_packet(0x18, scram.final(first.properties.authentication_data)))
    scram.verify((await expect_auth(client, code=0x00)).properties.authentication_data)
    assert await publish(other, topic, b"after") == 0
    assert (await client.expect(Publish)).payload == b"after"
    await client.close()
    await other.close()


async def test_mqtt_4_12_1_2_failed_reauthentication_gets_disconnect_0x87_session_stays(
    edge: EdgeProcess,
) -> None:
    """A failed re-authentication: DISCONNECT with a reason code, then close."""
    topic, cid = f"sensors/{uid()}", f"reauth-{uid()}"
    client, _, _ = await scram_login(edge.port, client_id=cid, session_expiry_interval=300)
    await client.subscribe(topic)
    scram = ScramClient("alice", "not-alice-pw")
    await client.send(auth_packet(0x19, scram.first()))
    first = await expect_auth(client)
    assert first.properties.authentication_data is not None
    await client.send(auth_packet(0x18, scram.final(first.properties.authentication_data)))
    assert (await disconnected(client)).reason_code == 0x87
    # The session stays, as on any close: what is published meanwhile waits for the client.
    other, _, _ = await scram_login(edge.port)
    assert await publish(other, topic, b"kept") == 0
    back, connack, _ = await scram_login(
        edge.port, client_id=cid, clean_start=False, session_expiry_interval=0
    )
    assert connack.session_present is True
    assert (await back.expect(Publish)).payload == b"kept"
    await back.close()
    await other.close()


def password_entries(work: Path) -> dict[str, str]:
    lines = (work / "passwd").read_text().splitlines()
    return dict(line.split(":", 1) for line in lines if ":" in line)


@pytest.fixture(scope="module")
def scram_work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A password file as the module's: admin's a mosquitto_passwd `$7$` line, alice's a
    SCRAM credential of `hexmq passwd --scram`."""
    work = tmp_path_factory.mktemp("scram-files")
    write_passwords(work / "passwd")
    done = subprocess.run(
        [str(HEXMQ), "passwd", "--scram", str(work / "passwd"), "alice", PASSWORDS["alice"]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return work


@pytest.fixture(scope="module")
def scram_node(hexmq_cluster_module: Any, scram_work: Path) -> Any:
    """One node whose own edge offers SCRAM-SHA-512 over `scram_work`'s file, as deployed."""
    return hexmq_cluster_module(
        nodes=1,
        extra=[
            f"--edge-arg=--password-file={scram_work / 'passwd'}",
            f"--edge-arg=--auth-method={SCRAM}",
        ],
    )


def edge_log(cluster: Any) -> str:
    return str(cluster.service_log(1, "edge").read_text(errors="replace"))


async def scram_with(port: int, user: str, salted: bytes) -> ConnAck:
    """A SCRAM-SHA-512 login by someone holding `salted` as SaltedPassword, not the password."""
    scram = ScramClient(user, "unknown")
    client = await RawClient.open(port, 5)
    await client.send(scram_connect_packet(scram.first()))
    first = await expect_auth(client)
    assert first.properties.authentication_data is not None
    final = salted_password_final(scram, first.properties.authentication_data, salted)
    await client.send(auth_packet(0x18, final))
    return await refused(client)


async def test_s4_12_a_password_files_7_hash_alone_gives_no_scram_login(
    scram_node: Any, scram_work: Path
) -> None:
    """A mosquitto `$7$` hash is SCRAM-SHA-512's SaltedPassword: with it, and no password, a
    client computes a valid proof. So whoever read the password file logged in as admin
    (issue 25). `$7$` lines serve SCRAM only with --scram-from-pbkdf2 (off here): refused."""
    entry = password_entries(scram_work)["admin"]
    assert entry.startswith("$7$")
    salted = base64.b64decode(entry.split("$")[4])
    connack = await scram_with(scram_node.mqtt_port(1), "admin", salted)
    assert connack.reason_code == 0x87
    await eventually(
        lambda: "user 'admin': the password file has a $7$ entry" in edge_log(scram_node),
        5,
        "the edge's log line naming the refused $7$ entry",
    )


async def test_s4_12_a_scram_credential_alone_gives_no_login(
    scram_node: Any, scram_work: Path
) -> None:
    """alice's SCRAM-SHA-512 entry holds the salt, StoredKey and ServerKey (RFC 5802 section
    3): none of them, taken for SaltedPassword, logs in, nor as CONNECT's password; alice's
    own password does, both ways."""
    port = scram_node.mqtt_port(1)
    entry = password_entries(scram_work)["alice"]
    assert entry.startswith("SCRAM-SHA-512$4096:")
    stored, server = (base64.b64decode(k) for k in entry.split("$")[2].split(":"))
    for guess in (stored, server):
        assert (await scram_with(port, "alice", guess)).reason_code == 0x87
        client = await RawClient.open(port, 5)
        await client.send(
            Connect(f"steal-{uid()}", protocol_version=5, username="alice", password=guess)
        )
        assert (await client.expect(ConnAck)).reason_code == 0x86
        await client.close()
    ok, _, _ = await scram_login(port)
    await ok.close()
    plain = await RawClient.open(port, 5)
    await plain.send(
        Connect(
            f"plain-{uid()}",
            protocol_version=5,
            username="alice",
            password=PASSWORDS["alice"].encode(),
        )
    )
    assert (await plain.expect(ConnAck)).reason_code == 0
    await plain.close()
