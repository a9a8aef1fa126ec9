"""Authentication (--password-file written by mosquitto_passwd, --allow-anonymous) and
authorization (--acl-file) on a real edge, with the exact CONNACK, PUBACK and SUBACK codes for
MQTT 3.1.1 and 5.0; and the startup errors that name the bad file and line."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hexmq.mqtt import ConnAck, Connect, PingReq, PingResp, Publish
from services.edge.passwd import set_password
from tests.support.certs import make_certs
from tests.support.edgeproc import edge_process, run_edge_expecting_failure
from tests.support.rawclient import RawClient

USERS = {"alice": "alice-pw", "bob": "bob-pw", "admin": "admin-pw"}

ACL = """\
# Clients without a user name: nothing (and they are refused anyway).
user alice
topic readwrite sensors/#
topic deny sensors/secret/#

user bob
topic read sensors/+/temp

user admin
topic readwrite #

pattern readwrite clients/%u/#
"""


def uid() -> str:
    return uuid.uuid4().hex[:10]


def write_passwords(path: Path) -> None:
    """With mosquitto_passwd when it is installed (the format we promise to read), else with
    our own helper."""
    for user, password in USERS.items():
        if shutil.which("mosquitto_passwd"):
            create = [] if path.exists() else ["-c"]
            subprocess.run(
                ["mosquitto_passwd", *create, "-b", str(path), user, password],
                check=True,
                capture_output=True,
                timeout=30,
            )
        else:
            set_password(path, user, password, 101)


@pytest.fixture(scope="module")
def cluster(hexmq_cluster_module: Any) -> Any:
    return hexmq_cluster_module(nodes=1)


@pytest.fixture(scope="module")
def port(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    work = tmp_path_factory.mktemp("access")
    write_passwords(work / "passwd")
    (work / "acl").write_text(ACL)
    args = [f"--password-file={work / 'passwd'}", f"--acl-file={work / 'acl'}"]
    with edge_process(cluster, work, args, name="auth1") as proc:
        yield proc.port


async def login(
    port: int, version: int, user: str | None, password: str | None, client_id: str = ""
) -> tuple[RawClient, ConnAck]:
    client = await RawClient.open(port, version)
    await client.send(
        Connect(
            client_id=client_id or f"c-{uid()}",
            protocol_version=version,
            username=user,
            password=password.encode() if password is not None else None,
        )
    )
    return client, await client.expect(ConnAck)


# ----- authentication -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "user", "password", "code"),
    [
        (5, "alice", "alice-pw", 0),
        (4, "alice", "alice-pw", 0),
        (5, "alice", "wrong", 0x86),
        (4, "alice", "wrong", 4),
        (5, "mallory", "alice-pw", 0x86),
        (4, "mallory", "alice-pw", 4),
        (5, "alice", None, 0x86),
        (4, "alice", None, 4),
        (5, None, None, 0x87),  # anonymous: refused by default with a password file
        (4, None, None, 5),
    ],
)
async def test_connect_credentials(
    port: int, version: int, user: str | None, password: str | None, code: int
) -> None:
    client, connack = await login(port, version, user, password)
    assert connack.reason_code == code
    if code:
        assert await client.recv() is None  # refused and closed
    await client.close()


def test_mosquitto_clients_with_a_password(port: int) -> None:
    topic = f"clients/alice/{uid()}"
    common = ["-h", "127.0.0.1", "-p", str(port), "-t", topic, "-q", "1"]
    ok = subprocess.run(
        ["mosquitto_pub", *common, "-u", "alice", "-P", "alice-pw", "-m", "x"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run(
        ["mosquitto_pub", *common, "-u", "alice", "-P", "nope", "-m", "x"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert bad.returncode != 0
    assert "bad user name or password" in bad.stderr.lower()


# ----- authorization --------------------------------------------------------------------------


async def still_connected(client: RawClient) -> bool:
    await client.send(PingReq())
    return isinstance(await client.recv(), PingResp)


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 0)])
async def test_denied_publish_is_refused_or_dropped(port: int, version: int, code: int) -> None:
    """5.0: PUBACK 0x87; 3.1.1: acknowledged and dropped (as mosquitto); the connection stays."""
    base = f"t{uid()}"
    watcher, _ = await login(port, 5, "admin", "admin-pw")
    await watcher.subscribe(f"{base}/#", f"sensors/{base}/#", qos=1)
    bob, _ = await login(port, version, "bob", "bob-pw")
    denied = await bob.publish(f"sensors/{base}/temp", b"read-only for bob", qos=1)
    assert denied is not None
    assert denied.reason_code == code
    assert (await bob.publish(f"{base}/x", b"no rule", qos=1)).reason_code == code  # type: ignore[union-attr]
    assert await still_connected(bob)
    alice, _ = await login(port, version, "alice", "alice-pw")
    allowed = await alice.publish(f"sensors/{base}/temp", b"ok", qos=1)
    assert allowed is not None
    assert allowed.reason_code == 0
    got = await watcher.expect(Publish)
    assert got.payload == b"ok"  # bob's messages never arrived before it
    for client in (watcher, bob, alice):
        await client.close()


@pytest.mark.parametrize(("version", "code"), [(5, 0x87), (4, 0x80)])
async def test_denied_subscribe_fails_only_that_filter(port: int, version: int, code: int) -> None:
    bob, _ = await login(port, version, "bob", "bob-pw")
    suback = await bob.subscribe("sensors/+/temp", "sensors/#", "clients/bob/#", "other", qos=1)
    assert suback.reason_codes == (1, code, 1, code)
    # A shared subscription is authorized by its inner filter.
    suback = await bob.subscribe("$share/g/sensors/+/temp", "$share/g/sensors/#", qos=1)
    assert suback.reason_codes == (1, code)
    assert await still_connected(bob)
    await bob.close()


async def test_deliveries_are_checked_against_read_rules(port: int) -> None:
    """alice's `sensors/#` is granted, but `deny sensors/secret/#` still holds per message."""
    base = f"sensors/{uid()}"
    alice, _ = await login(port, 5, "alice", "alice-pw")
    assert (await alice.subscribe("sensors/#", qos=1)).reason_codes == (1,)
    admin, _ = await login(port, 5, "admin", "admin-pw")
    await admin.publish("sensors/secret/key", b"hidden", qos=1)
    await admin.publish(f"{base}/open", b"visible", qos=1)
    got = await alice.expect(Publish)
    assert (got.topic, got.payload) == (f"{base}/open", b"visible")
    with pytest.raises(TimeoutError):
        await alice.recv(timeout=0.5)
    for client in (alice, admin):
        await client.close()


