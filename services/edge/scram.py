"""SCRAM-SHA-512 (RFC 5802, with SHA-512 in the way RFC 7677 uses SHA-256) as an enhanced
authentication method, checked against the edge's password file.

The credentials: a ``SCRAM-SHA-512$ITER:SALT$STOREDKEY:SERVERKEY`` entry of the password file
(``hexmq passwd --scram``; services/edge/auth.py), which holds what RFC 5802 section 3 has the
server keep, and nothing a client could log in with: reading the file gives no login.

A mosquitto ``$7$ITER$SALT$HASH`` entry can serve too, but only with --scram-from-pbkdf2: its
HASH is PBKDF2-HMAC-SHA512(password, SALT, ITER) with a 64-byte output, which is exactly
SCRAM-SHA-512's SaltedPassword (checked against mosquitto_passwd 2.0.11's output in
tests/unit/test_scram.py), and from SaltedPassword a client computes its proof: whoever reads
such a file can log in as any of its users (issue 25). ``$6$`` entries cannot serve at all.
The password is not SASLprep-normalised by either tool: a password that SASLprep changes
(non-ASCII, some control characters) works with CONNECT's Password but not with SCRAM.

One exchange, in the MQTT Authentication Data:

    CONNECT  client-first-message   n,,n=USER,r=CNONCE
    AUTH 18  server-first-message   r=CNONCE+SNONCE,s=SALT,i=ITER
    AUTH 18  client-final-message   c=biws,r=CNONCE+SNONCE,p=PROOF
    CONNACK  server-final-message   v=SERVER-SIGNATURE          (AUTH 0x00 when re-authenticating)

An unknown user, or one whose entry cannot serve SCRAM, gets a salt derived from the file and
the name and fails at the proof, as a wrong password does: the exchange does not tell whether
a user exists. No channel binding (``-PLUS``) and no authorization identity other than USER.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from hexmq.mqtt.reason_codes import ReasonCode
from services.edge.auth import SALT_BYTES, SCRAM_ITERATIONS, SCRAM_SHA512, PasswordFile
from services.edge.enhanced_auth import Continue, Failure, PluginContext, Step, Success

log = logging.getLogger("hexmq.edge.auth")

NAME = "SCRAM-SHA-512"
_FAILED = "authentication failed"


@dataclass(frozen=True, slots=True)
class ScramKeys:
    """What the server keeps for one user: the salt and iteration count it sends, and the keys
    derived from SaltedPassword (RFC 5802 section 3)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_salted_password(
        cls, hash_name: str, salted: bytes, salt: bytes, iterations: int
    ) -> ScramKeys:
        client_key = hmac.digest(salted, b"Client Key", hash_name)
        return cls(
            salt,
            iterations,
            hashlib.new(hash_name, client_key).digest(),
            hmac.digest(salted, b"Server Key", hash_name),
        )


