"""Sessions and locks: acquire/release, lock-delay, invalidation by destroy and by TTL expiry
with behavior release or delete."""

from __future__ import annotations

import asyncio
import time

import consul.aio
import pytest
from consul.exceptions import ConsulException, NotFound

from tests.consul.conftest import Scratch

UNKNOWN_SESSION = "00000000-0000-4000-8000-0000000dead0"


async def test_a_session_is_listed_renewed_and_destroyed(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    session_id = await scratch.session(ttl=60, behavior="delete", lock_delay=0)
    _, info = await consul_client.session.info(session_id)
    assert (info["ID"], info["Behavior"], info["TTL"], info["LockDelay"]) == (
        session_id,
        "delete",
        "60s",
        0,
    )
    _, listed = await consul_client.session.list()
    assert session_id in [s["ID"] for s in listed]
    _, on_node = await consul_client.session.node(info["Node"])
    assert session_id in [s["ID"] for s in on_node]
    renewed = await consul_client.session.renew(session_id)
    assert renewed["ID"] == session_id
    assert await consul_client.session.destroy(session_id) is True
    assert (await consul_client.session.info(session_id))[1] is None
    assert await consul_client.session.destroy(session_id) is True  # idempotent


async def test_renewing_an_unknown_session_is_not_found(consul_client: consul.aio.Consul) -> None:
    with pytest.raises(NotFound, match=f"Session id '{UNKNOWN_SESSION}' not found"):
        await consul_client.session.renew(UNKNOWN_SESSION)


async def test_a_session_defaults_to_the_agent_node_serf_health_and_15s_lock_delay(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    session_id = await scratch.session()
    _, info = await consul_client.session.info(session_id)
    self_info = await consul_client.agent.self()
    assert info["Node"] == self_info["Config"]["NodeName"]
    assert info["NodeChecks"] == ["serfHealth"]
    assert (info["LockDelay"], info["Behavior"], info["TTL"]) == (15_000_000_000, "release", "")


async def test_acquire_and_release_follow_the_lock_index(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("leader")
    first = await scratch.session(lock_delay=0)
    second = await scratch.session(lock_delay=0)
    assert await consul_client.kv.put(key, b"first", acquire=first) is True
    _, held = await consul_client.kv.get(key)
    assert (held["Session"], held["LockIndex"]) == (first, 1)
    assert await consul_client.kv.put(key, b"second", acquire=second) is False
    assert await consul_client.kv.put(key, b"first again", acquire=first) is True
    _, again = await consul_client.kv.get(key)
    assert (again["LockIndex"], again["Value"]) == (1, b"first again")
    assert await consul_client.kv.put(key, b"x", release=second) is False
    assert await consul_client.kv.put(key, b"released", release=first) is True
    _, released = await consul_client.kv.get(key)
    assert "Session" not in released
    assert released["LockIndex"] == 1
    assert released["ModifyIndex"] > again["ModifyIndex"]
    assert await consul_client.kv.put(key, b"second", acquire=second) is True
    assert (await consul_client.kv.get(key))[1]["LockIndex"] == 2


async def test_acquire_with_an_unknown_session_is_a_server_error(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    with pytest.raises(ConsulException, match=f'invalid session \\\\?"{UNKNOWN_SESSION}'):
        await consul_client.kv.put(scratch.key("k"), b"x", acquire=UNKNOWN_SESSION)


async def test_lock_delay_refuses_acquire_after_invalidation_until_it_ends(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    key = scratch.key("leader")
    holder = await scratch.session(lock_delay=2)  # seconds: room for a loaded machine
    await consul_client.kv.put(key, b"old leader", acquire=holder)
    await consul_client.session.destroy(holder)
    destroyed_at = time.monotonic()
    _, freed = await consul_client.kv.get(key)
    assert "Session" not in freed
    assert freed["Value"] == b"old leader"  # behavior release keeps the key
    successor = await scratch.session(lock_delay=0)
    assert await consul_client.kv.put(key, b"new leader", acquire=successor) is False
    assert time.monotonic() - destroyed_at < 2, "too slow to see the lock-delay at work"
    await asyncio.sleep(max(0.0, destroyed_at + 2.2 - time.monotonic()))
    assert await consul_client.kv.put(key, b"new leader", acquire=successor) is True


async def test_behavior_delete_deletes_held_keys_on_destroy(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    session_id = await scratch.session(behavior="delete", lock_delay=0)
    await consul_client.kv.put(scratch.key("members/n1"), b"n1", acquire=session_id)
    await consul_client.kv.put(scratch.key("members/n2"), b"n2")
    await consul_client.session.destroy(session_id)
    _, entries = await consul_client.kv.get(scratch.key("members/"), recurse=True)
    assert [e["Key"] for e in entries] == [scratch.key("members/n2")]


@pytest.mark.fault  # Consul's minimum TTL is 10 s: about 20 s (the core's tests cover 2 x TTL)
async def test_sessions_expire_within_twice_their_ttl_and_not_before_it(
    consul_client: consul.aio.Consul, scratch: Scratch
) -> None:
    releasing = await scratch.session(ttl=10, behavior="release", lock_delay=0)
    deleting = await scratch.session(ttl=10, behavior="delete", lock_delay=0)
    created = time.monotonic()
    await consul_client.kv.put(scratch.key("held/released"), b"r", acquire=releasing)
    await consul_client.kv.put(scratch.key("held/deleted"), b"d", acquire=deleting)
    await asyncio.sleep(max(0.0, created + 9.0 - time.monotonic()))
    assert (await consul_client.session.info(releasing))[1] is not None  # not before the TTL
    deadline = created + 2 * 10 + 5  # 2 x TTL, and slack for a loaded machine
    while time.monotonic() < deadline:
        gone = [(await consul_client.session.info(s))[1] is None for s in (releasing, deleting)]
        if all(gone):
            break
        await asyncio.sleep(0.25)
    else:
        pytest.fail("the sessions were not invalidated within 2 x TTL")
    _, entries = await consul_client.kv.get(scratch.key("held/"), recurse=True)
    assert [(e["Key"], e.get("Session"), e["Value"]) for e in entries] == [
        (scratch.key("held/released"), None, b"r")
    ]
