"""An in-memory Consul KV with sessions, on a clock the caller passes in.

The subset the membership agents rely on (../shared/reference/consul-api.md): one raft index
for every change; each key's CreateIndex and ModifyIndex; PUT with `cas` (0: create only if
absent; N: only if ModifyIndex is N) or with `acquire` (a live session takes a free key or
one it holds); sessions with a TTL that lapse when not renewed in time and then delete the
keys they hold (behavior delete, LockDelay 0). Values are any immutable Python value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Entry:
    value: Any
    create_index: int
    modify_index: int
    session: str | None


@dataclass(slots=True)
class Session:
    node: str
    ttl_ms: int
    expires_ms: int


class MemoryConsul:
    def __init__(self) -> None:
        self.index = 0
        self.kv: dict[str, Entry] = {}
        self.sessions: dict[str, Session] = {}
        self._created = 0

    def _bump(self) -> int:
        self.index += 1
        return self.index

    # ----- sessions ----------------------------------------------------------------------

    def create_session(self, node: str, ttl_ms: int, now_ms: int) -> str:
        self._created += 1
        sid = f"{node}-s{self._created}"
        self.sessions[sid] = Session(node, ttl_ms, now_ms + ttl_ms)
        self._bump()
        return sid

    def renew(self, sid: str, now_ms: int) -> bool:
        """False for an unknown (lapsed or destroyed) session, as Consul's 404."""
        session = self.sessions.get(sid)
        if session is None:
            return False
        session.expires_ms = now_ms + session.ttl_ms
        return True

    def destroy(self, sid: str) -> None:
        if self.sessions.pop(sid, None) is None:
            return
        self._bump()
        for key in sorted(k for k, e in self.kv.items() if e.session == sid):
            del self.kv[key]

    def expire(self, now_ms: int) -> list[str]:
        """Invalidate every session whose TTL ran out; the nodes whose sessions lapsed."""
        lapsed = sorted(sid for sid, s in self.sessions.items() if s.expires_ms <= now_ms)
        nodes = [self.sessions[sid].node for sid in lapsed]
        for sid in lapsed:
            self.destroy(sid)
        return nodes

    # ----- KV ----------------------------------------------------------------------------

    def get(self, key: str) -> Entry | None:
        return self.kv.get(key)

    def under(self, prefix: str) -> dict[str, Entry]:
        return {k: e for k, e in sorted(self.kv.items()) if k.startswith(prefix)}

    def put(
        self, key: str, value: Any, *, cas: int | None = None, acquire: str | None = None
    ) -> bool:
        if cas is not None and acquire is not None:
            raise ValueError("cas and acquire are mutually exclusive (Consul answers 400)")
        old = self.kv.get(key)
        if cas is not None and (old.modify_index if old is not None else 0) != cas:
            return False
        if acquire is not None:
            if acquire not in self.sessions:
                return False
            if old is not None and old.session not in (None, acquire):
                return False
            if old is not None and old.value == value and old.session == acquire:
                return True  # unchanged: no new index
        index = self._bump()
        created = old.create_index if old is not None else index
        holder = acquire if acquire is not None else (old.session if old is not None else None)
        self.kv[key] = Entry(value, created, index, holder)
        return True