class ScramError(Exception):
    """A SCRAM message the server cannot accept; `error` is RFC 5802's server-error-value."""

    def __init__(self, error: str, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


def _attributes(message: str) -> list[tuple[str, str]]:
    """`a=value` attributes of a SCRAM message, in order."""
    out = []
    for part in message.split(","):
        if len(part) < 2 or part[1] != "=" or not part[0].isalpha():
            raise ScramError("invalid-encoding", f"not an attribute: {part[:40]!r}")
        out.append((part[0], part[2:]))
    return out


def _saslname(text: str) -> str:
    """RFC 5802's saslname: `=2C` is `,`, `=3D` is `=`, any other `=` is an error."""
    if "=" in text.replace("=2C", "").replace("=3D", ""):
        raise ScramError("invalid-username-encoding", f"bad escape in user name {text[:40]!r}")
    return text.replace("=2C", ",").replace("=3D", "=")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramError("invalid-encoding", f"{what} is not base64") from None


class ScramExchange:
    """The server side of one SCRAM exchange: client-first, then client-final."""

    def __init__(
        self,
        hash_name: str,
        lookup: Callable[[str], tuple[ScramKeys, str | None]],
        nonce: Callable[[], str],
    ) -> None:
        self._hash = hash_name
        self._size = hashlib.new(hash_name).digest_size
        # user -> (keys, why this user cannot log in whatever the proof; None if it can)
        self._lookup = lookup
        self._nonce = nonce
        self._state = "first"
        self._username = ""
        self._keys: ScramKeys | None = None
        self._refused: str | None = None
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce_full = ""

    def step(self, data: bytes | None) -> Step:
        state, self._state = self._state, "done"
        try:
            if data is None:
                raise ScramError("other-error", "no Authentication Data (a SCRAM message)")
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ScramError("invalid-encoding", "Authentication Data is not UTF-8") from None
            if state == "first":
                reply = self._client_first(text)
                self._state = "final"
                return Continue(reply.encode())
            if state == "final":
                return self._client_final(text)
            raise ScramError("other-error", "the exchange has ended")
        except ScramError as exc:
            who = f"user {self._username!r}: " if self._username else ""
            return Failure(
                ReasonCode.NOT_AUTHORIZED, _FAILED, who + exc.detail, f"e={exc.error}".encode()
            )

    def _client_first(self, text: str) -> str:
        # gs2-header: ("n" | "y" | "p=cb-name") "," [ "a=" authzid ] ","
        flag, _, rest = text.partition(",")
        authzid, sep, bare = rest.partition(",")
        if not sep:
            raise ScramError("invalid-encoding", "client-first-message without a GS2 header")
        if flag.startswith("p="):
            raise ScramError("channel-binding-not-supported", "the client wants channel binding")
        if flag not in ("n", "y"):
            raise ScramError("invalid-encoding", f"bad GS2 channel binding flag {flag[:10]!r}")
        attrs = _attributes(bare)
        if attrs and attrs[0][0] == "m":
            raise ScramError("extensions-not-supported", "mandatory extension (m=)")
        if len(attrs) < 2 or attrs[0][0] != "n" or attrs[1][0] != "r" or not attrs[1][1]:
            raise ScramError("invalid-encoding", "client-first-message needs n=USER,r=NONCE")
        username = _saslname(attrs[0][1])
        if not username:
            raise ScramError("invalid-username-encoding", "empty user name")
        self._username = username
        if authzid and (not authzid.startswith("a=") or _saslname(authzid[2:]) != username):
            raise ScramError(
                "invalid-username-encoding", "an authorization identity other than the user"
            )
        client_nonce = attrs[1][1]
        self._keys, self._refused = self._lookup(username)
        self._gs2_header = f"{flag},{authzid},"
        self._client_first_bare = bare
        self._nonce_full = client_nonce + self._nonce()
        salt = base64.b64encode(self._keys.salt).decode()
        self._server_first = f"r={self._nonce_full},s={salt},i={self._keys.iterations}"
        return self._server_first

    def _client_final(self, text: str) -> Step:
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise ScramError("invalid-encoding", "client-final-message without a proof")
        attrs = _attributes(without_proof)
        if len(attrs) < 2 or attrs[0][0] != "c" or attrs[1][0] != "r":
            raise ScramError("invalid-encoding", "client-final-message needs c=,r=,...,p=")
        binding = _b64decode(attrs[0][1], "channel binding (c=)")
        if binding != self._gs2_header.encode():
            raise ScramError("channel-bindings-dont-match", "c= differs from the GS2 header")
        if not hmac.compare_digest(attrs[1][1].encode(), self._nonce_full.encode()):
            raise ScramError("other-error", "the nonce (r=) is not the one of this exchange")
        proof = _b64decode(proof_b64, "proof (p=)")
        if len(proof) != self._size:
            raise ScramError("invalid-proof", f"a {len(proof)}-byte proof")
        keys = self._keys
        assert keys is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        signature = hmac.digest(keys.stored_key, auth_message, self._hash)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        valid = hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), keys.stored_key)
        if self._refused is not None:
            raise ScramError("invalid-proof", self._refused)
        if not valid:
            raise ScramError("invalid-proof", "wrong password (the client proof does not verify)")
        server_signature = hmac.digest(keys.server_key, auth_message, self._hash)
        return Success(self._username, b"v=" + base64.b64encode(server_signature))


