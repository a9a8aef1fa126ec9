"""Consul's ACL rules for what `hexmq consul-dev --acl-token-file` serves: ACLs enabled, default
policy deny, one management token (Consul's acl.tokens.initial_management), no other token.

Pure: the HTTP adapter (http.py) asks, for each request, `need_for` (what the endpoint needs,
from its path, query, body and the state's facts), `resolve` (who the token is) and `decide`
(the answer), and does what the verdict says. The rules, and the texts, are Consul's
(hashicorp/consul 1.2x: agent/http.go parseTokenInternal and wrap, acl/errors.go,
agent/consul/{kvs,session,catalog,health,status}_endpoint.go, agent/agent_endpoint.go,
agent/acl.go, agent/consul/rpc.go maskResultsFilteredByACLs):

- The token is `?token=`, else the `X-Consul-Token` header, else `Authorization: Bearer`; none
  is the anonymous token, and so is the secret `anonymous`.
- A token that is neither is refused everywhere it is resolved: 403 `ACL not found`.
- The management token may do everything. The anonymous token, under default deny, may do
  nothing: a request that needs a right is refused with 403 `Permission denied: anonymous token
  lacks permission 'key:read' on "K". The anonymous token is used implicitly when a request
  does not specify a token.`; a listing (KV ?recurse and ?keys, session info/list/node, agent
  services and checks, health and catalog) is not refused but filtered: it sees nothing, which
  for KV ?recurse and ?keys under a prefix is a 404. `X-Consul-Results-Filtered-By-ACLs: true`
  says something was left out, and only to a request that gave a token (`anonymous`): Consul
  hides it from requests without one.
- /v1/status/leader and /v1/status/peers need no token and resolve none.
- Every answer of an API endpoint says `X-Consul-Default-ACL-Policy: deny` (`allow` without
  --acl-token-file, as Consul with ACLs disabled).
- Where Consul answers before it resolves the token (a 400 of its HTTP layer: a missing key
  name, conflicting flags, a body it cannot decode) the request goes on to the handler, which
  answers the same. Destroying or renewing a session that does not exist, deregistering an
  unknown service, updating an unknown check resolve the token but need no right (Consul
  checks the rights on what exists): the handler answers as without ACLs.

Where it differs from Consul, on purpose: the refusal comes before the rest of the request is
validated, so a request that is both refused and malformed in another way (a bad ?index, an
invalid key) gets the 403, where Consul would answer its 400 first.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol

from services.membership.consul_dev import decode
from services.membership.consul_dev.model import ConsulError

# acl.AnonymousTokenSecret: the anonymous token's secret (sending it names that token).
ANONYMOUS_SECRET: Final = "anonymous"
# acl/errors.go errNotFound: the answer to a token that does not exist.
ACL_NOT_FOUND: Final = "ACL not found"
# acl/errors.go PermissionDeniedError.Error for the anonymous token.
ANONYMOUS_HINT: Final = (
    "The anonymous token is used implicitly when a request does not specify a token."
)
FILTERED_HEADER: Final = "X-Consul-Results-Filtered-By-ACLs"
DEFAULT_POLICY_HEADER: Final = "X-Consul-Default-ACL-Policy"


class Caller(Enum):
    MANAGEMENT = "management"
    ANONYMOUS = "anonymous"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Identity:
    caller: Caller
    presented: bool  # the request named a token (Consul shows filtering only then)


@dataclass(frozen=True, slots=True)
class Permission:
    """A right an endpoint needs: `resource:level` on `name` ('key:read' on "hexmq/c1/view")."""

    resource: str  # key, session, service, node, agent
    level: str  # read, write
    name: str

    def denied_to_anonymous(self) -> str:
        """acl.PermissionDeniedError.Error for the anonymous token."""
        on = f' on "{self.name}"' if self.name else ""
        return (
            f"Permission denied: anonymous token lacks permission "
            f"'{self.resource}:{self.level}'{on}. {ANONYMOUS_HINT}"
        )


class Need(Enum):
    OPEN = "open"  # no token is resolved (status; requests Consul refuses before it resolves)
    RESOLVE = "resolve"  # the token must exist, no right is needed
    LISTING = "listing"  # the results are filtered by the caller's rights


Requirement = Need | Permission


@dataclass(frozen=True, slots=True)
class Verdict:
    """Allowed (`sees_all`: the results need no filtering; `shows_filtering`: say so when they
    were), or refused with `denied` (403 and that text)."""

    denied: str | None = None
    sees_all: bool = True
    shows_filtering: bool = False

    @property
    def allowed(self) -> bool:
        return self.denied is None

    def refusal(self) -> ConsulError:
        assert self.denied is not None
        return ConsulError(403, self.denied)


ALLOW: Final = Verdict()


class Facts(Protocol):
    """What the rules need to know of the state."""

    @property
    def node_name(self) -> str: ...

    def session_node(self, session_id: str) -> str | None:
        """The node of a live session, None if there is none with that ID."""
        ...

    def agent_service_name(self, service_id: str) -> str | None:
        """The name of a service the agent registered, None if there is none with that ID."""
        ...

    def check_service_name(self, check_id: str) -> str | None:
        """A check's service name ("" for a node check), None if there is no such check."""
        ...


