"""KV: values, indexes and check-and-set as the agents use them (the view is changed only by
PUT ?cas=<ModifyIndex>)."""

from __future__ import annotations

import asyncio

import consul.aio
import pytest
from consul.exceptions import BadRequest

from tests.consul.conftest import Scratch


async def test_a_put_value_reads_back_with_its_indexes_and_flags(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("a")
    assert await consul_client.kv.put(key, b"\x00binary\xff", flags=7) is True
    index, entry = await consul_client.kv.get(key)
    assert entry["Value"] == b"\x00binary\xff"
    assert entry["Flags"] == 7
    assert entry["Key"] == key
    assert entry["CreateIndex"] == entry["ModifyIndex"]
    assert int(index) >= entry["ModifyIndex"]
    assert entry["LockIndex"] == 0
    assert "Session" not in entry


async def test_a_missing_key_is_none_with_an_index_of_at_least_1(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    index, entry = await consul_client.kv.get(scratch.key("missing"))
    assert entry is None
    assert int(index) >= 1  # py-consul raises "Missing index header" without the header


async def test_an_empty_value_reads_back_as_none(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    await consul_client.kv.put(scratch.key("empty"), b"")
    _, entry = await consul_client.kv.get(scratch.key("empty"))
    assert entry["Value"] is None


async def test_an_unchanged_put_keeps_the_modify_index(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("same")
    await consul_client.kv.put(key, b"v")
    _, first = await consul_client.kv.get(key)
    await consul_client.kv.put(key, b"v")
    _, second = await consul_client.kv.get(key)
    assert second["ModifyIndex"] == first["ModifyIndex"]
    await consul_client.kv.put(key, b"w")
    _, third = await consul_client.kv.get(key)
    assert third["ModifyIndex"] > first["ModifyIndex"]
    assert third["CreateIndex"] == first["CreateIndex"]


async def test_concurrent_cas_writers_with_one_index_exactly_one_wins(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("view")
    await consul_client.kv.put(key, b"epoch 1")
    _, entry = await consul_client.kv.get(key)
    proposals = [f"epoch 2 by agent {n}".encode() for n in range(8)]
    results = await asyncio.gather(
        *(consul_client.kv.put(key, p, cas=entry["ModifyIndex"]) for p in proposals)
    )
    assert sorted(results) == [False] * 7 + [True]
    _, after = await consul_client.kv.get(key)
    assert after["Value"] == proposals[results.index(True)]
    assert after["ModifyIndex"] > entry["ModifyIndex"]


async def test_cas_zero_creates_only_once(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("create-once")
    results = await asyncio.gather(*(consul_client.kv.put(key, b"x", cas=0) for _ in range(4)))
    assert sorted(results) == [False, False, False, True]
    assert await consul_client.kv.put(scratch.key("absent"), b"x", cas=12345) is False


async def test_a_cas_delete_needs_the_modify_index(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("k")
    await consul_client.kv.put(key, b"x")
    _, entry = await consul_client.kv.get(key)
    assert await consul_client.kv.delete(key, cas=entry["ModifyIndex"] + 1000) is False
    assert (await consul_client.kv.get(key))[1] is not None
    assert await consul_client.kv.delete(key, cas=entry["ModifyIndex"]) is True
    assert (await consul_client.kv.get(key))[1] is None


async def test_a_recurse_index_never_goes_backwards_after_a_delete(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    await consul_client.kv.put(scratch.key("p/a"), b"1")
    await consul_client.kv.put(scratch.key("p/b"), b"2")
    before, entries = await consul_client.kv.get(scratch.key("p/"), recurse=True)
    assert [e["Key"] for e in entries] == [scratch.key("p/a"), scratch.key("p/b")]
    await consul_client.kv.delete(scratch.key("p/b"))
    after, entries = await consul_client.kv.get(scratch.key("p/"), recurse=True)
    assert [e["Key"] for e in entries] == [scratch.key("p/a")]
    assert int(after) > int(before)
    await consul_client.kv.delete(scratch.key("p/"), recurse=True)
    gone, entries = await consul_client.kv.get(scratch.key("p/"), recurse=True)
    assert entries is None
    assert int(gone) > int(after)


async def test_keys_with_a_separator_list_one_level(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    for name in ("members/n1", "members/n2", "suspects/n1/n2", "view"):
        await consul_client.kv.put(scratch.key(name), b"")
    _, keys = await consul_client.kv.get(scratch.prefix, keys=True, separator="/")
    assert keys == [scratch.key("members/"), scratch.key("suspects/"), scratch.key("view")]


async def test_cas_with_acquire_is_a_bad_request(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    session_id = await scratch.session(lock_delay=0)
    with pytest.raises(BadRequest, match="Conflicting flags"):
        await consul_client.kv.put(scratch.key("k"), b"x", cas=0, acquire=session_id)
