"""The redis.conf lines that lock a node's Redis (hexmq/redis_security.py). What Redis makes of
them is tests/integration/test_redis_security.py; these check the lines themselves."""

from __future__ import annotations

import hashlib
import string

import pytest

from hexmq import redis_security as rs

# Commands that reconfigure, wipe, stop or run code in Redis, or copy it elsewhere: the
# partition service's user must never hold them.
DANGEROUS = {
    "config", "debug", "flushall", "flushdb", "keys", "shutdown", "monitor", "acl", "module",
    "script", "eval", "evalsha", "fcall", "function", "replicaof", "slaveof", "migrate",
    "restore", "save", "bgsave", "bgrewriteaof", "sync", "psync", "client", "cluster", "failover",
}  # fmt: skip


def test_a_generated_password_is_long_random_and_url_safe() -> None:
    passwords = {rs.generate_password() for _ in range(20)}
    assert len(passwords) == 20
    for password in passwords:
        assert len(password) >= 43  # 32 random bytes
        assert set(password) <= set(string.ascii_letters + string.digits + "-_")


def test_the_default_user_is_off_and_holds_only_what_the_aof_replay_needs() -> None:
    default, _hexmq = rs.acl_lines("hexmq", "secret")
    words = default.split()
    assert words[:3] == ["user", "default", "off"]
    assert "on" not in words
    assert "nopass" not in words
    assert "resetpass" in words
    assert not any(w.startswith(("&", ">", "#", "<")) for w in words)
    # Redis replays MULTI/EXEC from its append-only file as `default`, and EXEC checks the ACL:
    # the writers' transaction commands, on hexmq's keys, and nothing else.
    assert [w for w in words if w.startswith("~")] == ["~hx:*"]
    first_grant = words.index("-@all") + 1
    assert [w[1:] for w in words[first_grant:]] == list(rs.TRANSACTION_COMMANDS)
    assert set(rs.TRANSACTION_COMMANDS) <= set(rs.HEXMQ_COMMANDS)


def test_the_hexmq_user_holds_the_password_hashed_its_keys_and_exactly_its_commands() -> None:
    _default, line = rs.acl_lines("hexmq", "s3cret pass")
    assert "s3cret" not in line
    words = line.split()
    assert words[:2] == ["user", "hexmq"]
    assert "on" in words
    digest = hashlib.sha256(b"s3cret pass").hexdigest()
    assert f"#{digest}" in words
    assert rs.password_hash("s3cret pass") == digest
    assert [w for w in words if w.startswith("~")] == ["~hx:*"]
    assert "resetchannels" in words
    assert not any(w.startswith("&") for w in words)  # no Pub/Sub channels
    # Every command is granted one by one after everything is taken away.
    first_grant = next(i for i, w in enumerate(words) if w.startswith("+"))
    assert words[first_grant - 1] == "-@all"
    granted = [w[1:] for w in words[first_grant:]]
    assert all(w.startswith("+") for w in words[first_grant:])
    assert granted == list(rs.HEXMQ_COMMANDS)
    assert not any(c.startswith("@") for c in granted)  # no categories


def test_no_dangerous_command_is_granted() -> None:
    granted = {c.split("|")[0] for c in rs.HEXMQ_COMMANDS}
    assert not granted & DANGEROUS


@pytest.mark.parametrize("user", ["default", "", "two words", "a\nuser on +@all", "x" * 65])
def test_a_user_name_redis_config_cannot_take_is_refused(user: str) -> None:
    with pytest.raises(ValueError, match="a Redis user for hexmq"):
        rs.acl_lines(user, "secret")


def test_an_empty_password_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a password"):
        rs.acl_lines("hexmq", "")


def test_tls_lines_serve_tls_only_and_require_client_certificates() -> None:
    lines = rs.tls_lines('/etc/redis/my "node".crt', "/etc/redis/node.key", "/etc/ca.crt", 6380)
    assert lines == [
        "tls-port 6380",
        "port 0",
        'tls-cert-file "/etc/redis/my \\"node\\".crt"',
        'tls-key-file "/etc/redis/node.key"',
        'tls-ca-cert-file "/etc/ca.crt"',
        "tls-auth-clients yes",
    ]


@pytest.mark.parametrize("port", [0, 65536])
def test_tls_lines_refuse_a_port_out_of_range(port: int) -> None:
    with pytest.raises(ValueError, match="a port is 1-65535"):
        rs.tls_lines("c", "k", "ca", port)