class ScramSha512:
    """The SCRAM-SHA-512 method over a password file: its SCRAM-SHA-512 entries, and with
    `from_pbkdf2` (--scram-from-pbkdf2, insecure) its `$7$` entries too."""

    name = NAME
    HASH = "sha512"

    def __init__(
        self,
        passwords: PasswordFile,
        *,
        nonce: Callable[[], str] | None = None,
        from_pbkdf2: bool = False,
    ) -> None:
        self._nonce = nonce or (lambda: secrets.token_urlsafe(24))
        self._keys: dict[str, ScramKeys] = {}
        self._unusable: dict[str, str] = {}
        decoy_key = hashlib.sha512(b"hexmq scram decoy salt")
        pbkdf2_users = []
        for user, entry in sorted(passwords.users.items()):
            decoy_key.update(entry.salt + entry.digest)
            if entry.scheme == SCRAM_SHA512:
                self._keys[user] = ScramKeys(
                    entry.salt, entry.iterations, entry.digest, entry.server_key
                )
            elif entry.scheme == 7 and len(entry.digest) == 64 and from_pbkdf2:
                self._keys[user] = ScramKeys.from_salted_password(
                    self.HASH, entry.digest, entry.salt, entry.iterations
                )
                pbkdf2_users.append(user)
            else:
                self._unusable[user] = (
                    f"the password file has a ${entry.scheme}$ entry for this user, which "
                    f"does not serve {NAME}; write a SCRAM-SHA-512 entry (hexmq passwd --scram)"
                )
        # Secret (it hashes every entry's hash) and the same on every edge reading this file,
        # so an unknown user's salt is stable across nodes and restarts, like a real one's;
        # and the iteration count most of the real users have, so that it gives none away.
        self._decoy_key = decoy_key.digest()
        counts = Counter(keys.iterations for keys in self._keys.values())
        self._decoy_iterations = counts.most_common(1)[0][0] if counts else SCRAM_ITERATIONS
        if self._unusable:
            log.warning(
                "%s: %d user(s) of %s have no SCRAM-SHA-512 entry and cannot log in with it "
                "(CONNECT's password still works): %s",
                NAME,
                len(self._unusable),
                passwords.source,
                ", ".join(sorted(self._unusable)),
            )
        if pbkdf2_users:
            log.warning(
                "%s: --scram-from-pbkdf2: %d user(s) of %s log in with their $7$ hash, which "
                "is SCRAM's SaltedPassword: whoever reads that file can log in as them: %s",
                NAME,
                len(pbkdf2_users),
                passwords.source,
                ", ".join(pbkdf2_users),
            )

    @classmethod
    def from_context(cls, context: PluginContext) -> ScramSha512:
        if context.passwords is None:
            raise ValueError(f"--auth-method {NAME} needs --password-file")
        return cls(context.passwords, from_pbkdf2=context.scram_from_pbkdf2)

    def exchange(self, *, client_id: str, peer: str) -> ScramExchange:
        return ScramExchange(self.HASH, self._lookup, self._nonce)

    def _lookup(self, username: str) -> tuple[ScramKeys, str | None]:
        keys = self._keys.get(username)
        if keys is not None:
            return keys, None
        # A salt and keys no password matches; the same for the same name every time.
        seed = hmac.digest(self._decoy_key, username.encode(), self.HASH)
        decoy = ScramKeys(seed[:SALT_BYTES], self._decoy_iterations, seed, seed)
        return decoy, self._unusable.get(username, "unknown user")
