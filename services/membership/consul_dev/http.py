"""The HTTP adapter of `hexmq consul-dev`: Consul's paths, parameters, headers and error texts
(agent/http.go, kvs_endpoint.go, session_endpoint.go, ...) around a ConsulState.

Thin by design: it parses a request, runs one state call on the loop's clock (after a tick,
so that every deadline that passed has been acted on), then settles the effects: wakes the
blocking queries a change concerns, logs the notices, persists the state (before answering),
and rearms the one timer at the state's next deadline.

With a management token (`--acl-token-file`) the dispatcher asks the pure rules of acl.py
what each request may do before its handler runs: a refusal is answered there; a listing the
caller may not see is emptied where the handlers take their results (`_visible`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar, cast

from aiohttp import web

from hexmq import __version__
from services.membership.consul_dev import acl, decode
from services.membership.consul_dev.model import (
    CRITICAL,
    DATACENTER,
    KV_MAX_VALUE_SIZE,
    NS,
    PASSING,
    WARNING,
    CheckCritical,
    ConsulError,
    DurationError,
    Notice,
    ServiceReaped,
    SessionInvalidated,
    Watch,
    bad_request,
    not_found,
    parse_go_duration,
    server_error,
)
from services.membership.consul_dev.state import ConsulState
from services.membership.consul_dev.watches import WatchHub

log = logging.getLogger("hexmq.consul_dev")

T = TypeVar("T")
DEFAULT_WAIT_S = 300.0  # Consul's default_query_time
MAX_WAIT_S = 600.0  # max_query_time
JITTER_FRACTION = 16  # up to wait/16 more, so that watchers do not all return at once


class PersistError(Exception):
    """The state could not be written to --data-dir."""


Handler = Callable[[web.Request, str], Awaitable[web.StreamResponse]]

# What the ACL rules allowed a request (an acl.Verdict), and whether its results were filtered.
_VERDICT: Final = "hexmq.consul_dev.verdict"
_FILTERED: Final = "hexmq.consul_dev.filtered"
# The endpoints whose rights depend on the request body (acl.need_for reads it).
_BODY_ROUTES: Final = frozenset({"/v1/session/create", "/v1/agent/service/register"})


def _suffix(path: str, prefix: str) -> str:
    return path[len(prefix) :]


class ConsulHTTP:
    def __init__(
        self,
        state: ConsulState,
        *,
        leader: str,
        persist: Callable[[dict[str, Any]], None] | None = None,
        rng: random.Random | None = None,
        management_token: Callable[[], str] | None = None,
    ) -> None:
        """`management_token`: the one token that may do everything, asked for each request
        (a rotated token file is picked up); None: ACLs disabled, every request allowed."""
        self.state = state
        self._management_token = management_token
        self._facts = StateFacts(state)
        self.leader = leader
        self.hub = WatchHub()
        self.failed = asyncio.Event()  # set when the state could not be persisted
        self._persist = persist
        self._rng = rng or random.Random()
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        self.app = web.Application(client_max_size=KV_MAX_VALUE_SIZE + 1024 * 1024)
        self.app.router.add_route("*", "/{tail:.*}", self._dispatch)
        reads, writes = ("GET",), ("PUT",)
        self._routes: list[tuple[str, tuple[str, ...], Handler]] = [
            ("/v1/kv/", ("GET", "PUT", "DELETE"), self._kv),
            ("/v1/session/create", writes, self._session_create),
            ("/v1/session/destroy/", writes, self._session_destroy),
            ("/v1/session/renew/", writes, self._session_renew),
            ("/v1/session/info/", reads, self._session_info),
            ("/v1/session/node/", reads, self._session_node),
            ("/v1/session/list", reads, self._session_list),
            ("/v1/agent/self", reads, self._agent_self),
            ("/v1/agent/services", reads, self._agent_services),
            ("/v1/agent/checks", reads, self._agent_checks),
            ("/v1/agent/service/register", writes, self._service_register),
            ("/v1/agent/service/deregister/", writes, self._service_deregister),
            ("/v1/agent/check/pass/", writes, self._check_pass),
            ("/v1/agent/check/warn/", writes, self._check_warn),
            ("/v1/agent/check/fail/", writes, self._check_fail),
            ("/v1/health/service/", reads, self._health_service),
            ("/v1/catalog/services", reads, self._catalog_services),
            ("/v1/catalog/service/", reads, self._catalog_service),
            ("/v1/status/leader", reads, self._status_leader),
            ("/v1/status/peers", reads, self._status_peers),
        ]

    # --- lifecycle, clock, effects -----------------------------------------------------------

    def start(self) -> None:
        self._step(lambda now: None)

    def close(self) -> None:
        self.hub.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _step(self, op: Callable[[float], T]) -> T:
        now = self._loop.time()
        self.state.tick(now)
        try:
            return op(now)
        finally:
            self._settle()

    def _settle(self) -> None:
        effects = self.state.take_effects()
        for notice in effects.notices:
            _log_notice(notice)
        if effects.changes:
            if self._persist is not None:
                # Durable before anyone hears of it: the request's answer and the watchers
                # both come after this. (A blocking write: the state is small.)
                try:
                    self._persist(self.state.snapshot())
                except OSError as exc:
                    log.error("cannot persist the state: %s; stopping", exc)
                    self.failed.set()
                    raise PersistError(str(exc)) from exc
            self.hub.notify(effects.changes)
        self._rearm()

    def _rearm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        deadline = self.state.next_deadline()
        if deadline is not None and not self.hub.closed:
            self._timer = self._loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        try:
            self._step(lambda now: None)
        except PersistError:
            pass  # logged; main stops the server

    # --- dispatch ----------------------------------------------------------------------------

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        route = max(
            (
                r
                for r in self._routes
                if path == r[0] or (r[0].endswith("/") and path.startswith(r[0]))
            ),
            key=lambda r: len(r[0]),
            default=None,
        )
        if route is None:
            return _not_a_path(path)
        response = await self._serve(request, route)
        # Consul's wrap sets it on every answer of an API endpoint, ACLs enabled or not.
        policy = "allow" if self._management_token is None else "deny"
        response.headers[acl.DEFAULT_POLICY_HEADER] = policy
        return response

    async def _serve(
        self, request: web.Request, route: tuple[str, tuple[str, ...], Handler]
    ) -> web.StreamResponse:
        path = request.path
        pattern, methods, handler = route
        allow = ",".join(("OPTIONS", *methods))
        if request.method == "OPTIONS":
            return web.Response(headers={"Allow": allow})
        if request.method not in methods:
            return web.Response(
                status=405, text=f"method {request.method} not allowed", headers={"Allow": allow}
            )
        try:
            dc = request.query.get("dc", "")
            if dc and dc != DATACENTER:
                raise server_error("No path to datacenter")
            if "stale" in request.query and "consistent" in request.query:
                raise bad_request("Cannot specify ?stale with ?consistent, conflicting semantics.")
            rest = _suffix(path, pattern)
            request[_VERDICT] = await self._authorize(request, pattern, rest)
            response = await handler(request, rest)
            if request.get(_FILTERED):
                response.headers[acl.FILTERED_HEADER] = "true"
            return response
        except ConsulError as exc:
            log.debug("%s %s: %d %s", request.method, _loggable(request), exc.status, exc.text)
            return web.Response(status=exc.status, text=exc.text)
        except PersistError as exc:
            return web.Response(status=500, text=f"failed to persist the state: {exc}")

    async def _authorize(self, request: web.Request, route: str, rest: str) -> acl.Verdict:
        """What the request may do (acl.py); a refusal is raised as Consul's 403."""
        management = self._management_token
        if management is None:
            return acl.ALLOW
        body = await request.read() if route in _BODY_ROUTES else b""
        need = self._step(
            lambda now: acl.need_for(route, request.method, rest, request.query, body, self._facts)
        )
        identity = None
        if need is not acl.Need.OPEN:
            token = acl.request_token(request.query, request.headers)
            identity = acl.resolve(token, management())
        verdict = acl.decide(identity, need)
        if not verdict.allowed:
            raise verdict.refusal()
        return verdict

    def _visible(self, request: web.Request, result: T) -> T:
        """The results the request may see: all of them, or (a listing the caller has no
        right to) nothing, noting that something was left out."""
        verdict: acl.Verdict = request.get(_VERDICT, acl.ALLOW)
        if verdict.sees_all:
            return result
        if verdict.shows_filtering and result:
            request[_FILTERED] = True
        return _nothing_like(result)

    def _json(
        self, request: web.Request, doc: Any, index: int | None = None, status: int = 200
    ) -> web.Response:
        if "pretty" in request.query:
            body = json.dumps(doc, indent=4) + "\n"
        else:
            body = json.dumps(doc, separators=(",", ":"))
        return web.Response(
            status=status, text=body, content_type="application/json", headers=_meta(index)
        )

    async def _blocking(
        self, request: web.Request, watch: Watch, query: Callable[[], tuple[int, T]]
    ) -> tuple[int, T]:
        """Consul's blockingQuery: without ?index (or 0) answer at once; else wait while the
        answer's index is <= the one asked, up to ?wait (default 5 min, at most 10 min, plus up
        to wait/16 jitter), and answer the current result when the time is up."""
        min_index, wait = 0, 0.0
        if request.query.get("wait"):
            try:
                wait = parse_go_duration(request.query["wait"]) / NS
            except DurationError:
                raise bad_request("Invalid wait time") from None
        if request.query.get("index"):
            text = request.query["index"]
            if not text.isdigit() or int(text) >= 2**64:
                raise bad_request("Invalid index")
            min_index = int(text)
        index, result = self._step(lambda now: query())
        if not min_index:
            return max(index, 1), self._visible(request, result)
        wait = DEFAULT_WAIT_S if wait <= 0 else min(wait, MAX_WAIT_S)
        deadline = self._loop.time() + wait + self._rng.uniform(0, wait / JITTER_FRACTION)
        while max(index, 1) <= min_index:
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                break
            woken = await self.hub.wait(watch, remaining)
            index, result = self._step(lambda now: query())
            if not woken:
                break
        return max(index, 1), self._visible(request, result)

    # --- KV ----------------------------------------------------------------------------------

    async def _kv(self, request: web.Request, key: str) -> web.StreamResponse:
        raw_path = request.raw_path.split("?", 1)[0]
        if "../" in raw_path or "..\\" in raw_path:
            raise bad_request("URL path contains invalid traversal sequence")
        if re.search("%2e%2e%2f|%2e%2e/|\\.\\.%2f|%2e%2e%5c|%252e%252e%252f", raw_path, re.I):
            raise bad_request("URL path contains encoded traversal sequence")
        if key:
            decode.validate_kv_key(key)
        if request.method == "GET":
            return await self._kv_get(request, key)
        if request.method == "PUT":
            return await self._kv_put(request, key)
        return self._kv_delete(request, key)

    async def _kv_get(self, request: web.Request, key: str) -> web.StreamResponse:
        if "keys" in request.query:
            sep = request.query.get("separator", request.query.get("seperator", ""))
            index, keys = await self._blocking(
                request, Watch("kv-prefix", key), lambda: self.state.kv_keys(key, sep)
            )
            if not keys and key:
                return web.Response(status=404, headers=_meta(index))
            return self._json(request, keys, index)
        if "recurse" in request.query:
            index, entries = await self._blocking(
                request, Watch("kv-prefix", key), lambda: self.state.kv_list(key)
            )
        else:
            if not key:
                raise bad_request("Missing key name")
            index, entry = await self._blocking(
                request, Watch("kv-key", key), lambda: self.state.kv_get(key)
            )
            entries = [] if entry is None else [entry]
        if not entries:
            return web.Response(status=404, headers=_meta(index))
        if "raw" in request.query and "recurse" not in request.query:
            headers = {
                **_meta(index),
                "X-Content-Type-Options": "nosniff",
                "Content-Security-Policy": "sandbox",
            }
            return web.Response(
                body=entries[0].value or b"", content_type="text/plain", headers=headers
            )
        return self._json(request, [e.api() for e in entries], index)

    async def _kv_put(self, request: web.Request, key: str) -> web.StreamResponse:
        if not key:
            raise bad_request("Missing key name")
        decode.refuse_conflicting(request.query, "cas", "acquire", "release")
        flags = decode.query_uint(request.query, "flags") if "flags" in request.query else 0
        cas = decode.query_uint(request.query, "cas") if "cas" in request.query else None
        size = request.content_length or 0
        if size > KV_MAX_VALUE_SIZE:
            raise ConsulError(
                413,
                f"Request body({size} bytes) too large, max size: {KV_MAX_VALUE_SIZE} bytes. "
                "See https://developer.hashicorp.com/docs/agent/config/config-files"
                "#kv_max_value_size.",
            )
        body = await request.read()
        done = self._step(
            lambda now: self.state.kv_put(
                key,
                body or None,  # Consul stores an empty body as no value ("Value": null)
                now=now,
                flags=flags,
                cas=cas,
                acquire=request.query.get("acquire") if "acquire" in request.query else None,
                release=request.query.get("release") if "release" in request.query else None,
            )
        )
        return self._json(request, done)

    def _kv_delete(self, request: web.Request, key: str) -> web.StreamResponse:
        decode.refuse_conflicting(request.query, "recurse", "cas")
        recurse = "recurse" in request.query
        if not recurse and not key:
            raise bad_request("Missing key name")
        cas = decode.query_uint(request.query, "cas") if "cas" in request.query else None
        done = self._step(lambda now: self.state.kv_delete(key, now=now, recurse=recurse, cas=cas))
        return self._json(request, done)

    # --- sessions ----------------------------------------------------------------------------

    async def _session_create(self, request: web.Request, _: str) -> web.StreamResponse:
        body = await request.read()
        spec = decode.session_spec(body)
        session_id = self._step(lambda now: self.state.session_create(spec, now))
        return self._json(request, {"ID": session_id})

    async def _session_destroy(self, request: web.Request, session_id: str) -> web.StreamResponse:
        if not session_id:
            raise bad_request("Missing session")
        self._step(lambda now: self.state.session_destroy(session_id, now))
        return self._json(request, True)

    async def _session_renew(self, request: web.Request, session_id: str) -> web.StreamResponse:
        if not session_id:
            raise bad_request("Missing session")
        session = self._step(lambda now: self.state.session_renew(session_id, now))
        if session is None:
            raise not_found(f"Session id '{session_id}' not found")
        return self._json(request, [session.api()])

    async def _session_info(self, request: web.Request, session_id: str) -> web.StreamResponse:
        if not session_id:
            raise bad_request("Missing session")
        index, session = await self._blocking(
            request, Watch("session", session_id), lambda: self.state.session_info(session_id)
        )
        return self._json(request, [] if session is None else [session.api()], index)

    async def _session_node(self, request: web.Request, node: str) -> web.StreamResponse:
        if not node:
            raise bad_request("Missing node name")
        index, sessions = await self._blocking(
            request, Watch("node-sessions", node), lambda: self.state.session_node(node)
        )
        return self._json(request, [s.api() for s in sessions], index)

    async def _session_list(self, request: web.Request, _: str) -> web.StreamResponse:
        index, sessions = await self._blocking(request, Watch("sessions"), self.state.session_list)
        return self._json(request, [s.api() for s in sessions], index)

    # --- agent -------------------------------------------------------------------------------

    async def _agent_self(self, request: web.Request, _: str) -> web.StreamResponse:
        catalog = self.state.catalog
        return self._json(
            request,
            {
                "Config": {
                    "Datacenter": DATACENTER,
                    "PrimaryDatacenter": DATACENTER,
                    "NodeName": catalog.node_name,
                    "NodeID": catalog.node_id,
                    "Server": True,
                    "Revision": "",
                    "Version": f"hexmq-consul-dev {__version__}",
                },
                "Member": {
                    "Name": catalog.node_name,
                    "Addr": catalog.address,
                    "Port": 8301,
                    "Tags": {"dc": DATACENTER, "role": "consul", "id": catalog.node_id},
                    "Status": 1,
                },
                "Meta": {"consul-network-segment": ""},
            },
        )

    async def _agent_services(self, request: web.Request, _: str) -> web.StreamResponse:
        services = self._step(lambda now: self.state.agent_services())
        return self._json(request, self._visible(request, services))

    async def _agent_checks(self, request: web.Request, _: str) -> web.StreamResponse:
        checks = self._step(lambda now: self.state.agent_checks())
        return self._json(request, self._visible(request, checks))

    async def _service_register(self, request: web.Request, _: str) -> web.StreamResponse:
        definition = decode.service_definition(await request.read())
        self._step(lambda now: self.state.service_register(definition, now))
        return web.Response()

    async def _service_deregister(self, request: web.Request, sid: str) -> web.StreamResponse:
        self._step(lambda now: self.state.service_deregister(sid, now))
        return web.Response()

    def _check(self, request: web.Request, check_id: str, status: str) -> web.StreamResponse:
        note = request.query.get("note", "")
        self._step(lambda now: self.state.check_update(check_id, status, note, now))
        return web.Response()

    async def _check_pass(self, request: web.Request, check_id: str) -> web.StreamResponse:
        return self._check(request, check_id, PASSING)

    async def _check_warn(self, request: web.Request, check_id: str) -> web.StreamResponse:
        return self._check(request, check_id, WARNING)

    async def _check_fail(self, request: web.Request, check_id: str) -> web.StreamResponse:
        return self._check(request, check_id, CRITICAL)

    # --- health, catalog, status -------------------------------------------------------------

    async def _health_service(self, request: web.Request, name: str) -> web.StreamResponse:
        if not name:
            raise bad_request("Missing service name")
        passing = decode.query_bool(request.query, "passing")
        tags = request.query.getall("tag", [])
        index, entries = await self._blocking(
            request,
            Watch("service", name),
            lambda: self.state.health_service(name, tags, passing),
        )
        return self._json(request, entries, index)

    async def _catalog_services(self, request: web.Request, _: str) -> web.StreamResponse:
        index, services = await self._blocking(
            request, Watch("services"), self.state.catalog_services
        )
        return self._json(request, services, index)

    async def _catalog_service(self, request: web.Request, name: str) -> web.StreamResponse:
        if not name:
            raise bad_request("Missing service name")
        tags = request.query.getall("tag", [])
        index, nodes = await self._blocking(
            request, Watch("service", name), lambda: self.state.catalog_service(name, tags)
        )
        return self._json(request, nodes, index)

    async def _status_leader(self, request: web.Request, _: str) -> web.StreamResponse:
        return self._json(request, self.leader)

    async def _status_peers(self, request: web.Request, _: str) -> web.StreamResponse:
        return self._json(request, [self.leader])


