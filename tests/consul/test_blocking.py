"""Blocking queries: a watcher wakes when what it watches changes, not for anything else, and
a wait that runs out answers the current result."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import consul.aio

from tests.consul.conftest import Scratch

T = TypeVar("T")
WAKE_BOUND_S = 2.0  # a watcher answers this soon after its change, on a loaded machine too


async def timed(call: Awaitable[T]) -> tuple[float, T]:
    start = time.monotonic()
    result = await call
    return time.monotonic() - start, result


async def test_a_key_watcher_wakes_when_its_key_changes(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("view")
    await consul_client.kv.put(key, b"epoch 1")
    index, _ = await consul_client.kv.get(key)
    watcher = asyncio.create_task(timed(consul_client.kv.get(key, index=index, wait="30s")))
    await asyncio.sleep(0.3)
    assert not watcher.done()
    changed_at = time.monotonic()
    await consul_client.kv.put(key, b"epoch 2")
    elapsed, (new_index, entry) = await asyncio.wait_for(watcher, 30)
    assert time.monotonic() - changed_at < WAKE_BOUND_S
    assert elapsed >= 0.3
    assert entry["Value"] == b"epoch 2"
    assert int(new_index) > int(index)


async def test_a_key_watcher_sleeps_through_another_keys_change_and_times_out_with_the_current(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("view")
    await consul_client.kv.put(key, b"epoch 1")
    index, _ = await consul_client.kv.get(key)
    watcher = asyncio.create_task(timed(consul_client.kv.get(key, index=index, wait="2s")))
    await asyncio.sleep(0.3)
    await consul_client.kv.put(scratch.key("other"), b"unrelated")
    elapsed, (_, entry) = await asyncio.wait_for(watcher, 30)
    assert elapsed >= 1.9  # woke at the end of its wait, not at the other key's change
    assert elapsed < 2.0 + 2.0 / 16 + WAKE_BOUND_S  # wait, its jitter, and slack
    assert entry["Value"] == b"epoch 1"


async def test_a_prefix_watcher_wakes_when_a_key_under_it_is_deleted(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    await consul_client.kv.put(scratch.key("members/n1"), b"")
    await consul_client.kv.put(scratch.key("members/n2"), b"")
    index, _ = await consul_client.kv.get(scratch.key("members/"), recurse=True)
    watcher = asyncio.create_task(
        timed(consul_client.kv.get(scratch.key("members/"), recurse=True, index=index, wait="30s"))
    )
    await asyncio.sleep(0.3)
    await consul_client.kv.delete(scratch.key("members/n2"))
    elapsed, (new_index, entries) = await asyncio.wait_for(watcher, 30)
    assert elapsed < 0.3 + WAKE_BOUND_S
    assert [e["Key"] for e in entries] == [scratch.key("members/n1")]
    assert int(new_index) > int(index)


async def test_a_watcher_of_a_missing_key_wakes_when_it_is_created(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("not-yet")
    index, entry = await consul_client.kv.get(key)
    assert entry is None
    watcher = asyncio.create_task(timed(consul_client.kv.get(key, index=index, wait="30s")))
    await asyncio.sleep(0.3)
    await consul_client.kv.put(key, b"here")
    elapsed, (_, entry) = await asyncio.wait_for(watcher, 30)
    assert elapsed < 0.3 + WAKE_BOUND_S
    assert entry["Value"] == b"here"


async def test_a_session_info_watcher_wakes_when_the_session_goes(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    session_id = await scratch.session(lock_delay=0)
    index, info = await consul_client.session.info(session_id)
    assert info["ID"] == session_id
    watcher = asyncio.create_task(
        timed(consul_client.session.info(session_id, index=index, wait="30s"))
    )
    await asyncio.sleep(0.3)
    await consul_client.session.destroy(session_id)
    elapsed, (_, info) = await asyncio.wait_for(watcher, 30)
    assert elapsed < 0.3 + WAKE_BOUND_S
    assert info is None


async def test_a_health_watcher_wakes_when_the_check_passes(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    service, check_id = await scratch.ttl_service("web")
    index, nodes = await consul_client.health.service(service, passing=True)
    assert nodes == []
    watcher = asyncio.create_task(
        timed(consul_client.health.service(service, passing=True, index=index, wait="30s"))
    )
    await asyncio.sleep(0.3)
    await consul_client.agent.check.ttl_pass(check_id)
    elapsed, (_, nodes) = await asyncio.wait_for(watcher, 30)
    assert elapsed < 0.3 + WAKE_BOUND_S
    assert [n["Service"]["ID"] for n in nodes] == [service]
