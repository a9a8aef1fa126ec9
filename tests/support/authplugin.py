"""An enhanced authentication plugin, as an operator would write one (docs/operations.md), loaded
by a real edge in the tests with ``--auth-plugin tests.support.authplugin:make``.

Method ``X-HMAC-CHALLENGE``: the CONNECT's Authentication Data is the user name; the server
answers with a random challenge (AUTH 0x18); the client proves it holds KEY by answering
HMAC-SHA256(KEY, challenge); the client is then that user.
"""

from __future__ import annotations

import hmac
import secrets

from services.edge.enhanced_auth import Continue, Failure, PluginContext, Step, Success

NAME = "X-HMAC-CHALLENGE"
KEY = b"hexmq test plugin key"


def answer(challenge: bytes, key: bytes = KEY) -> bytes:
    return hmac.digest(key, challenge, "sha256")


class _Exchange:
    def __init__(self) -> None:
        self._user: str | None = None
        self._challenge = b""

    def step(self, data: bytes | None) -> Step:
        if self._user is None:
            if not data:
                return Failure(0x87, "the user name goes in the Authentication Data")
            self._user = data.decode()
            self._challenge = secrets.token_bytes(16)
            return Continue(self._challenge)
        if data is not None and hmac.compare_digest(data, answer(self._challenge)):
            return Success(self._user)
        return Failure(0x87, "wrong answer", f"user {self._user!r}: wrong answer")


class HmacChallenge:
    name = NAME

    def exchange(self, *, client_id: str, peer: str) -> _Exchange:
        return _Exchange()


def make(context: PluginContext) -> HmacChallenge:
    return HmacChallenge()