class StateFacts:
    """What the ACL rules ask of the state (acl.Facts)."""

    def __init__(self, state: ConsulState) -> None:
        self._state = state

    @property
    def node_name(self) -> str:
        return self._state.node_name

    def session_node(self, session_id: str) -> str | None:
        session = self._state.sessions.get(session_id)
        return None if session is None else session.node

    def agent_service_name(self, service_id: str) -> str | None:
        service = self._state.catalog.services.get(service_id)
        return service.name if service is not None and service.registered_by_agent else None

    def check_service_name(self, check_id: str) -> str | None:
        check = self._state.catalog.checks.get(check_id)
        return None if check is None else check.service_name


def _nothing_like(result: T) -> T:
    """An empty result of the same shape: [] for a list, {} for a map, None for one record."""
    if isinstance(result, list | dict):
        return cast(T, type(result)())
    return cast(T, None)


def _loggable(request: web.Request) -> str:
    """The request's path and query, a `?token=` hidden (Consul's wrap does the same)."""
    if "token" not in request.query:
        return request.path_qs
    query = "&".join(
        f"{name}={'<hidden>' if name == 'token' else value}"
        for name, value in request.query.items()
    )
    return f"{request.path}?{query}"


def _meta(index: int | None) -> dict[str, str]:
    if index is None:
        return {}
    return {
        "X-Consul-Index": str(max(index, 1)),
        "X-Consul-KnownLeader": "true",
        "X-Consul-LastContact": "0",
    }


