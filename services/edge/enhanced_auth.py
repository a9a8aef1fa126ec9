"""Enhanced authentication (MQTT 5.0 section 4.12): the interface an authentication method
implements, the methods an edge offers, and one connection's exchanges.

A method (`AuthMethod`) has a name, the Authentication Method a client puts in CONNECT, and
starts one `AuthExchange` per exchange: the one in CONNECT, and one per re-authentication. Each
step of an exchange takes the client's Authentication Data and answers

- `Continue(data)`: send the client AUTH 0x18 with `data` and wait for its next AUTH 0x18;
- `Success(username, data)`: the client is `username` (the name the ACL and the rest of the
  session see); CONNACK 0x00, or AUTH 0x00 after a re-authentication, carries `data`;
- `Failure(reason_code, reason)`: CONNACK (or, when re-authenticating, DISCONNECT) with that
  reason code and Reason String, then close. `log` says more, to the edge's log only.

A step runs on the edge's event loop: it must not block (no network or disk I/O).

Operators add their own methods with ``hexmq edge --auth-plugin MODULE:FACTORY``: the edge
imports MODULE, calls ``FACTORY(context)`` with a `PluginContext` and offers the `AuthMethod` it
returns (see docs/operations.md, "Enhanced authentication").
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

from hexmq.mqtt import ProtocolError
from hexmq.mqtt.reason_codes import CONNACK_REASON_CODES, DISCONNECT_REASON_CODES, ReasonCode

if TYPE_CHECKING:
    from hexmq.mqtt import Auth
    from services.edge.auth import PasswordFile

log = logging.getLogger("hexmq.edge.auth")

RC = ReasonCode
# Reason codes a failure may carry: it ends a CONNECT (CONNACK) or a re-authentication
# (DISCONNECT), so it must be a failing code of both.
FAILURE_CODES = frozenset(
    c for c in CONNACK_REASON_CODES & DISCONNECT_REASON_CODES if c >= RC.UNSPECIFIED_ERROR
)


@dataclass(frozen=True, slots=True)
class Continue:
    """More is needed: AUTH 0x18 carrying `data` to the client."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Success:
    """Authenticated as `username`; `data` goes to the client with CONNACK (or AUTH 0x00)."""

    username: str
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """Refused with `reason_code` (0x80 or above) and `reason` as the Reason String; `log`
    (never sent) says why in the edge's log; `data` goes with a refusing CONNACK."""

    reason_code: int
    reason: str
    log: str = ""
    data: bytes | None = None


Step = Continue | Success | Failure


class AuthExchange(Protocol):
    """One exchange of one method: the steps between a CONNECT (or AUTH 0x19) and its end."""

    def step(self, data: bytes | None) -> Step:
        """The next step, given the client's Authentication Data (None when it sent none)."""
        ...


class AuthMethod(Protocol):
    """An authentication method the edge offers, by its Authentication Method name."""

    @property
    def name(self) -> str: ...

    def exchange(self, *, client_id: str, peer: str) -> AuthExchange:
        """A new exchange, for the client `client_id` connected from `peer` (HOST:PORT)."""
        ...


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What an edge hands a method's factory: its node id and its password file (if any)."""

    node_id: str
    passwords: PasswordFile | None
    # --scram-from-pbkdf2: the built-in SCRAM-SHA-512 also takes $7$ entries (insecure).
    scram_from_pbkdf2: bool = False


MethodFactory = Callable[[PluginContext], AuthMethod]


class AuthMethods:
    """The methods one edge offers, by name (empty: every Authentication Method gets 0x8C)."""

    def __init__(self, methods: Iterable[AuthMethod] = ()) -> None:
        self._by_name: dict[str, AuthMethod] = {}
        for method in methods:
            self.add(method)

    def add(self, method: AuthMethod) -> None:
        name = method.name
        if not isinstance(name, str) or not name:
            raise ValueError(f"authentication method {method!r} has no name")
        if name in self._by_name:
            raise ValueError(f"authentication method {name!r} is configured twice")
        self._by_name[name] = method

    def get(self, name: str) -> AuthMethod | None:
        return self._by_name.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._by_name)

    def why_refused(self, name: str) -> str:
        """The Reason String for a CONNECT naming a method this edge does not offer."""
        if not self._by_name:
            return "no authentication method is configured"
        return f"authentication method {name!r} is not offered (offered: {', '.join(self.names)})"

    @classmethod
    def build(
        cls,
        builtin: Mapping[str, MethodFactory],
        names: Iterable[str],
        plugins: Iterable[str],
        context: PluginContext,
    ) -> AuthMethods:
        """The built-in methods `names` and the plugins `plugins` (MODULE:FACTORY each);
        ValueError saying which one is wrong and why."""
        methods = cls()
        for name in names:
            factory = builtin.get(name)
            if factory is None:
                raise ValueError(
                    f"unknown authentication method {name!r} (built in: {', '.join(builtin)})"
                )
            methods.add(factory(context))
        for spec in plugins:
            methods.add(load_plugin(spec, context))
        return methods


