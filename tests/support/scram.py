"""The client side of SCRAM (RFC 5802; SHA-512 by default, as RFC 7677 does SHA-256), written
from the RFC for the tests, apart from the broker's server side (services/edge/scram.py).

    client = ScramClient("alice", "secret")
    connect_data = client.first()                # n,,n=alice,r=NONCE
    final_data = client.final(server_first)      # c=biws,r=NONCE+SNONCE,p=PROOF
    client.verify(server_final)                  # AssertionError unless v= proves the server
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient:
    def __init__(
        self,
        username: str,
        password: str,
        *,
        hash_name: str = "sha512",
        nonce: str | None = None,
        gs2_header: str = "n,,",
    ) -> None:
        self.username = username
        self.password = password
        self.hash_name = hash_name
        self.nonce = nonce if nonce is not None else secrets.token_urlsafe(18)
        self.gs2_header = gs2_header
        self.client_first_bare = f"n={_escape(username)},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return (self.gs2_header + self.client_first_bare).encode()

    def final(self, server_first: bytes, *, password: str | None = None) -> bytes:
        """The client-final-message for `server_first` (with another `password` to test a
        wrong one)."""
        text = server_first.decode()
        attrs = dict(part.split("=", 1) for part in text.split(","))
        server_nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        assert server_nonce.startswith(self.nonce), text
        assert len(server_nonce) > len(self.nonce), f"the server added no nonce: {text}"
        size = hashlib.new(self.hash_name).digest_size
        pw = (self.password if password is None else password).encode()
        salted = hashlib.pbkdf2_hmac(self.hash_name, pw, salt, iterations, size)
        client_key = hmac.digest(salted, b"Client Key", self.hash_name)
        stored_key = hashlib.new(self.hash_name, client_key).digest()
        channel_binding = base64.b64encode(self.gs2_header.encode()).decode()
        without_proof = f"c={channel_binding},r={server_nonce}"
        auth_message = f"{self.client_first_bare},{text},{without_proof}".encode()
        signature = hmac.digest(stored_key, auth_message, self.hash_name)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.digest(salted, b"Server Key", self.hash_name)
        self.server_signature = hmac.digest(server_key, auth_message, self.hash_name)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify(self, server_final: bytes | None) -> None:
        """The server-final-message proves the server knew the password's keys."""
        assert server_final is not None, "no server-final-message"
        expected = b"v=" + base64.b64encode(self.server_signature)
        assert hmac.compare_digest(server_final, expected), f"server signature {server_final!r}"


def salted_password_final(client: ScramClient, server_first: bytes, salted: bytes) -> bytes:
    """The client-final-message of someone who holds `salted` as SaltedPassword (a password
    file's hash, say) instead of the password: what a stolen file is worth."""
    text = server_first.decode()
    nonce = dict(part.split("=", 1) for part in text.split(","))["r"]
    name = client.hash_name
    client_key = hmac.digest(salted, b"Client Key", name)
    stored_key = hashlib.new(name, client_key).digest()
    channel_binding = base64.b64encode(client.gs2_header.encode()).decode()
    without_proof = f"c={channel_binding},r={nonce}"
    auth_message = f"{client.client_first_bare},{text},{without_proof}".encode()
    signature = hmac.digest(stored_key, auth_message, name)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()
