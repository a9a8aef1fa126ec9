"""The ACL rules of `hexmq consul-dev` (services/membership/consul_dev/acl.py), as pure
functions: where the token is taken from, who it is, what each endpoint of the route table
needs, and the answer (Consul's texts). tests/consul/test_acl.py checks the same rules over
HTTP, against consul-dev and a real Consul."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from services.membership.consul_dev import acl
from services.membership.consul_dev.acl import (
    ALLOW,
    Caller,
    Identity,
    Need,
    Permission,
    Verdict,
    decide,
    need_for,
    request_token,
    resolve,
)
from services.membership.consul_dev.http import ConsulHTTP
from services.membership.consul_dev.state import ConsulState

MANAGEMENT = "5f0c9e63-management"
HINT = "The anonymous token is used implicitly when a request does not specify a token."


@dataclass
class Facts:
    node_name: str = "hexmq-consul-dev"
    sessions: dict[str, str] = field(default_factory=dict)  # id -> node
    services: dict[str, str] = field(default_factory=dict)  # id -> name
    checks: dict[str, str] = field(default_factory=dict)  # id -> service name ("" node check)

    def session_node(self, session_id: str) -> str | None:
        return self.sessions.get(session_id)

    def agent_service_name(self, service_id: str) -> str | None:
        return self.services.get(service_id)

    def check_service_name(self, check_id: str) -> str | None:
        return self.checks.get(check_id)


FACTS = Facts(
    sessions={"s-1": "hexmq-consul-dev"},
    services={"n1": "hexmq"},
    checks={"service:n1": "hexmq", "serfHealth": ""},
)


def need(
    route: str, method: str = "GET", rest: str = "", body: bytes = b"", **query: str
) -> object:
    return need_for(route, method, rest, query, body, FACTS)


# --- the token -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "headers", "token"),
    [
        ({}, {}, ""),
        ({"token": "q"}, {}, "q"),
        ({}, {"X-Consul-Token": "h"}, "h"),
        ({}, {"Authorization": "Bearer b"}, "b"),
        ({}, {"Authorization": "bearer  b  extra"}, "b"),  # scheme in any case; first word
        ({}, {"Authorization": "Basic dXNlcg=="}, ""),  # not a bearer: no token
        ({}, {"Authorization": "Bearer"}, ""),  # a scheme alone is no token
        ({}, {"Authorization": "Bearer "}, ""),
        ({"token": "q"}, {"X-Consul-Token": "h", "Authorization": "Bearer b"}, "q"),
        ({}, {"X-Consul-Token": "h", "Authorization": "Bearer b"}, "h"),
        ({"token": ""}, {"X-Consul-Token": "h"}, "h"),  # an empty ?token= is none
    ],
)
def test_the_token_is_the_query_parameter_then_the_header_then_a_bearer(
    query: dict[str, str], headers: dict[str, str], token: str
) -> None:
    assert request_token(query, headers) == token


@pytest.mark.parametrize(
    ("token", "caller"),
    [
        (MANAGEMENT, Caller.MANAGEMENT),
        ("", Caller.ANONYMOUS),
        ("anonymous", Caller.ANONYMOUS),  # acl.AnonymousTokenSecret, named: presented
        (MANAGEMENT[:-1], Caller.UNKNOWN),
        (MANAGEMENT + "x", Caller.UNKNOWN),
        ("ANONYMOUS", Caller.UNKNOWN),
    ],
)
def test_a_token_is_the_management_token_the_anonymous_one_or_unknown(
    token: str, caller: Caller
) -> None:
    assert resolve(token, MANAGEMENT) == Identity(caller, presented=token != "")


def test_no_token_and_the_anonymous_secret_are_never_the_management_token() -> None:
    assert resolve("", "").caller is Caller.ANONYMOUS
    assert resolve("anonymous", "anonymous").caller is Caller.ANONYMOUS


def test_the_token_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []

    def compare_digest(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(acl.hmac, "compare_digest", compare_digest)
    assert resolve("guess", MANAGEMENT).caller is Caller.UNKNOWN
    assert compared == [(b"guess", MANAGEMENT.encode())]


# --- what each endpoint needs ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "wanted"),
    [
        (("/v1/status/leader",), {}, Need.OPEN),
        (("/v1/status/peers",), {}, Need.OPEN),
        (("/v1/kv/", "GET", "hexmq/c1/view"), {}, Permission("key", "read", "hexmq/c1/view")),
        (("/v1/kv/", "GET", "hexmq/c1/"), {"recurse": ""}, Need.LISTING),
        (("/v1/kv/", "GET", "hexmq/c1/"), {"keys": "", "separator": "/"}, Need.LISTING),
        (("/v1/kv/", "GET", ""), {}, Need.OPEN),  # 400 Missing key name, before the token
        (("/v1/kv/", "PUT", "k"), {"cas": "0"}, Permission("key", "write", "k")),
        (("/v1/kv/", "PUT", "k"), {"acquire": "s-1"}, Permission("key", "write", "k")),
        (("/v1/kv/", "PUT", "k"), {"cas": "0", "acquire": "s-1"}, Need.OPEN),  # 400 first
        (("/v1/kv/", "PUT", ""), {}, Need.OPEN),
        (("/v1/kv/", "DELETE", "k"), {}, Permission("key", "write", "k")),
        (("/v1/kv/", "DELETE", "p/"), {"recurse": ""}, Permission("key", "write", "p/")),
        (("/v1/kv/", "DELETE", ""), {"recurse": ""}, Permission("key", "write", "")),
        (("/v1/kv/", "DELETE", ""), {}, Need.OPEN),
        (("/v1/kv/", "DELETE", "k"), {"recurse": "", "cas": "1"}, Need.OPEN),
        (
            ("/v1/session/destroy/", "PUT", "s-1"),
            {},
            Permission("session", "write", FACTS.node_name),
        ),
        (("/v1/session/destroy/", "PUT", "s-2"), {}, Need.RESOLVE),  # none: nothing to check
        (("/v1/session/destroy/", "PUT", ""), {}, Need.OPEN),
        (("/v1/session/renew/", "PUT", "s-1"), {}, Permission("session", "write", FACTS.node_name)),
        (("/v1/session/renew/", "PUT", "s-2"), {}, Need.RESOLVE),
        (("/v1/session/info/", "GET", "s-1"), {}, Need.LISTING),
        (("/v1/session/info/", "GET", ""), {}, Need.OPEN),
        (("/v1/session/node/", "GET", "hexmq-consul-dev"), {}, Need.LISTING),
        (("/v1/session/list",), {}, Need.LISTING),
        (("/v1/agent/self",), {}, Permission("agent", "read", FACTS.node_name)),
        (("/v1/agent/services",), {}, Need.LISTING),
        (("/v1/agent/checks",), {}, Need.LISTING),
        (
            ("/v1/agent/service/deregister/", "PUT", "n1"),
            {},
            Permission("service", "write", "hexmq"),
        ),
        (("/v1/agent/service/deregister/", "PUT", "n9"), {}, Need.RESOLVE),  # its 404
        (
            ("/v1/agent/check/pass/", "PUT", "service:n1"),
            {},
            Permission("service", "write", "hexmq"),
        ),
        (
            ("/v1/agent/check/warn/", "PUT", "service:n1"),
            {},
            Permission("service", "write", "hexmq"),
        ),
        (
            ("/v1/agent/check/fail/", "PUT", "serfHealth"),
            {},
            Permission("node", "write", FACTS.node_name),
        ),
        (("/v1/agent/check/pass/", "PUT", "nope"), {}, Need.RESOLVE),
        (("/v1/health/service/", "GET", "hexmq"), {"passing": ""}, Need.LISTING),
        (("/v1/health/service/", "GET", ""), {}, Need.OPEN),
        (("/v1/catalog/services",), {}, Need.LISTING),
        (("/v1/catalog/service/", "GET", "hexmq"), {}, Need.LISTING),
        (("/v1/catalog/service/", "GET", ""), {}, Need.OPEN),
    ],
)
def test_what_each_endpoint_needs(
    args: tuple[str, ...], kwargs: dict[str, str], wanted: object
) -> None:
    assert need(*args, **kwargs) == wanted


def test_session_create_and_service_register_need_rights_on_what_their_body_names() -> None:
    create = "/v1/session/create"
    assert need(create, "PUT", body=b"{}") == Permission("session", "write", FACTS.node_name)
    body = json.dumps({"Node": "other", "TTL": "10s"}).encode()
    assert need(create, "PUT", body=body) == Permission("session", "write", "other")
    register = "/v1/agent/service/register"
    body = json.dumps({"Name": "hexmq", "ID": "n2", "Port": 7001}).encode()
    assert need(register, "PUT", body=body) == Permission("service", "write", "hexmq")
    # A body Consul cannot decode is its 400 before any token: the handler answers it.
    assert need(create, "PUT", body=b"{not json") is Need.OPEN
    assert need(register, "PUT", body=b'{"Port": 1}') is Need.OPEN  # Missing service name


async def test_every_route_of_the_table_has_a_rule() -> None:
    """A route added to http.py without a rule in acl.py falls to 'operator:write'
    (management only): the table and the rules must not drift apart."""
    fallback = Permission("operator", "write", "")
    server = ConsulHTTP(ConsulState(FACTS.node_name), leader="127.0.0.1:8300")
    routes = [pattern for pattern, _, _ in server._routes]
    assert len(routes) == 20
    for pattern in routes:
        for method in ("GET", "PUT", "DELETE"):
            assert need(pattern, method, "x") != fallback, pattern
    assert need("/v1/acl/tokens") == fallback


# --- the answer ------------------------------------------------------------------------------

ANONYMOUS = Identity(Caller.ANONYMOUS, presented=False)
ANONYMOUS_NAMED = Identity(Caller.ANONYMOUS, presented=True)  # the secret "anonymous"
MANAGER = Identity(Caller.MANAGEMENT, presented=True)
STRANGER = Identity(Caller.UNKNOWN, presented=True)


def test_open_endpoints_need_no_token_at_all() -> None:
    assert decide(None, Need.OPEN) == ALLOW


@pytest.mark.parametrize(
    "need_", [Need.RESOLVE, Need.LISTING, Permission("key", "read", "k")], ids=str
)
def test_a_token_that_does_not_exist_is_refused_wherever_it_is_resolved(
    need_: Need | Permission,
) -> None:
    verdict = decide(STRANGER, need_)
    assert verdict == Verdict(denied="ACL not found")
    assert (verdict.refusal().status, verdict.refusal().text) == (403, "ACL not found")


@pytest.mark.parametrize(
    "need_", [Need.RESOLVE, Need.LISTING, Permission("session", "write", "n")], ids=str
)
def test_the_management_token_may_do_everything_and_sees_everything(
    need_: Need | Permission,
) -> None:
    assert decide(MANAGER, need_) == ALLOW


@pytest.mark.parametrize(
    ("permission", "text"),
    [
        (
            Permission("key", "read", "hexmq/c1/view"),
            "Permission denied: anonymous token lacks permission 'key:read' on "
            f'"hexmq/c1/view". {HINT}',
        ),
        (
            Permission("session", "write", "hexmq-consul-dev"),
            "Permission denied: anonymous token lacks permission 'session:write' on "
            f'"hexmq-consul-dev". {HINT}',
        ),
        (
            Permission("key", "write", ""),  # a recursive delete of everything: no " on"
            f"Permission denied: anonymous token lacks permission 'key:write'. {HINT}",
        ),
    ],
)
def test_the_anonymous_token_is_refused_a_right_in_consuls_words(
    permission: Permission, text: str
) -> None:
    for anonymous in (ANONYMOUS, ANONYMOUS_NAMED):
        verdict = decide(anonymous, permission)
        assert not verdict.allowed
        assert verdict.denied == text


def test_the_anonymous_token_sees_empty_listings_told_so_only_when_it_named_a_token() -> None:
    assert decide(ANONYMOUS, Need.LISTING) == Verdict(sees_all=False, shows_filtering=False)
    assert decide(ANONYMOUS_NAMED, Need.LISTING) == Verdict(sees_all=False, shows_filtering=True)
    assert decide(ANONYMOUS, Need.RESOLVE) == ALLOW
