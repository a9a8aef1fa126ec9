"""A Consul ACL token kept in a file, read again when the file changes (a rotation).

    token = TokenFile(Path("/etc/hexmq/consul.token"), "--consul-token-file")
    token.current()     # the file's content, stripped; one stat() per call, a read only on change

`hexmq consul-dev --acl-token-file` (the token it accepts) and `hexmq membership
--consul-token-file` (the token it sends) both use it. An operator rotates a token by writing
the new one to the file, best atomically (a temporary file renamed over it): the next request
after the change uses the new one, with no restart. A change that leaves the file unreadable or
empty (a rotation caught half-way by a truncating write) keeps the last token, with one warning,
rather than lock the cluster out; the next good write is picked up as usual.

The token is never logged or shown: messages name the file only.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("hexmq.consul")

_Signature = tuple[int, int, int, int, int]
# File times tick coarsely (the kernel's jiffies): a same-size write within a tick of the last
# read would leave the signature unchanged. A file read less than this long after its last
# change is read again on every look (as git treats its "racy" index entries).
RACY_NS = 1_000_000_000


class TokenFileError(ValueError):
    """A token file that cannot be used at start; the message names the option and the file."""


def _signature(st: os.stat_result) -> _Signature:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class TokenFile:
    def __init__(self, path: Path, option: str, *, clock: Callable[[], int] = time.time_ns) -> None:
        """`clock`: wall-clock nanoseconds, as the file times are."""
        self.path = path
        self.option = option
        self._clock = clock
        try:
            signature = _signature(path.stat())
            token = self._read()
        except OSError as exc:
            raise TokenFileError(
                f"{option} {path}: cannot read it: {exc.strerror or exc}"
            ) from None
        except UnicodeDecodeError:
            raise TokenFileError(
                f"{option} {path} is not UTF-8 text: it must hold the token"
            ) from None
        if not token:
            raise TokenFileError(f"{option} {path} is empty: it must hold the token")
        self._token = token
        self._signature = signature
        self._settled = self._is_settled(signature)
        self._complained: _Signature | str | None = None  # what was last complained of

    def _read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="strict").strip()

    def current(self) -> str:
        """The token now: the file's content if it changed since the last look (and is
        readable and not empty), else the one read before."""
        try:
            signature = _signature(self.path.stat())
        except OSError as exc:
            self._complain("missing", exc.strerror or str(exc))
            return self._token
        if (signature == self._signature and self._settled) or signature == self._complained:
            return self._token  # unchanged (or the same unusable change): nothing to read
        try:
            token = self._read()
        except (OSError, UnicodeDecodeError) as exc:
            self._complain(signature, getattr(exc, "strerror", None) or str(exc))
            return self._token
        if not token:
            self._complain(signature, "it is empty")
            return self._token
        if token != self._token:
            log.info("%s %s changed: using the new token from now on", self.option, self.path)
        self._token, self._signature, self._complained = token, signature, None
        self._settled = self._is_settled(signature)
        return token

    def _is_settled(self, signature: _Signature) -> bool:
        """Whether a file of this signature, just read, cannot change unseen (RACY_NS): its
        last change (ctime, which no one can set back) is older than a tick."""
        return self._clock() - signature[4] > RACY_NS

    def _complain(self, what: _Signature | str, why: str) -> None:
        """One warning per bad state of the file, not one per request."""
        if what != self._complained:
            log.warning(
                "%s %s changed but cannot be used (%s): keeping the previous token",
                self.option,
                self.path,
                why,
            )
        self._complained = what
