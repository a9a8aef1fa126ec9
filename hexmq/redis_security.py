"""A node's Redis locked down: the redis.conf lines for its ACL users and for TLS.

Only the node's partition service talks to the node's Redis. It gets a user of its own that
can run exactly the commands the service sends, on its own keys (`hx:*`, services/partition/
keys.py) and nothing else: no CONFIG, DEBUG, FLUSHALL, KEYS, SHUTDOWN, MONITOR, ACL, MODULE,
SCRIPT/EVAL, REPLICAOF ..., so a stolen password reads and writes hexmq's data at worst, and
cannot reconfigure Redis, run code in it, or turn it into a replica of a server elsewhere.
The `default` user, which every connection starts as, is switched off and has no password: a
client without credentials can do nothing but authenticate, and nobody can authenticate as
`default`.

Redis replays its append-only file as the `default` user, and EXEC re-checks the ACL of every
command of a transaction, also during that replay (redis/redis#14541, fixed by #14545 at the
end of 2025; Debian's 7.0.15 has it, valkey too, valkey-io/valkey#3983): a `default` user
that may not run the partition service's transaction commands makes Redis drop every
MULTI/EXEC of the file at restart, silently but for a `-NOPERM ... ACLs rules changed` line
per transaction in its log, so a restarted node comes back empty. So the disabled `default`
user keeps exactly those commands on hexmq's keys (TRANSACTION_COMMANDS); as it is off, no
connection can use them.

The config file holds the password's SHA-256 only (`#<hex>`), so reading the file does not
give the password away; the partition service reads the password itself from a file or its
environment (`--redis-password-file`, HEXMQ_REDIS_PASSWORD).

Pure: no I/O (the local-cluster launcher and the docs write these lines into redis.conf).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from pathlib import Path
from typing import Final

# The user hexmq's partition service runs as.
HEXMQ_USER: Final = "hexmq"
# Every key the partition service reads or writes starts with this (services/partition/keys.py).
KEY_PATTERN: Final = "hx:*"

# Exactly the commands the partition service sends, found by running its tests against a Redis
# with this ACL and reading INFO commandstats and ACL LOG (docs/operations.md, "The partition
# service's Redis"). Redis 7 names a subcommand `command|subcommand`.
HEXMQ_COMMANDS: Final = (
    # Connecting (redis-py 8.1 and services/partition/redis_tx.py): HELLO 3 AUTH user password
    # (redis-py speaks RESP3), AUTH user password (the transaction writer), SELECT for a
    # database other than 0. Not CLIENT SETINFO: the service tells redis-py not to send it
    # (Redis 7.0 has no such command; an ACL naming it does not load there).
    "hello",
    "auth",
    "select",
    # The start check (services/partition/redis_check.py).
    "ping",
    # Loading partitions, positions and snapshots (RedisStore).
    "hgetall",
    "hmget",
    "hkeys",
    "hscan",
    # The writers: one MULTI/EXEC per batch of HSET/HDEL/DEL (apply_ops, put_position).
    "multi",
    "exec",
    "hset",
    "hdel",
    "del",
)

# The commands the writers send inside MULTI/EXEC (services/partition/write_batch.py apply_ops
# and put_position): what Redis's replay of the append-only file runs as `default` (see above).
TRANSACTION_COMMANDS: Final = ("hset", "hdel", "del")

_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def generate_password() -> str:
    """A new random password for a node's Redis user (256 bits, URL-safe characters)."""
    return secrets.token_urlsafe(32)


def password_hash(password: str) -> str:
    """The SHA-256 hex digest Redis's ACL takes as `#<hash>` in place of the password."""
    return hashlib.sha256(password.encode()).hexdigest()


def acl_lines(user: str, password: str) -> list[str]:
    """redis.conf lines: the `default` user off without a password (a connection without
    credentials can only authenticate), holding only what Redis's replay of the append-only
    file needs (TRANSACTION_COMMANDS on hexmq's keys), and `user` on with the password
    (hashed), hexmq's keys and exactly HEXMQ_COMMANDS. ValueError for a user name Redis's
    config cannot take or an empty password."""
    if not _USER_NAME.fullmatch(user) or user == "default":
        raise ValueError(
            f"a Redis user for hexmq is 1-64 letters, digits, '_', '.' or '-' and not "
            f"'default', got {user!r}"
        )
    if not password:
        raise ValueError("the Redis user needs a password")
    commands = " ".join(f"+{c}" for c in HEXMQ_COMMANDS)
    replayed = " ".join(f"+{c}" for c in TRANSACTION_COMMANDS)
    return [
        f"user default off resetpass resetkeys ~{KEY_PATTERN} resetchannels -@all {replayed}",
        f"user {user} reset on #{password_hash(password)} ~{KEY_PATTERN} resetchannels -@all "
        f"{commands}",
    ]


# The operator's own user (`hexmq cluster` makes one per node, its password beside the
# node's): what a person debugging a node's Redis uses, never the services.
OPERATOR_USER: Final = "operator"


def operator_line(password: str) -> str:
    """The redis.conf line of the operator's user: every key and command, with its own
    password (hashed), so that nobody needs the service's password or the `default` user to
    look into a node's data."""
    if not password:
        raise ValueError("the operator's Redis user needs a password")
    return f"user {OPERATOR_USER} reset on #{password_hash(password)} ~* &* +@all"


def _quote(value: str) -> str:
    """A redis.conf argument: double-quoted, with backslashes and quotes escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def tls_lines(cert: Path | str, key: Path | str, ca: Path | str, port: int) -> list[str]:
    """redis.conf lines for TLS only: serve TLS on `port` and nothing in plain text (`port 0`),
    with this certificate and key, and require every client to present a certificate signed
    by `ca` (`tls-auth-clients yes`, also Redis's default once TLS is on)."""
    if not 1 <= port <= 65535:
        raise ValueError(f"a port is 1-65535, got {port}")
    return [
        f"tls-port {port}",
        "port 0",
        f"tls-cert-file {_quote(str(cert))}",
        f"tls-key-file {_quote(str(key))}",
        f"tls-ca-cert-file {_quote(str(ca))}",
        "tls-auth-clients yes",
    ]
