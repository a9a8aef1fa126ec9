"""The in-memory Consul KV the agreement simulator runs on (tests/support/memory_consul.py)
keeps the semantics the agents rely on (../shared/reference/consul-api.md)."""

from __future__ import annotations

import pytest

from tests.support.memory_consul import MemoryConsul


def test_cas_creates_only_when_absent_and_writes_only_at_the_modify_index() -> None:
    kv = MemoryConsul()
    assert kv.put("view", b"1", cas=0)
    first = kv.get("view")
    assert first is not None
    assert not kv.put("view", b"x", cas=0)  # exists
    assert kv.put("view", b"2", cas=first.modify_index)
    assert not kv.put("view", b"3", cas=first.modify_index)  # lost the race
    second = kv.get("view")
    assert second is not None
    assert (second.value, second.create_index) == (b"2", first.create_index)
    assert second.modify_index > first.modify_index
    with pytest.raises(ValueError, match="mutually exclusive"):
        kv.put("view", b"4", cas=second.modify_index, acquire="s")


def test_a_held_key_is_written_only_by_its_session_and_unchanged_writes_keep_the_index() -> None:
    kv = MemoryConsul()
    a = kv.create_session("n1", 10_000, 0)
    b = kv.create_session("n2", 10_000, 0)
    assert kv.put("members/n1", ("addr", 1), acquire=a)
    assert not kv.put("members/n1", ("addr", 2), acquire=b)
    assert not kv.put("members/n1", ("addr", 2), acquire="unknown")
    index = kv.index
    assert kv.put("members/n1", ("addr", 1), acquire=a)
    assert kv.index == index


def test_a_lapsed_session_deletes_its_keys() -> None:
    kv = MemoryConsul()
    sid = kv.create_session("n1", 3000, 0)
    kv.put("members/n1", ("addr", 1), acquire=sid)
    before = kv.get("members/n1")
    assert before is not None
    kv.put("suspects/n1", (), acquire=sid)
    kv.put("view", b"v", cas=0)
    assert kv.renew(sid, 2000)
    assert kv.expire(4999) == []
    assert kv.expire(5000) == ["n1"]
    assert sorted(kv.kv) == ["view"]
    assert not kv.renew(sid, 5000)  # as Consul's 404
    again = kv.create_session("n1", 3000, 5000)
    assert kv.put("members/n1", ("addr", 1), acquire=again)
    entry = kv.get("members/n1")
    assert entry is not None
    # The same value, but a new key: agents count its settle afresh.
    assert entry.create_index > before.create_index
