"""Authentication: who may connect. Password files in mosquitto_passwd's format, the anonymous
policy, and the edge's verdict on a CONNECT's user name and password.

A password file has one ``user:hash`` line per user (blank lines and ``#`` comments allowed),
with the hash as mosquitto_passwd 2.x writes it:

- ``$7$ITERATIONS$SALT$HASH``: PBKDF2-HMAC-SHA512 (mosquitto_passwd's default),
- ``$6$SALT$HASH``: SHA512(password + salt) (``mosquitto_passwd -H sha512``),

and hexmq's own SCRAM credential, RFC 5803's form for SCRAM-SHA-512:

- ``SCRAM-SHA-512$ITERATIONS:SALT$STOREDKEY:SERVERKEY``: the salt and iteration count, and
  StoredKey = SHA512(HMAC(SaltedPassword, "Client Key")) and ServerKey =
  HMAC(SaltedPassword, "Server Key") (RFC 5802 section 3). Neither lets anyone log in: a
  SCRAM proof needs ClientKey, of which StoredKey is a hash, and a CONNECT needs the
  password. (A ``$7$`` hash is SaltedPassword itself: SCRAM login material, see
  services/edge/scram.py.)

SALT and the rest in standard base64. `hash_password` writes the ``$7$`` form, `scram_entry`
the SCRAM one (``hexmq passwd [--scram]``).
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


# PasswordHash.scheme of a SCRAM-SHA-512 credential (the others are mosquitto's numbers).
SCRAM_SHA512 = 512
SCRAM_PREFIX = "SCRAM-SHA-512$"
# RFC 7677 asks SCRAM servers for at least 4096 iterations.
SCRAM_ITERATIONS = 4096


@dataclass(frozen=True, slots=True)
class PasswordHash:
    # 6: SHA512(password + salt); 7: PBKDF2-HMAC-SHA512; SCRAM_SHA512: digest is StoredKey
    scheme: int
    iterations: int
    salt: bytes
    digest: bytes
    server_key: bytes = b""

    def matches(self, password: bytes) -> bool:
        if self.scheme == SCRAM_SHA512:
            salted = hashlib.pbkdf2_hmac("sha512", password, self.salt, self.iterations, 64)
            client_key = hmac.digest(salted, b"Client Key", "sha512")
            got = hashlib.sha512(client_key).digest()
        elif self.scheme == 7:
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
    """A ``$7$...``, ``$6$...`` or ``SCRAM-SHA-512$...`` entry; ValueError saying what is
    wrong with it."""
    if text.startswith(SCRAM_PREFIX):
        return _parse_scram(text[len(SCRAM_PREFIX) :])
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
        "as mosquitto_passwd writes them, or SCRAM-SHA-512$ITERATIONS:SALT$STOREDKEY:SERVERKEY, "
        "as hexmq passwd --scram writes it)"
    )


def _parse_scram(text: str) -> PasswordHash:
    info, sep, keys = text.partition("$")
    iterations_text, sep1, salt = info.partition(":")
    stored, sep2, server = keys.partition(":")
    if not (sep and sep1 and sep2):
        raise ValueError(
            "a SCRAM-SHA-512 entry is SCRAM-SHA-512$ITERATIONS:SALT$STOREDKEY:SERVERKEY"
        )
    try:
        iterations = int(iterations_text)
    except ValueError:
        raise ValueError(f"iteration count {iterations_text!r} is not a number") from None
    if iterations < 1:
        raise ValueError("iteration count must be at least 1")
    stored_key, server_key = _b64(stored, "StoredKey"), _b64(server, "ServerKey")
    if len(stored_key) != 64 or len(server_key) != 64:
        raise ValueError("StoredKey and ServerKey of SCRAM-SHA-512 are 64 bytes each")
    return PasswordHash(SCRAM_SHA512, iterations, _b64(salt, "salt"), stored_key, server_key)


def scram_entry(
    password: str, *, iterations: int = SCRAM_ITERATIONS, salt: bytes | None = None
) -> str:
    """The SCRAM-SHA-512 credential of `password` (RFC 5803's form): salt, iterations,
    StoredKey and ServerKey, never SaltedPassword."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations, 64)
    stored_key = hashlib.sha512(hmac.digest(salted, b"Client Key", "sha512")).digest()
    server_key = hmac.digest(salted, b"Server Key", "sha512")
    b64 = base64.b64encode
    return (
        f"{SCRAM_PREFIX}{iterations}:{b64(salt).decode()}"
        f"${b64(stored_key).decode()}:{b64(server_key).decode()}"
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
