"""`hexmq secrets init` (hexmq_cli/secrets_cli.py): the files it makes, their modes and owners, that
a second run keeps everything, and that what it makes works: the Redis ACL file loads in a real
redis-server, which then refuses a client without the password."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hexmq.redis_security import HEXMQ_USER, acl_lines
from hexmq.trust import certs
from hexmq.trust.identity import NODE_ROLES, Identity
from hexmq_cli import cli, procs, secrets_cli
from tests.support.ports import free_ports

NODES = ["n1", "n2", "n3"]
# The users of the images that read the files (docs/deploy.md): hexmq, redis, consul.
HEXMQ_UID, REDIS_UID, CONSUL_UID = 10001, 999, 100
OWNERS = ["--owner", f"hexmq={HEXMQ_UID}", "--owner", f"redis={REDIS_UID}"]
OWNERS += ["--owner", f"consul={CONSUL_UID}:1000"]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root gives files to other users")


def run(directory: Path, nodes: list[str], *extra: str) -> int:
    return cli.main(
        ["secrets", "init", "--dir", str(directory), "--nodes", ",".join(nodes), *extra]
    )


def expected_files(nodes: list[str], consul_config: bool = True) -> set[str]:
    files = {"tls/ca.crt", "tls/ca.key", "tls/operator/admin.crt", "tls/operator/admin.key"}
    files |= {f"tls/{n}/{r}.{ext}" for n in nodes for r in NODE_ROLES for ext in ("crt", "key")}
    files |= {"consul.token"} | ({"consul-acl.json"} if consul_config else set())
    files |= {f"redis/{n}.{ext}" for n in nodes for ext in ("password", "acl")}
    return files


def files_of(directory: Path) -> dict[str, tuple[bytes, int, int, int, int]]:
    """Every file: its bytes, mode, owner, group and modification time."""
    out = {}
    for path in directory.rglob("*"):
        if path.is_file():
            st = path.stat()
            out[str(path.relative_to(directory))] = (
                path.read_bytes(),
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
                st.st_mtime_ns,
            )
    return out


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder other users can reach (pytest's own are root's only), as a volume is."""
    directory = Path(tempfile.mkdtemp(prefix="hexmq-secrets-"))
    directory.chmod(0o755)
    try:
        yield directory / "secrets"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_it_makes_every_secret_with_private_files_readable_by_their_owner_only(
    tmp_path: Path,
) -> None:
    assert run(tmp_path, NODES, "--consul-config") == 0
    made = files_of(tmp_path)
    assert set(made) == expected_files(NODES)
    for name, (_data, mode, *_rest) in made.items():
        public = name.endswith(".crt")
        assert mode == (0o644 if public else 0o600), name
    for folder in [p for p in tmp_path.rglob("*") if p.is_dir()]:
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    # What `hexmq certs cluster` writes: each certificate names its service, by the CA.
    for node in NODES:
        for role in NODE_ROLES:
            info = certs.describe(tmp_path / "tls" / node / f"{role}.crt")
            assert info.identity == Identity(role, node)
            assert info.issuer == certs.describe(tmp_path / "tls" / "ca.crt").subject


def test_the_consul_config_enables_acls_with_the_token_as_management_token(
    tmp_path: Path,
) -> None:
    assert run(tmp_path, NODES, "--consul-config") == 0
    token = (tmp_path / "consul.token").read_text().strip()
    assert str(uuid.UUID(token)) == token  # as Consul makes tokens
    config = json.loads((tmp_path / "consul-acl.json").read_text())
    assert config == {
        "acl": {
            "enabled": True,
            "default_policy": "deny",
            "enable_token_persistence": True,
            "tokens": {"initial_management": token, "agent": token},
        }
    }
    other = tmp_path / "other"
    assert run(other, NODES) == 0
    assert not (other / "consul-acl.json").exists()
    assert (other / "consul.token").read_text() != (tmp_path / "consul.token").read_text()


def test_each_nodes_redis_acl_file_holds_its_own_passwords_hash_only(tmp_path: Path) -> None:
    assert run(tmp_path, NODES) == 0
    passwords = {n: (tmp_path / "redis" / f"{n}.password").read_text().strip() for n in NODES}
    assert len(set(passwords.values())) == len(NODES)
    for node, password in passwords.items():
        acl = (tmp_path / "redis" / f"{node}.acl").read_text()
        assert acl.splitlines() == acl_lines(HEXMQ_USER, password)
        assert password not in acl


def test_a_second_run_changes_nothing_and_more_nodes_only_add_theirs(tmp_path: Path) -> None:
    assert run(tmp_path, NODES, "--consul-config") == 0
    first = files_of(tmp_path)
    assert run(tmp_path, NODES, "--consul-config") == 0
    assert files_of(tmp_path) == first
    assert run(tmp_path, ["n1"]) == 0  # fewer nodes remove nothing
    assert files_of(tmp_path) == first
    assert run(tmp_path, [*NODES, "n4"], "--consul-config") == 0
    after = files_of(tmp_path)
    assert {k: v for k, v in after.items() if k in first} == first
    assert set(after) - set(first) == expected_files(["n4"], consul_config=False) - {
        "tls/ca.crt",
        "tls/ca.key",
        "tls/operator/admin.crt",
        "tls/operator/admin.key",
        "consul.token",
    }
    info = certs.describe(tmp_path / "tls" / "n4" / "edge.crt")
    assert info.issuer == certs.describe(tmp_path / "tls" / "ca.crt").subject


