"""ConsulState, the core of `hexmq consul-dev`, with a fake clock: each test one Consul rule."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from services.membership.consul_dev.decode import service_definition, session_spec
from services.membership.consul_dev.model import (
    CRITICAL,
    NS,
    PASSING,
    WARNING,
    CheckCritical,
    ConsulError,
    DurationError,
    KVChanged,
    ServiceChanged,
    ServiceReaped,
    SessionChanged,
    SessionInvalidated,
    Watch,
    format_go_duration,
    parse_go_duration,
)
from services.membership.consul_dev.state import ConsulState

NODE = "node1"


def new_state() -> ConsulState:
    ids = (f"00000000-0000-0000-0000-{n:012d}" for n in itertools.count(1))
    return ConsulState(
        NODE, node_id="11111111-2222-3333-4444-555555555555", new_id=lambda: next(ids)
    )


def session(state: ConsulState, now: float = 0.0, **body: Any) -> str:
    return state.session_create(session_spec(json.dumps(body).encode()), now)


def register(state: ConsulState, now: float = 0.0, **body: Any) -> None:
    state.service_register(service_definition(json.dumps(body).encode()), now)


def put(
    state: ConsulState, key: str, value: bytes | None = b"v", now: float = 0.0, **kw: Any
) -> bool:
    return state.kv_put(key, value, now=now, **kw)


def entry(state: ConsulState, key: str) -> Any:
    return state.kv_get(key)[1]


def error_of(call: Any) -> ConsulError:
    with pytest.raises(ConsulError) as info:
        call()
    return info.value


# --- indexes ------------------------------------------------------------------------------------


def test_a_missing_key_reads_none_with_the_kv_table_index() -> None:
    state = new_state()
    put(state, "other")
    assert state.kv_get("missing") == (entry(state, "other").modify_index, None)


def test_no_user_write_ever_gets_index_1() -> None:
    state = new_state()
    assert state.kv_get("k")[0] == 0  # answered as 1, the floor
    put(state, "k")
    assert entry(state, "k").modify_index >= 2


def test_a_new_key_has_create_index_equal_to_modify_index() -> None:
    state = new_state()
    put(state, "k")
    e = entry(state, "k")
    assert e.create_index == e.modify_index == state.last_index


def test_an_unchanged_plain_put_does_not_bump_the_modify_index() -> None:
    state = new_state()
    put(state, "k", b"same")
    before = entry(state, "k").modify_index
    assert put(state, "k", b"same") is True
    assert entry(state, "k").modify_index == before
    assert state.last_index == before
    assert state.take_effects().changes == [KVChanged("k")]  # the first write only


def test_a_changed_put_bumps_modify_index_and_keeps_create_index() -> None:
    state = new_state()
    put(state, "k", b"1")
    first = entry(state, "k")
    put(state, "k", b"2")
    second = entry(state, "k")
    assert second.create_index == first.create_index
    assert second.modify_index > first.modify_index


def test_a_plain_put_without_flags_resets_flags_to_zero() -> None:
    state = new_state()
    put(state, "k", flags=42)
    assert entry(state, "k").flags == 42
    put(state, "k")
    assert entry(state, "k").flags == 0


def test_an_empty_body_is_stored_as_no_value() -> None:
    state = new_state()
    put(state, "k", None)
    assert entry(state, "k").value is None
    assert entry(state, "k").api()["Value"] is None


def test_the_single_key_index_is_the_kv_table_index() -> None:
    state = new_state()
    put(state, "a")
    put(state, "b")
    assert state.kv_get("a")[0] == entry(state, "b").modify_index


def test_a_recurse_index_is_the_highest_modify_index_under_the_prefix() -> None:
    state = new_state()
    put(state, "p/a")
    put(state, "p/b")
    put(state, "q/c")
    index, entries = state.kv_list("p/")
    assert [e.key for e in entries] == ["p/a", "p/b"]
    assert index == entry(state, "p/b").modify_index < state.last_index


def test_a_recurse_index_never_goes_backwards_after_a_delete() -> None:
    state = new_state()
    put(state, "p/a")
    put(state, "p/b")
    before, _ = state.kv_list("p/")
    state.kv_delete("p/b", now=0)
    after, entries = state.kv_list("p/")
    assert [e.key for e in entries] == ["p/a"]
    assert after > before  # the tombstone of p/b counts


def test_a_recurse_over_everything_answers_the_table_index() -> None:
    state = new_state()
    put(state, "a")
    state.kv_delete("a", now=0)
    index, entries = state.kv_list("")
    assert entries == []
    assert index == state.kv.table_index == state.last_index


def test_a_delete_tree_leaves_the_prefix_index_up() -> None:
    state = new_state()
    put(state, "p/a")
    put(state, "p/b/c")
    before, _ = state.kv_list("p/")
    state.kv_delete("p/", now=0, recurse=True)
    after, entries = state.kv_list("p/")
    assert entries == []
    assert after > before
    assert state.take_effects().changes[-2:] == [KVChanged("p/a"), KVChanged("p/b/c")]


def test_reaped_tombstones_leave_no_index_going_backwards() -> None:
    state = new_state()
    put(state, "p/a")
    put(state, "unrelated")
    state.kv_delete("p/a", now=0)
    with_tombstone, _ = state.kv_list("p/")
    state.tick(900.0)  # tombstone_ttl
    assert state.kv.tombstones == {}
    assert state.kv_list("p/")[0] >= with_tombstone


def test_keys_with_a_separator_fold_what_is_below_it() -> None:
    state = new_state()
    for key in ("p/a", "p/b/x", "p/b/y", "p/c/z", "q"):
        put(state, key)
    assert state.kv_keys("p/", "/")[1] == ["p/a", "p/b/", "p/c/"]
    assert state.kv_keys("p/", "")[1] == ["p/a", "p/b/x", "p/b/y", "p/c/z"]
    assert state.kv_keys("", "/")[1] == ["p/", "q"]


# --- check-and-set -----------------------------------------------------------------------------


def test_cas_zero_creates_only_if_the_key_is_absent() -> None:
    state = new_state()
    assert put(state, "k", b"1", cas=0) is True
    assert put(state, "k", b"2", cas=0) is False
    assert entry(state, "k").value == b"1"


def test_two_cas_writers_with_the_same_index_exactly_one_wins() -> None:
    state = new_state()
    put(state, "view", b"epoch 1")
    index = entry(state, "view").modify_index
    results = [put(state, "view", f"proposal {n}".encode(), cas=index) for n in range(5)]
    assert results == [True, False, False, False, False]
    assert entry(state, "view").value == b"proposal 0"


def test_cas_with_a_nonzero_index_on_a_missing_key_fails() -> None:
    state = new_state()
    assert put(state, "k", cas=5) is False
    assert entry(state, "k") is None


def test_a_cas_delete_needs_the_modify_index() -> None:
    state = new_state()
    put(state, "k")
    index = entry(state, "k").modify_index
    assert state.kv_delete("k", now=0, cas=index + 1) is False
    assert state.kv_delete("k", now=0, cas=0) is False  # 0 never deletes
    assert entry(state, "k") is not None
    assert state.kv_delete("k", now=0, cas=index) is True
    assert entry(state, "k") is None


def test_a_cas_delete_of_a_missing_key_is_true() -> None:
    assert new_state().kv_delete("k", now=0, cas=7) is True


def test_cas_acquire_and_release_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="exclude"):
        put(new_state(), "k", cas=1, release="x")


# --- locks -------------------------------------------------------------------------------------


def test_acquire_with_an_unknown_session_is_a_500_naming_it() -> None:
    sid = "00000000-0000-0000-0000-00000000dead"
    err = error_of(lambda: put(new_state(), "k", acquire=sid))
    assert (err.status, err.text) == (500, f'invalid session "{sid}"')


def test_acquire_with_a_malformed_session_id_is_a_lookup_error() -> None:
    err = error_of(lambda: put(new_state(), "k", acquire="nope"))
    assert (err.status, err.text) == (500, "failed session lookup: UUID must be 36 characters")


def test_acquire_with_an_empty_session_is_missing_session() -> None:
    err = error_of(lambda: put(new_state(), "k", acquire=""))
    assert (err.status, err.text) == (500, "missing session")


def test_acquiring_a_new_key_sets_session_and_lock_index_1() -> None:
    state = new_state()
    sid = session(state)
    assert put(state, "k", acquire=sid) is True
    assert (entry(state, "k").session, entry(state, "k").lock_index) == (sid, 1)


def test_the_holder_acquiring_again_updates_without_a_new_lock_index() -> None:
    state = new_state()
    sid = session(state)
    put(state, "k", b"1", acquire=sid)
    assert put(state, "k", b"2", acquire=sid) is True
    assert (entry(state, "k").value, entry(state, "k").lock_index) == (b"2", 1)


def test_a_key_held_by_another_session_cannot_be_acquired() -> None:
    state = new_state()
    first, second = session(state), session(state)
    put(state, "k", acquire=first)
    assert put(state, "k", acquire=second) is False
    assert entry(state, "k").session == first


def test_release_by_the_holder_keeps_lock_index_and_bumps_modify_index() -> None:
    state = new_state()
    sid = session(state)
    put(state, "k", acquire=sid)
    held = entry(state, "k")
    assert put(state, "k", release=sid) is True
    released = entry(state, "k")
    assert (released.session, released.lock_index) == ("", 1)
    assert released.modify_index > held.modify_index


def test_release_by_another_session_is_refused() -> None:
    state = new_state()
    first, second = session(state), session(state)
    put(state, "k", acquire=first)
    assert put(state, "k", release=second) is False
    assert put(state, "missing", release=second) is False
    assert entry(state, "k").session == first


def test_acquire_after_a_release_counts_a_new_lock_index() -> None:
    state = new_state()
    first, second = session(state), session(state)
    put(state, "k", acquire=first)
    put(state, "k", release=first)
    assert put(state, "k", acquire=second) is True
    assert entry(state, "k").lock_index == 2


def test_a_plain_put_keeps_the_lock_holder() -> None:
    state = new_state()
    sid = session(state)
    put(state, "k", b"1", acquire=sid)
    put(state, "k", b"2")
    assert (entry(state, "k").value, entry(state, "k").session) == (b"2", sid)


# --- session expiry and invalidation -----------------------------------------------------------


def test_a_session_lives_until_twice_its_ttl_and_not_one_tick_less() -> None:
    state = new_state()
    sid = session(state, now=100.0, ttl="10s")
    state.tick(110.0)  # TTL passed: Consul promises only that TTL is a lower bound
    state.tick(119.999)
    assert sid in state.sessions
    state.tick(120.0)
    assert sid not in state.sessions
    notice = state.take_effects().notices[-1]
    assert isinstance(notice, SessionInvalidated)
    assert "TTL expired" in notice.reason


def test_the_next_deadline_is_the_session_expiry() -> None:
    state = new_state()
    assert state.next_deadline() is None
    session(state, now=5.0, ttl="15s")
    assert state.next_deadline() == 35.0


def test_renew_restarts_the_expiry_from_now() -> None:
    state = new_state()
    sid = session(state, now=0.0, ttl="10s")
    state.tick(15.0)
    assert state.session_renew(sid, 15.0) is not None
    state.tick(34.9)
    assert sid in state.sessions
    state.tick(35.0)
    assert sid not in state.sessions


def test_renew_of_an_unknown_session_answers_none() -> None:
    assert new_state().session_renew("00000000-0000-0000-0000-00000000dead", 0.0) is None


def test_destroy_is_idempotent() -> None:
    state = new_state()
    sid = session(state)
    state.session_destroy(sid, 0.0)
    state.session_destroy(sid, 0.0)
    assert state.session_info(sid)[1] is None


def test_invalidation_with_behavior_release_frees_keys_and_keeps_lock_index() -> None:
    state = new_state()
    sid = session(state, ttl="10s", lockdelay="0s")
    put(state, "k", b"mine", acquire=sid)
    held = entry(state, "k")
    state.tick(20.0)
    freed = entry(state, "k")
    assert (freed.value, freed.session, freed.lock_index) == (b"mine", "", 1)
    assert freed.modify_index > held.modify_index


def test_invalidation_with_behavior_delete_deletes_held_keys_only() -> None:
    state = new_state()
    sid = session(state, ttl="10s", behavior="delete")
    put(state, "members/n1", acquire=sid)
    put(state, "members/n2")
    before, _ = state.kv_list("members/")
    state.tick(20.0)
    index, entries = state.kv_list("members/")
    assert [e.key for e in entries] == ["members/n2"]
    assert index > before  # the tombstone keeps the prefix index moving forward
    notice = state.take_effects().notices[-1]
    assert isinstance(notice, SessionInvalidated)
    assert notice.deleted == ("members/n1",)


def test_lock_delay_refuses_acquire_until_it_ends() -> None:
    state = new_state()
    first = session(state, lockdelay="5s")
    put(state, "k", acquire=first)
    state.session_destroy(first, 10.0)
    second = session(state, now=10.0)
    assert put(state, "k", acquire=second, now=14.9) is False
    assert put(state, "k", acquire=second, now=15.0) is True


def test_lock_delay_is_checked_before_the_session() -> None:
    state = new_state()
    first = session(state, lockdelay="5s")
    put(state, "k", acquire=first)
    state.session_destroy(first, 0.0)
    assert put(state, "k", acquire="00000000-0000-0000-0000-00000000dead", now=1.0) is False


def test_a_zero_lock_delay_frees_the_key_at_once() -> None:
    state = new_state()
    first = session(state, lockdelay="0s")
    put(state, "k", acquire=first)
    state.session_destroy(first, 0.0)
    assert put(state, "k", acquire=session(state), now=0.0) is True


def test_lock_delay_is_cut_to_60_seconds() -> None:
    state = new_state()
    first = session(state, lockdelay="10m")
    put(state, "k", acquire=first)
    state.session_destroy(first, 0.0)
    second = session(state)
    assert put(state, "k", acquire=second, now=59.0) is False
    assert put(state, "k", acquire=second, now=60.0) is True


def test_an_explicit_release_starts_no_lock_delay() -> None:
    state = new_state()
    first = session(state, lockdelay="30s")
    put(state, "k", acquire=first)
    put(state, "k", release=first)
    assert put(state, "k", acquire=session(state), now=1.0) is True


def test_the_default_lock_delay_is_15_seconds() -> None:
    state = new_state()
    first = session(state)
    assert state.sessions[first].lock_delay_ns == 15 * NS
    put(state, "k", acquire=first)
    state.session_destroy(first, 0.0)
    second = session(state)
    assert put(state, "k", acquire=second, now=14.0) is False
    assert put(state, "k", acquire=second, now=15.0) is True


# --- session creation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ttl", "text"),
    [
        ("9s", "Invalid Session TTL '9000000000', must be between [10s=24h0m0s]"),
        ("86401s", "Invalid Session TTL '86401000000000', must be between [10s=24h0m0s]"),
        ("ten", "Session TTL 'ten' invalid: time: invalid duration \"ten\""),
    ],
)
def test_a_session_ttl_outside_10s_to_24h_is_refused(ttl: str, text: str) -> None:
    err = error_of(lambda: session(new_state(), ttl=ttl))
    assert (err.status, err.text) == (500, text)


def test_a_zero_ttl_means_no_expiry() -> None:
    state = new_state()
    sid = session(state, ttl="0s")
    state.tick(10.0**6)
    assert sid in state.sessions


def test_an_unknown_behavior_is_refused() -> None:
    err = error_of(lambda: session(new_state(), behavior="drop"))
    assert (err.status, err.text) == (500, "Invalid Behavior setting 'drop'")


def test_a_session_on_another_node_is_missing_node_registration() -> None:
    err = error_of(lambda: session(new_state(), node="elsewhere"))
    assert (err.status, err.text) == (500, "Missing node registration")


def test_a_session_check_must_be_registered() -> None:
    err = error_of(lambda: session(new_state(), checks=["service:nope"]))
    assert (err.status, err.text) == (500, "Missing check 'service:nope' registration")


def test_a_session_check_must_not_be_critical() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s"})  # critical until its first pass
    err = error_of(lambda: session(state, checks=["service:web"]))
    assert (err.status, err.text) == (500, "Check 'service:web' is in critical state")


def test_a_checks_list_adds_to_serf_health_and_an_empty_one_removes_every_check() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s", "status": "passing"})
    with_service = state.sessions[session(state, checks=["service:web"])]
    assert with_service.check_ids() == ["service:web", "serfHealth"]
    assert with_service.api()["Checks"] == ["service:web"]
    assert with_service.api()["NodeChecks"] == ["serfHealth"]
    assert state.sessions[session(state, checks=[])].check_ids() == []
    default = state.sessions[session(state)].api()
    assert "Checks" not in default
    assert (default["NodeChecks"], default["ServiceChecks"]) == (["serfHealth"], None)


@pytest.mark.parametrize(
    ("lock_delay", "seconds"),
    [(15, 15), ("15s", 15), (15_000_000_000, 15), ("0", 0), ("500ms", 0.5), ("15ns", 15)],
)
def test_lock_delay_numbers_below_1000_mean_seconds(lock_delay: object, seconds: float) -> None:
    assert session_spec(json.dumps({"LockDelay": lock_delay}).encode()).lock_delay_ns == (
        seconds * NS
    )


def test_session_fields_are_read_without_regard_to_case() -> None:
    spec = session_spec(b'{"name": "a", "TTL": "10s", "BEHAVIOR": "delete", "lockdelay": "1s"}')
    assert (spec.name, spec.ttl, spec.behavior, spec.lock_delay_ns) == ("a", "10s", "delete", NS)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"[]", "must be a JSON object"),
        (b"{", "not valid JSON"),
        (b'{"TTL": 10}', "TTL must be a string"),
        (b'{"LockDelay": "15"}', 'missing unit in duration "15"'),
        (b'{"Tll": "10s"}', 'unknown field "Tll"'),
    ],
)
def test_a_malformed_session_body_is_a_400_naming_the_field(body: bytes, needle: str) -> None:
    err = error_of(lambda: session_spec(body))
    assert err.status == 400
    assert needle in err.text


# --- agent services and TTL checks -------------------------------------------------------------


def test_a_ttl_check_is_critical_until_its_first_pass_unless_a_status_is_given() -> None:
    state = new_state()
    register(state, name="a", check={"ttl": "10s"})
    register(state, name="b", check={"TTL": "10s", "Status": "passing"})
    assert state.catalog.checks["service:a"].status == CRITICAL
    assert state.catalog.checks["service:b"].status == PASSING


def test_checks_of_a_checks_list_are_numbered() -> None:
    state = new_state()
    register(state, name="web", id="web-1", checks=[{"ttl": "5s"}, {"ttl": "9s"}])
    assert state.catalog.services["web-1"].check_ids == ["service:web-1:1", "service:web-1:2"]


def test_a_ttl_check_not_updated_within_its_ttl_goes_critical() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "5s"})
    state.check_update("service:web", PASSING, "fine", 1.0)
    state.tick(5.9)
    assert state.catalog.checks["service:web"].status == PASSING
    state.tick(6.0)
    check = state.catalog.checks["service:web"]
    assert check.status == CRITICAL
    assert check.output == "TTL expired (last output before timeout follows): fine"
    assert CheckCritical("service:web", "web", check.output) in state.take_effects().notices


def test_each_update_restarts_the_check_ttl() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "5s"})
    for now in (1.0, 5.0, 9.0):
        state.check_update("service:web", PASSING, "", now)
        state.tick(now + 4.9)
    assert state.catalog.checks["service:web"].status == PASSING


def test_a_check_going_critical_invalidates_the_sessions_that_name_it() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s", "status": "passing"})
    bound = session(state, checks=["service:web"], lockdelay="0s")
    free = session(state)
    put(state, "leader", acquire=bound)
    state.check_update("service:web", CRITICAL, "down", 1.0)
    assert bound not in state.sessions
    assert free in state.sessions
    assert entry(state, "leader").session == ""


def test_a_warning_check_does_not_invalidate_sessions() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s", "status": "passing"})
    sid = session(state, checks=["service:web"])
    state.check_update("service:web", WARNING, "slow", 1.0)
    assert sid in state.sessions


def test_deregistering_a_service_invalidates_sessions_on_its_checks() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s", "status": "passing"})
    sid = session(state, checks=["service:web"])
    state.service_deregister("web", 1.0)
    assert sid not in state.sessions
    assert "service:web" not in state.catalog.checks


def test_re_registering_keeps_the_check_status_and_identical_is_no_change() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s"})
    state.check_update("service:web", PASSING, "ok", 1.0)
    index = state.last_index
    register(state, now=2.0, name="web", check={"ttl": "10s"})
    assert state.catalog.checks["service:web"].status == PASSING
    assert state.last_index == index


def test_re_registering_without_a_check_invalidates_its_sessions() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s", "status": "passing"})
    sid = session(state, checks=["service:web"])
    register(state, name="web")
    assert sid not in state.sessions


def test_deregister_critical_service_after_reaps_the_service_at_no_less_than_1_minute() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "1s", "DeregisterCriticalServiceAfter": "10s"})
    state.tick(59.9)
    assert "web" in state.catalog.services
    state.tick(60.0)
    assert "web" not in state.catalog.services
    assert ServiceReaped("web", "service:web", 60.0) in state.take_effects().notices


def test_an_update_of_an_unknown_check_is_a_500() -> None:
    err = error_of(lambda: new_state().check_update("nope", PASSING, "", 0.0))
    assert (err.status, err.text) == (500, 'CheckID "nope" does not have associated TTL')


def test_deregistering_an_unknown_service_is_a_404() -> None:
    err = error_of(lambda: new_state().service_deregister("nope", 0.0))
    assert err.status == 404
    assert err.text.startswith('Unknown service ID "nope"')


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"name": "a", "check": {"http": "http://x", "interval": "1s"}}', "TTL checks only"),
        (b'{"name": "a", "check": {"ttl": "0s"}}', "TTL must be > 0"),
        (b'{"name": "a", "check": {"ttl": "1s", "status": "ok"}}', "Status for checks must"),
        (b'{"id": "a"}', "Missing service name"),
        (b'{"name": "a", "connect": {}}', "does not take connect"),
    ],
)
def test_a_registration_it_cannot_serve_is_a_400(body: bytes, needle: str) -> None:
    err = error_of(lambda: service_definition(body))
    assert err.status == 400
    assert needle in err.text


# --- health ------------------------------------------------------------------------------------


def test_health_passing_follows_the_ttl_check() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s"})
    assert len(state.health_service("web", [], False)[1]) == 1
    assert state.health_service("web", [], True)[1] == []
    state.check_update("service:web", PASSING, "", 1.0)
    assert len(state.health_service("web", [], True)[1]) == 1
    state.check_update("service:web", WARNING, "", 2.0)
    assert state.health_service("web", [], True)[1] == []


def test_health_filters_tags_without_regard_to_case() -> None:
    state = new_state()
    register(state, name="web", id="w1", tags=["Primary"])
    register(state, name="web", id="w2", tags=["replica"])
    entries = state.health_service("web", ["primary"], False)[1]
    assert [e["Service"]["ID"] for e in entries] == ["w1"]


def test_a_service_index_moves_only_with_that_service() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s"})
    web_index = state.health_service("web", [], False)[0]
    register(state, name="db", check={"ttl": "10s"})
    state.check_update("service:db", PASSING, "", 1.0)
    assert state.health_service("web", [], False)[0] == web_index
    state.check_update("service:web", PASSING, "", 1.0)
    assert state.health_service("web", [], False)[0] > web_index


def test_an_output_only_update_takes_no_index() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s", "status": "passing"})
    index = state.last_index
    state.check_update("service:web", PASSING, "new output", 1.0)
    assert state.last_index == index
    assert state.catalog.checks["service:web"].output == "new output"


def test_a_vanished_service_answers_the_extinction_index() -> None:
    state = new_state()
    register(state, name="web")
    state.service_deregister("web", 0.0)
    gone = state.last_index
    register(state, name="db")
    assert state.health_service("web", [], False) == (gone, [])


# --- effects and watches -----------------------------------------------------------------------


def test_effects_name_every_key_session_and_service_that_changed() -> None:
    state = new_state()
    register(state, name="web")
    sid = session(state)
    put(state, "k", acquire=sid)
    assert state.take_effects().changes == [
        ServiceChanged("web"),
        SessionChanged(sid, NODE),
        KVChanged("k"),
    ]
    assert state.take_effects().changes == []


def test_a_key_watch_wakes_for_its_key_only_and_a_prefix_watch_for_deletes_below_it() -> None:
    assert Watch("kv-key", "a").matches(KVChanged("a"))
    assert not Watch("kv-key", "a").matches(KVChanged("ab"))
    assert Watch("kv-prefix", "p/").matches(KVChanged("p/x/y"))
    assert not Watch("kv-prefix", "p/").matches(KVChanged("q"))
    assert Watch("node-sessions", NODE).matches(SessionChanged("s", NODE))
    assert not Watch("service", "web").matches(ServiceChanged("db"))
    assert Watch("services").matches(ServiceChanged("db"))


# --- snapshots ---------------------------------------------------------------------------------


def test_a_restored_state_keeps_kv_indexes_sessions_and_checks() -> None:
    state = new_state()
    register(state, name="web", check={"ttl": "10s", "status": "passing"})
    sid = session(state, ttl="10s", checks=["service:web"])
    put(state, "k", b"\x00\xff", acquire=sid, flags=3)
    put(state, "gone")
    state.kv_delete("gone", now=0)
    doc = json.loads(json.dumps(state.snapshot()))
    restored = ConsulState.restore(doc, now=1000.0)
    assert restored.snapshot() == state.snapshot()
    assert restored.kv_get("k")[1] == state.kv_get("k")[1]
    assert restored.kv_list("")[0] == state.kv_list("")[0]


def test_a_restored_state_starts_session_timers_afresh() -> None:
    state = new_state()
    sid = session(state, now=0.0, ttl="10s")
    restored = ConsulState.restore(state.snapshot(), now=1000.0)
    restored.tick(1019.9)
    assert sid in restored.sessions
    restored.tick(1020.0)
    assert sid not in restored.sessions


@pytest.mark.parametrize("doc", [{}, {"format": "other"}, {"format": "hexmq-consul-dev/1"}])
def test_a_bad_snapshot_is_a_value_error(doc: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="snapshot"):
        ConsulState.restore(doc, now=0.0)


# --- Go durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [("10s", 10 * NS), ("1m30s", 90 * NS), ("1.5h", 5400 * NS), ("300ms", 300_000_000), ("0", 0)],
)
def test_go_durations_parse_as_go_does(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'time: invalid duration ""'),
        ("10", 'time: missing unit in duration "10"'),
        ("10x", 'time: unknown unit "x" in duration "10x"'),
        (".s", 'time: invalid duration ".s"'),
    ],
)
def test_bad_go_durations_fail_with_go_messages(text: str, message: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_go_duration(text)
    assert str(info.value) == message


def test_go_durations_format_as_go_does() -> None:
    assert [format_go_duration(s * NS) for s in (10, 90, 86400)] == ["10s", "1m30s", "24h0m0s"]
    assert format_go_duration(1_500_000_000) == "1.5s"
    assert format_go_duration(300_000_000) == "300ms"