async def test_patterns_substitute_the_user_name(port: int) -> None:
    bob, _ = await login(port, 5, "bob", "bob-pw")
    own = await bob.publish(f"clients/bob/{uid()}", b"mine", qos=1)
    other = await bob.publish(f"clients/alice/{uid()}", b"not mine", qos=1)
    assert own is not None
    assert other is not None
    assert own.reason_code in (0, 0x10)  # 0x10: no subscribers, but allowed
    assert other.reason_code == 0x87
    await bob.close()


async def test_allow_anonymous_with_a_password_file(cluster: Any, tmp_path: Path) -> None:
    write_passwords(tmp_path / "passwd")
    args = [f"--password-file={tmp_path / 'passwd'}", "--allow-anonymous"]
    with edge_process(cluster, tmp_path, args, name="anon1") as proc:
        anonymous, connack = await login(proc.port, 5, None, None)
        assert connack.reason_code == 0
        wrong, connack = await login(proc.port, 4, "alice", "wrong")
        assert connack.reason_code == 4  # a wrong password is not taken as anonymous
        for client in (anonymous, wrong):
            await client.close()


# ----- startup errors -------------------------------------------------------------------------


def test_bad_password_line_is_named_at_startup(tmp_path: Path) -> None:
    path = tmp_path / "passwd"
    path.write_text("# users\nalice:$7$101$AAAA$AAAA\nbob:plain-text\n")
    code, stderr = run_edge_expecting_failure([f"--password-file={path}"])
    assert code == 2
    assert f"password file {path}, line 3" in stderr


def test_bad_acl_line_is_named_at_startup(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text("user alice\ntopic read a/#\ntopic read a/#/b\n")
    code, stderr = run_edge_expecting_failure([f"--acl-file={path}"])
    assert code == 2
    assert f"ACL file {path}, line 3" in stderr


def test_tls_files_that_cannot_be_used_are_named(tmp_path: Path) -> None:
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


def test_no_anonymous_without_a_password_file_is_refused() -> None:
    code, stderr = run_edge_expecting_failure(["--no-allow-anonymous"])
    assert code == 2
    assert "--no-allow-anonymous needs --password-file" in stderr