def _not_a_path(path: str) -> web.Response:
    if path == "/":
        return web.Response(text="hexmq consul-dev: a subset of Consul's HTTP API under /v1/")
    if "/v1/" in path:
        return web.Response(
            status=404, text="Invalid URL path: not a recognized HTTP API endpoint\n"
        )
    return web.Response(
        status=404,
        text="Invalid URL path: if attempting to use the HTTP API, ensure the path starts with "
        "'/v1/'\n",
    )


def _log_notice(notice: Notice) -> None:
    match notice:
        case SessionInvalidated():
            held = (
                f"released {len(notice.released)} key(s)"
                if not notice.deleted
                else f"deleted {len(notice.deleted)} key(s)"
            )
            keys = ", ".join((*notice.released, *notice.deleted)[:5])
            log.info(
                "session %s%s invalidated: %s; %s%s",
                notice.session_id,
                f" ({notice.name})" if notice.name else "",
                notice.reason,
                held,
                f" ({keys})" if keys else "",
            )
        case CheckCritical():
            log.info(
                "check %s%s is critical: %s",
                notice.check_id,
                f" of service {notice.service_id}" if notice.service_id else "",
                notice.output or "(no output)",
            )
        case ServiceReaped():
            log.info(
                "service %s deregistered: check %s critical for more than %gs "
                "(DeregisterCriticalServiceAfter)",
                notice.service_id,
                notice.check_id,
                notice.after_s,
            )
