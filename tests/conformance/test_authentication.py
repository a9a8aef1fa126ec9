"""Authentication (--password-file written by mosquitto_passwd, --allow-anonymous) on a real
edge, with the exact CONNACK codes for MQTT 3.1.1 and 5.0, and the startup errors that name the
bad file and line. The edge is `access_port` (tests/conformance/conftest.py); its users are
tests.support.access.USERS."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.access import login, uid, write_passwords
from tests.support.edgeproc import edge_process, run_edge_expecting_failure


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
async def test_mqtt_3_1_4_2_connect_credentials(
    access_port: int, version: int, user: str | None, password: str | None, code: int
) -> None:
    """MQTT-3.1.4-2: a CONNECT that fails authentication is refused and closed.

    5.0: 0x86 or 0x87, 3.1.1: 0x04 or 0x05 (anonymous is refused with a password file). Also
    MQTT-3.2.2-7 and MQTT-4.13.2-1 (a refusing CONNACK is followed by close).
    """
    client, connack = await login(access_port, version, user, password)
    assert connack.reason_code == code
    if code:
        assert await client.recv() is None  # refused and closed
    await client.close()


def test_mqtt_3_1_4_2_mosquitto_clients_with_a_password(access_port: int) -> None:
    """MQTT-3.1.4-2: mosquitto_pub with a wrong password is refused; the right one gets in."""
    topic = f"clients/alice/{uid()}"
    common = ["-h", "127.0.0.1", "-p", str(access_port), "-t", topic, "-q", "1"]
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


async def test_s5_4_1_allow_anonymous_with_a_password_file(
    access_cluster: Any, tmp_path: Path
) -> None:
    """§5.4.1: --allow-anonymous lets clients without a user name in, not wrong passwords."""
    write_passwords(tmp_path / "passwd")
    args = [f"--password-file={tmp_path / 'passwd'}", "--allow-anonymous"]
    with edge_process(access_cluster, tmp_path, args, name="anon1") as proc:
        anonymous, connack = await login(proc.port, 5, None, None)
        assert connack.reason_code == 0
        wrong, connack = await login(proc.port, 4, "alice", "wrong")
        assert connack.reason_code == 4  # a wrong password is not taken as anonymous
        for client in (anonymous, wrong):
            await client.close()


# ----- startup errors ----------------------------------------------------------------------


def test_s5_4_1_bad_password_line_is_named_at_startup(tmp_path: Path) -> None:
    """§5.4.1: a password file the edge cannot read stops it at startup, naming the line."""
    path = tmp_path / "passwd"
    path.write_text("# users\nalice:$7$101$AAAA$AAAA\nbob:plain-text\n")
    code, stderr = run_edge_expecting_failure([f"--password-file={path}"])
    assert code == 2
    assert f"password file {path}, line 3" in stderr


def test_s5_4_1_no_anonymous_without_a_password_file_is_refused() -> None:
    """§5.4.1: --no-allow-anonymous without a password file is refused at startup."""
    code, stderr = run_edge_expecting_failure(["--no-allow-anonymous"])
    assert code == 2
    assert "--no-allow-anonymous needs --password-file" in stderr