def test_a_ca_of_your_own_is_kept_and_issues_the_certificates(tmp_path: Path) -> None:
    ca = certs.make_ca(tmp_path / "tls", name="our own CA")
    key = ca.key.read_bytes()
    assert run(tmp_path, NODES) == 0
    assert ca.key.read_bytes() == key
    info = certs.describe(tmp_path / "tls" / "n2" / "partition.crt")
    assert info.issuer == "CN=our own CA"


def test_what_could_only_be_completed_by_replacing_a_file_is_refused_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "redis").mkdir()
    (tmp_path / "redis" / "n2.acl").write_text("user hexmq on #abc\n")
    assert run(tmp_path, NODES) == secrets_cli.EXIT_FAILED
    assert "n2.acl exists without its password file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["n2.acl", "redis"]


def test_bad_arguments_are_usage_errors(tmp_path: Path) -> None:
    assert cli.main(["secrets", "init", "--dir", str(tmp_path)]) == secrets_cli.EXIT_USAGE
    assert run(tmp_path, NODES, "--owner", "postgres=5") == secrets_cli.EXIT_USAGE
    assert run(tmp_path, NODES, "--owner", "redis=x") == secrets_cli.EXIT_USAGE
    assert run(tmp_path, ["n 1"]) == secrets_cli.EXIT_FAILED
    assert cli.main(["secrets", "--help"]) == 0


def test_only_root_may_give_files_to_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert run(tmp_path, NODES, "--owner", "redis=999") == secrets_cli.EXIT_FAILED
    assert "only root may hand files to another user" in capsys.readouterr().err
    assert not tmp_path.joinpath("tls").exists()
    assert run(tmp_path, NODES, "--owner", "hexmq=1000") == 0  # its own uid: fine


def readable_as(uid: int, directory: Path) -> set[str]:
    """The files under `directory` that user `uid` can read."""
    files = sorted(str(p) for p in directory.rglob("*") if p.is_file())
    script = 'for f in "$@"; do cat "$f" >/dev/null 2>&1 && echo "$f"; done; exit 0'
    result = subprocess.run(
        ["sh", "-c", script, "sh", *files], user=uid, capture_output=True, text=True, check=True
    )
    return {str(Path(line).relative_to(directory)) for line in result.stdout.splitlines()}


@as_root
def test_each_images_user_can_read_exactly_its_files(shared_dir: Path) -> None:
    assert run(shared_dir, NODES, "--consul-config", *OWNERS) == 0
    certificates = {n for n in expected_files(NODES) if n.endswith(".crt")}
    assert readable_as(HEXMQ_UID, shared_dir) == certificates | {
        *(f"tls/{n}/{r}.key" for n in NODES for r in NODE_ROLES),
        "consul.token",
        *(f"redis/{n}.password" for n in NODES),
    }
    assert readable_as(REDIS_UID, shared_dir) == certificates | {f"redis/{n}.acl" for n in NODES}
    assert readable_as(CONSUL_UID, shared_dir) == certificates | {"consul-acl.json"}
    # The CA key and the operator's key: nobody but the user that ran the command.
    assert readable_as(12345, shared_dir) == certificates
    acl = (shared_dir / "consul-acl.json").stat()
    assert (acl.st_uid, acl.st_gid) == (CONSUL_UID, 1000)


def test_the_redis_acl_file_loads_in_redis_server_and_refuses_a_client_without_password(
    shared_dir: Path,
) -> None:
    """As the redis image runs it: redis-server as the redis user (when this test may switch
    users), `--aclfile` the file made for its node."""
    owners = ["--owner", f"redis={REDIS_UID}"] if os.geteuid() == 0 else []
    assert run(shared_dir, ["n1"], *owners) == 0
    data = shared_dir.parent / "data"
    data.mkdir()
    if owners:
        os.chown(data, REDIS_UID, -1)
    (port,) = free_ports(1)
    argv = [shutil.which("redis-server") or "redis-server", "--port", str(port)]
    argv += ["--bind", "127.0.0.1", "--save", "", "--dir", str(data)]
    argv += ["--aclfile", str(shared_dir / "redis" / "n1.acl")]
    log = shared_dir.parent / "redis.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            argv, user=REDIS_UID if owners else None, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 10
        while not procs.tcp_accepts(port):
            assert server.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "redis-server does not listen"
            time.sleep(0.05)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"PING\r\n")
            assert sock.recv(256).startswith(b"-NOAUTH")
        password = (shared_dir / "redis" / "n1.password").read_text().strip()
        assert procs.redis_ready(port, credentials=(HEXMQ_USER, password))
        assert not procs.redis_ready(port, credentials=(HEXMQ_USER, password + "x"))
        assert not procs.redis_ready(port, credentials=("default", password))
    finally:
        server.terminate()
        server.wait(10)
