"""Consul's KV tables: entries, tombstones and lock-delays (agent/consul/state/kvs.go).

Every write gets the index `idx` the caller would commit; it answers whether it wrote, so the
caller commits that index only when something changed. Indexes never go backwards: the table
index covers entries and tombstones, and a prefix's index counts the tombstones under it.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.membership.consul_dev.model import (
    LOCK_DELAY_MAX_NS,
    NS,
    TOMBSTONE_TTL_S,
    KVEntry,
)


@dataclass(slots=True)
class Tombstone:
    index: int
    reap_at: float  # server clock; tombstones are kept TOMBSTONE_TTL_S (Consul's tombstone_ttl)


class KVStore:
    def __init__(self) -> None:
        self.entries: dict[str, KVEntry] = {}
        self.tombstones: dict[str, Tombstone] = {}
        self.table_index = 0  # kvsMaxIndex: the highest index of the kvs and tombstones tables
        self.lock_delays: dict[str, float] = {}  # key -> until (server clock)
        self.written: list[str] = []  # keys written or deleted since the caller last drained

    # --- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[int, KVEntry | None]:
        """The table's index, whether or not the key exists (Consul's KVSGet)."""
        return self.table_index, self.entries.get(key)

    def _prefix_index(self, prefix: str, entries: list[KVEntry]) -> int:
        """KVSList's index: the newest entry or tombstone under the prefix, else the table's."""
        if not prefix:
            return self.table_index
        newest = max((e.modify_index for e in entries), default=0)
        newest = max(
            [newest, *(t.index for k, t in self.tombstones.items() if k.startswith(prefix))]
        )
        return newest or self.table_index

    def _under(self, prefix: str) -> list[KVEntry]:
        return [self.entries[k] for k in sorted(self.entries) if k.startswith(prefix)]

    def list_prefix(self, prefix: str) -> tuple[int, list[KVEntry]]:
        entries = self._under(prefix)
        return self._prefix_index(prefix, entries), entries

    def keys(self, prefix: str, separator: str) -> tuple[int, list[str]]:
        """KVSListKeys: with a separator, keys below the next separator fold into one."""
        entries = self._under(prefix)
        keys: list[str] = []
        for entry in entries:
            cut = entry.key.find(separator, len(prefix)) if separator else -1
            key = entry.key if cut < 0 else entry.key[: cut + len(separator)]
            if not keys or keys[-1] != key:
                keys.append(key)
        return self._prefix_index(prefix, entries), keys

    def drain_written(self) -> list[str]:
        written, self.written = self.written, []
        return written

    def held_by(self, session_id: str) -> list[KVEntry]:
        return [e for e in self.entries.values() if e.session == session_id]

    # --- writes ------------------------------------------------------------------------------

    def _store(self, idx: int, entry: KVEntry, existing: KVEntry | None) -> bool:
        """kvsSetTxn's tail: keep CreateIndex; an unchanged entry keeps its ModifyIndex."""
        entry.create_index = existing.create_index if existing else idx
        if existing is not None and existing.same_content(entry):
            return False
        entry.modify_index = idx
        self.entries[entry.key] = entry
        self.table_index = max(self.table_index, idx)
        self.written.append(entry.key)
        return True

    def set(self, idx: int, key: str, value: bytes | None, flags: int) -> bool:
        """A plain PUT (KVSet): a lock holder stays the holder; LockIndex is not carried over,
        exactly as Consul's kvsSetTxn does."""
        existing = self.entries.get(key)
        session = existing.session if existing else ""
        return self._store(idx, KVEntry(key, value, flags, session), existing)

    def set_cas(self, idx: int, key: str, value: bytes | None, flags: int, cas: int) -> bool:
        """?cas=N: write only if ModifyIndex is N; ?cas=0: only if the key does not exist."""
        existing = self.entries.get(key)
        if (cas == 0 and existing is not None) or (cas != 0 and existing is None):
            return False
        if existing is not None and existing.modify_index != cas:
            return False
        self.set(idx, key, value, flags)
        return True

    def lock(self, idx: int, key: str, value: bytes | None, flags: int, session: str) -> bool:
        """?acquire (kvsLockTxn), the session already validated and the lock-delay checked."""
        existing = self.entries.get(key)
        if existing is None:
            lock_index = 1
        elif existing.session == session:
            lock_index = existing.lock_index  # already held: update, no new acquisition
        elif existing.session:
            return False  # someone else holds it
        else:
            lock_index = existing.lock_index + 1
        self._store(idx, KVEntry(key, value, flags, session, lock_index), existing)
        return True

    def unlock(self, idx: int, key: str, value: bytes | None, flags: int, session: str) -> bool:
        """?release (kvsUnlockTxn): only by the holder; LockIndex stays."""
        existing = self.entries.get(key)
        if existing is None or existing.session != session:
            return False
        self._store(idx, KVEntry(key, value, flags, "", existing.lock_index), existing)
        return True

    def release_session(self, idx: int, key: str) -> bool:
        """A session invalidated with behavior release: the key loses its holder only."""
        existing = self.entries.get(key)
        if existing is None:
            return False
        entry = KVEntry(key, existing.value, existing.flags, "", existing.lock_index)
        return self._store(idx, entry, existing)

    def delete(self, idx: int, key: str, now: float) -> bool:
        if self.entries.pop(key, None) is None:
            return False
        self.tombstones[key] = Tombstone(idx, now + TOMBSTONE_TTL_S)
        self.table_index = max(self.table_index, idx)
        self.written.append(key)
        return True

    def delete_cas(self, idx: int, key: str, cas: int, now: float) -> bool:
        """?cas on DELETE: a missing key counts as deleted; cas=0 never deletes."""
        existing = self.entries.get(key)
        if existing is None:
            return True
        if existing.modify_index != cas:
            return False
        return self.delete(idx, key, now)

    def delete_tree(self, idx: int, prefix: str, now: float) -> list[str]:
        """?recurse: one tombstone for the prefix (none for the whole store, whose index is the
        table's anyway), as Consul's kvsDeleteTreeTxn."""
        doomed = [k for k in self.entries if k.startswith(prefix)]
        if not doomed:
            return []
        for key in doomed:
            del self.entries[key]
        if prefix:
            self.tombstones[prefix] = Tombstone(idx, now + TOMBSTONE_TTL_S)
        self.table_index = max(self.table_index, idx)
        self.written.extend(sorted(doomed))
        return sorted(doomed)

    # --- lock-delay and tombstone expiry -----------------------------------------------------

    def start_lock_delay(self, key: str, delay_ns: int, now: float) -> None:
        if delay_ns > 0:
            self.lock_delays[key] = now + min(delay_ns, LOCK_DELAY_MAX_NS) / NS

    def in_lock_delay(self, key: str, now: float) -> bool:
        until = self.lock_delays.get(key)
        if until is None:
            return False
        if until <= now:
            del self.lock_delays[key]
            return False
        return True

    def reap(self, now: float) -> None:
        """Forget tombstones past their time and lock-delays that ended. The table index stays,
        so no index goes backwards (a prefix without tombstones answers the table's index)."""
        for key in [k for k, t in self.tombstones.items() if t.reap_at <= now]:
            del self.tombstones[key]
        for key in [k for k, until in self.lock_delays.items() if until <= now]:
            del self.lock_delays[key]

    def next_reap(self) -> float | None:
        return min((t.reap_at for t in self.tombstones.values()), default=None)
