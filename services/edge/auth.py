"""Authentication: who may connect. Password files in mosquitto_passwd's format, the anonymous
policy, and the edge's verdict on a CONNECT's user name and password.

A password file has one ``user:hash`` line per user (blank lines and ``#`` comments allowed),
with the hash as mosquitto_passwd 2.x writes it:

- ``$7$ITERATIONS$SALT$HASH``: PBKDF2-HMAC-SHA512 (mosquitto_passwd's default),
- ``$6$SALT$HASH``: SHA512(password + salt) (``mosquitto_passwd -H sha512``),

SALT and HASH in standard base64. `hash_password` writes the ``$7$`` form
(``python -m services.edge.passwd`` is a small mosquitto_passwd for machines without it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from services.edge.acl import read_config_text

# mosquitto_passwd 2.0's defaults, so that both tools write the same kind of line.
DEFAULT_ITERATIONS = 101
SALT_BYTES = 12
# Successful logins remembered (keyed by a keyed hash, never the password), so that reconnects
# do not pay for PBKDF2 again; cleared when full.
_VERIFIED_CACHE_SIZE = 10_000


@dataclass(frozen=True, slots=True)
class PasswordHash:
    scheme: int  # 6: SHA512(password + salt); 7: PBKDF2-HMAC-SHA512
    iterations: int
    salt: bytes
    digest: bytes

    def matches(self, password: bytes) -> bool:
        if self.scheme == 7:
            got = hashlib.pbkdf2_hmac(
                "sha512", password, self.salt, self.iterations, len(self.digest)
            )
        else:
            got = hashlib.sha512(password + self.salt).digest()
        return hmac.compare_digest(got, self.digest)


def _b64(text: str, what: str) -> bytes:
    try:
        value = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the {what} is not valid base64") from None
    if not value:
        raise ValueError(f"the {what} is empty")
    return value


def parse_hash(text: str) -> PasswordHash:
    """A ``$7$...`` or ``$6$...`` hash; ValueError saying what is wrong with it."""
    parts = text.split("$")
    if len(parts) == 5 and parts[0] == "" and parts[1] == "7":
        try:
            iterations = int(parts[2])
        except ValueError:
            raise ValueError(f"iteration count {parts[2]!r} is not a number") from None
        if iterations < 1:
            raise ValueError("iteration count must be at least 1")
        return PasswordHash(7, iterations, _b64(parts[3], "salt"), _b64(parts[4], "hash"))
    if len(parts) == 4 and parts[0] == "" and parts[1] == "6":
        digest = _b64(parts[3], "hash")
        if len(digest) != 64:
            raise ValueError("a $6$ hash must be 64 bytes (SHA-512)")
        return PasswordHash(6, 1, _b64(parts[2], "salt"), digest)
    raise ValueError(
        "unknown password hash (expected $7$ITERATIONS$SALT$HASH or $6$SALT$HASH, "
        "as mosquitto_passwd writes them)"
    )


def hash_password(
    password: str, *, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None
) -> str:
    """The ``$7$`` (PBKDF2-HMAC-SHA512) form of `password`, as mosquitto_passwd writes it."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    b64 = base64.b64encode
    return f"$7${iterations}${b64(salt).decode()}${b64(digest).decode()}"


class PasswordFile:
    """The users of one password file, loaded once at startup."""

    def __init__(self, users: dict[str, PasswordHash], source: str = "<memory>") -> None:
        self.users = users
        self.source = source
        self._key = os.urandom(32)
        self._verified: set[bytes] = set()
        # Compared against when the user is unknown, so that a wrong user name costs as much
        # as a wrong password.
        self._decoy = PasswordHash(7, DEFAULT_ITERATIONS, b"\0" * SALT_BYTES, b"\0" * 64)

    @classmethod
    def load(cls, path: Path) -> PasswordFile:
        return cls.parse(read_config_text(path, "password file"), str(path))

    @classmethod
    def parse(cls, text: str, source: str) -> PasswordFile:
        users: dict[str, PasswordHash] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"password file {source}, line {number}"
            user, sep, hashed = line.partition(":")
            if not sep or not user:
                raise ValueError(f"{where}: expected USER:HASH")
            if user in users:
                raise ValueError(f"{where}: user {user!r} appears twice")
            try:
                users[user] = parse_hash(hashed)
            except ValueError as exc:
                raise ValueError(f"{where} (user {user!r}): {exc}") from None
        return cls(users, source)

    def verify(self, username: str, password: bytes) -> bool:
        key = hmac.digest(self._key, username.encode() + b"\0" + password, "sha256")
        if key in self._verified:
            return True
        entry = self.users.get(username)
        if entry is None:
            self._decoy.matches(password)
            return False
        if not entry.matches(password):
            return False
        if len(self._verified) >= _VERIFIED_CACHE_SIZE:
            self._verified.clear()
        self._verified.add(key)
        return True
