"""The Consul API suite: what the membership agents rely on, spoken through py-consul's asyncio
client (`make_consul`) to

- the Consul at CONSUL_HTTP_ADDR when that variable is set: a real Consul, against which
  every test here must pass unchanged. Start it with ACLs enabled and default policy deny, and
  give the suite a management token in CONSUL_HTTP_TOKEN:

      $ cat acl.hcl
      acl {
        enabled        = true
        default_policy = "deny"
        tokens {
          initial_management = "<a uuid>"
        }
      }
      $ consul agent -dev -config-file acl.hcl &
      $ CONSUL_HTTP_ADDR=127.0.0.1:8500 CONSUL_HTTP_TOKEN=<that uuid> pytest tests/consul

  (without CONSUL_HTTP_TOKEN the ACL tests, test_acl.py, are skipped);
- otherwise a `hexmq consul-dev` that this package starts on a free loopback port, with ACLs
  enabled (`--acl-token-file`, a token made for the run), and stops by pid when the last test
  is done.

Every client of the suite sends the management token (`consul_token`), so each test also
proves that the token is taken; test_acl.py has the rules for requests without it.

Each test works under its own key prefix, session and service names (`scratch`), and removes
what it made, so a run against a shared Consul cleans up after itself.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from typing import Any

import consul.aio
import pytest
from consul import Check

from services.membership.consul_client import make_consul
from tests.support.consuldev import start_consul_dev, write_token_file
from tests.support.unique import uid


@pytest.fixture(scope="session")
def consul_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str | None]]:
    """(the address, the management token): CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN (None when
    unset), or a consul-dev with ACLs started for the session and its token."""
    real = os.environ.get("CONSUL_HTTP_ADDR")
    if real:
        yield real, os.environ.get("CONSUL_HTTP_TOKEN") or None
        return
    base = tmp_path_factory.mktemp("consul-dev")
    token = write_token_file(base / "management.token")
    server = start_consul_dev(
        base / "consul-dev.log", "--acl-token-file", str(base / "management.token")
    )
    try:
        yield server.addr, token
    finally:
        assert server.stop() == 0, server.log_text()


@pytest.fixture(scope="session")
def consul_addr(consul_server: tuple[str, str | None]) -> str:
    return consul_server[0]


@pytest.fixture(scope="session")
def consul_token(consul_server: tuple[str, str | None]) -> str | None:
    """The management token every client of the suite sends (None: a real Consul without
    CONSUL_HTTP_TOKEN, taken to have no ACLs)."""
    return consul_server[1]


@pytest.fixture
async def consul_client(
    consul_addr: str, consul_token: str | None
) -> AsyncIterator[consul.aio.Consul]:
    client = make_consul(consul_addr, token=consul_token)
    try:
        yield client
    finally:
        await client.close()


class Scratch:
    """Names owned by one test, and their removal."""

    def __init__(self, client: consul.aio.Consul) -> None:
        self.client = client
        self.tag = uid()
        self.prefix = f"hexmq-test/{self.tag}/"
        self._sessions: list[str] = []
        self._services: list[str] = []

    def key(self, name: str) -> str:
        return self.prefix + name

    async def session(self, **kw: Any) -> str:
        session_id: str = await self.client.session.create(name=f"hexmq-test-{self.tag}", **kw)
        self._sessions.append(session_id)
        return session_id

    async def ttl_service(self, name: str, ttl: str = "10s") -> tuple[str, str]:
        """A service with one TTL check (critical until its first pass): (service, check)."""
        service = f"hexmq-test-{self.tag}-{name}"
        assert await self.client.agent.service.register(
            service, service_id=service, port=1, tags=["hexmq-test"], check=Check.ttl(ttl)
        )
        self._services.append(service)
        return service, f"service:{service}"

    async def cleanup(self) -> None:
        for session_id in self._sessions:
            await self.client.session.destroy(session_id)
        for service in self._services:
            await self.client.agent.service.deregister(service)  # False if already gone
        await self.client.kv.delete(self.prefix, recurse=True)


@pytest.fixture
async def scratch(consul_client: consul.aio.Consul) -> AsyncIterator[Scratch]:
    space = Scratch(consul_client)
    try:
        yield space
    finally:
        await space.cleanup()