def request_token(query: Mapping[str, str], headers: Mapping[str, str]) -> str:
    """agent/http.go parseTokenInternal: `?token=` first, then X-Consul-Token, then
    `Authorization: Bearer <token>` (scheme in any case, the first word after it); "": none."""
    if query.get("token"):
        return query["token"]
    if headers.get("X-Consul-Token"):
        return headers["X-Consul-Token"]
    parts = headers.get("Authorization", "").split(" ")
    if len(parts) > 1 and parts[0].lower() == "bearer":
        value = " ".join(parts[1:]).strip()
        return value.split(" ")[0].strip()
    return ""


def resolve(token: str, management: str) -> Identity:
    """Who the token is ("": none given). Compared in constant time: the answer's timing does
    not tell how much of a guess was right."""
    presented = token != ""
    if token in ("", ANONYMOUS_SECRET):
        return Identity(Caller.ANONYMOUS, presented)  # whatever the management token is
    if hmac.compare_digest(token.encode(), management.encode()):
        return Identity(Caller.MANAGEMENT, presented)
    return Identity(Caller.UNKNOWN, presented)


def decide(identity: Identity | None, need: Requirement) -> Verdict:
    """The answer for a caller (None: not resolved, for OPEN) and what the endpoint needs."""
    if need is Need.OPEN:
        return ALLOW
    assert identity is not None, "only OPEN endpoints skip resolving the token"
    if identity.caller is Caller.UNKNOWN:
        return Verdict(denied=ACL_NOT_FOUND)
    if identity.caller is Caller.MANAGEMENT or need is Need.RESOLVE:
        return ALLOW
    if need is Need.LISTING:
        return Verdict(sees_all=False, shows_filtering=identity.presented)
    return Verdict(denied=need.denied_to_anonymous())


def _conflicting(query: Mapping[str, str], *flags: str) -> bool:
    return sum(f in query for f in flags) > 1


def _kv(method: str, key: str, query: Mapping[str, str]) -> Requirement:
    """agent/kvs_endpoint.go (the HTTP checks) and agent/consul/kvs_endpoint.go (the rights)."""
    if method == "GET":
        if "recurse" in query or "keys" in query:
            return Need.LISTING  # KVS.List, KVS.ListKeys: FilterDirEnt
        return Permission("key", "read", key) if key else Need.OPEN  # "Missing key name"
    if method == "PUT":
        if not key or _conflicting(query, "cas", "acquire", "release"):
            return Need.OPEN
        return Permission("key", "write", key)
    # DELETE: KeyWritePrefix for ?recurse, KeyWrite otherwise; both say 'key:write'.
    if _conflicting(query, "recurse", "cas") or (not key and "recurse" not in query):
        return Need.OPEN
    return Permission("key", "write", key)


def need_for(
    route: str, method: str, rest: str, query: Mapping[str, str], body: bytes, facts: Facts
) -> Requirement:
    """What a request needs: `route` is the matched pattern of http.py's route table, `rest`
    the path after it, `body` the request body (read for the two endpoints whose rights
    depend on it)."""
    match route:
        case "/v1/status/leader" | "/v1/status/peers":
            return Need.OPEN
        case "/v1/kv/":
            return _kv(method, rest, query)
        case "/v1/session/create":
            try:
                spec = decode.session_spec(body)
            except ConsulError:
                return Need.OPEN  # Consul decodes the body first: its 400
            return Permission("session", "write", spec.node or facts.node_name)
        case "/v1/session/destroy/" | "/v1/session/renew/":
            if not rest:
                return Need.OPEN  # "Missing session"
            node = facts.session_node(rest)
            return Need.RESOLVE if node is None else Permission("session", "write", node)
        case "/v1/session/info/" | "/v1/session/node/" | "/v1/health/service/":
            return Need.LISTING if rest else Need.OPEN  # "Missing ..." 400s
        case "/v1/catalog/service/":
            return Need.LISTING if rest else Need.OPEN
        case "/v1/session/list" | "/v1/catalog/services":
            return Need.LISTING
        case "/v1/agent/services" | "/v1/agent/checks":
            return Need.LISTING
        case "/v1/agent/self":
            return Permission("agent", "read", facts.node_name)
        case "/v1/agent/service/register":
            try:
                definition = decode.service_definition(body)
            except ConsulError:
                return Need.OPEN
            return Permission("service", "write", definition.name)
        case "/v1/agent/service/deregister/":
            name = facts.agent_service_name(rest)
            return Need.RESOLVE if name is None else Permission("service", "write", name)
        case "/v1/agent/check/pass/" | "/v1/agent/check/warn/" | "/v1/agent/check/fail/":
            service = facts.check_service_name(rest)
            if service is None:
                return Need.RESOLVE
            if service:
                return Permission("service", "write", service)
            return Permission("node", "write", facts.node_name)
    # An endpoint added to the route table without a rule here: the safe answer.
    return Permission("operator", "write", "")