def load_plugin(spec: str, context: PluginContext) -> AuthMethod:
    """Import MODULE, call FACTORY(context) and check that it made a method; ValueError
    naming the plugin otherwise."""
    module_name, sep, attr = spec.partition(":")
    where = f"--auth-plugin {spec}"
    if not sep or not module_name or not attr:
        raise ValueError(f"{where}: expected MODULE:FACTORY, e.g. mycompany.mqtt_auth:make")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{where}: cannot import {module_name}: {exc}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{where}: {module_name} has no callable {attr}")
    try:
        method = factory(context)
    except Exception as exc:  # the plugin's own error, reported at startup
        raise ValueError(f"{where}: {attr}() failed: {exc!r}") from exc
    name = getattr(method, "name", None)
    if not isinstance(name, str) or not name or not callable(getattr(method, "exchange", None)):
        raise ValueError(
            f"{where}: {attr}() must return an object with a `name` (str) and an "
            f"`exchange(client_id=, peer=)` method, not {method!r}"
        )
    return cast("AuthMethod", method)


class ConnectionAuth:
    """One connection's enhanced authentication: the exchange started by CONNECT, then any
    re-authentication (4.12.1). It checks the AUTH packets the client sends against the
    protocol and the method's answers against the interface, so a faulty plugin cannot make
    the edge send what MQTT forbids."""

    __slots__ = ("_exchange", "client_id", "method", "name", "peer", "username")

    def __init__(self, method: AuthMethod, *, client_id: str, peer: str) -> None:
        self.method = method
        self.name = method.name
        self.client_id = client_id
        self.peer = peer
        # Who the client is once an exchange has succeeded.
        self.username: str | None = None
        self._exchange: AuthExchange | None = None

    @property
    def in_progress(self) -> bool:
        return self._exchange is not None

    def start(self, data: bytes | None) -> Step:
        """The first step of the exchange in CONNECT."""
        self._exchange = self.method.exchange(client_id=self.client_id, peer=self.peer)
        return self._step(data)

    def receive(self, packet: Auth, *, connected: bool) -> Step:
        """The step for an AUTH from the client; ProtocolError (0x82) for an AUTH that breaks
        the exchange's rules. `connected`: the CONNACK has been sent."""
        method = packet.properties.authentication_method
        if method != self.name:
            # [MQTT-4.12.0-5], [MQTT-4.12.1-1]: every AUTH names the method of the CONNECT.
            raise ProtocolError(
                f"AUTH with Authentication Method {method!r}, not {self.name!r} as in CONNECT "
                "[MQTT-4.12.0-5]"
            )
        code = packet.reason_code
        if self._exchange is None:
            if not connected or code != RC.RE_AUTHENTICATE:
                raise ProtocolError(
                    f"AUTH 0x{code:02X} outside an exchange (a client starts one with 0x19 "
                    "after CONNACK) [MQTT-4.12.1-1]"
                )
            self._exchange = self.method.exchange(client_id=self.client_id, peer=self.peer)
        elif code != RC.CONTINUE_AUTHENTICATION:
            raise ProtocolError(
                f"AUTH 0x{code:02X} during an exchange (a client answers with 0x18) [MQTT-4.12.0-3]"
            )
        return self._step(packet.properties.authentication_data)

    def _step(self, data: bytes | None) -> Step:
        exchange = self._exchange
        assert exchange is not None
        try:
            step = exchange.step(data)
        except Exception:
            log.exception(
                "%s (%s): authentication method %s failed", self.peer, self.client_id, self.name
            )
            step = Failure(RC.UNSPECIFIED_ERROR, "authentication failed (server error)")
        step = self._checked(step)
        if not isinstance(step, Continue):
            self._exchange = None
        if isinstance(step, Success):
            self.username = step.username
        elif isinstance(step, Failure) and step.log:
            log.warning(
                "%s (%s): %s authentication failed: %s",
                self.peer,
                self.client_id,
                self.name,
                step.log,
            )
        return step

    def _checked(self, step: object) -> Step:
        """`step` if the method kept to the interface, else a Failure saying what it did."""
        if isinstance(step, Continue):
            if isinstance(step.data, bytes):
                return step
            problem = "Continue.data is not bytes"
        elif isinstance(step, Success):
            if not isinstance(step.username, str) or not step.username:
                problem = "Success without a user name"
            elif step.data is not None and not isinstance(step.data, bytes):
                problem = "Success.data is not bytes"
            elif self.username is not None and step.username != self.username:
                # A re-authentication proves the same identity again; it does not switch
                # users under a live session (its ACL and subscriptions were granted to one).
                return Failure(
                    RC.NOT_AUTHORIZED,
                    "re-authenticated as another user",
                    f"re-authenticated as {step.username!r}, connected as {self.username!r}",
                )
            else:
                return step
        elif isinstance(step, Failure):
            if not isinstance(step.reason, str) or (
                step.data is not None and not isinstance(step.data, bytes)
            ):
                problem = "Failure.reason is not a str or Failure.data not bytes"
            elif step.reason_code in FAILURE_CODES:
                return step
            else:
                log.error(
                    "authentication method %s: Failure with reason code %r, which is not a "
                    "failing CONNACK/DISCONNECT code; sending 0x87",
                    self.name,
                    step.reason_code,
                )
                return Failure(RC.NOT_AUTHORIZED, step.reason, step.log, step.data)
        else:
            problem = f"step returned {step!r}"
        log.error("authentication method %s broke its interface: %s", self.name, problem)
        return Failure(RC.UNSPECIFIED_ERROR, "authentication failed (server error)")
