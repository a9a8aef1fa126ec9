"""The `hexmq consul-dev` process: its state across a restart with --data-dir, signals, its
options, the answers it gives where Consul's own would be an accident (malformed input), HTTPS
(certificates made by hexmq.trust.certs) and its management token file (tests/consul/test_acl.py
has the token rules)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import consul
import pytest
from consul import Check

from hexmq.trust.certs import CertFiles, issue_server, make_ca
from services.membership.consul_client import make_consul
from services.membership.token_file import TokenFile
from tests.support.consuldev import HEXMQ, ConsulDev, start_consul_dev, write_token_file

StartConsulDev = Callable[..., ConsulDev]


@pytest.fixture
def consul_dev(tmp_path: Path) -> Iterator[StartConsulDev]:
    """Start `hexmq consul-dev` processes; any still running at the end is stopped (by pid)."""
    started: list[ConsulDev] = []

    def start(*args: str, listen: str = "127.0.0.1:0") -> ConsulDev:
        server = start_consul_dev(tmp_path / f"consul-dev-{len(started)}.log", *args, listen=listen)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()  # a no-op for one the test stopped


async def test_a_restart_with_its_data_dir_keeps_kv_indexes_and_sessions(
    tmp_path: Path, consul_dev: StartConsulDev
) -> None:
    data = tmp_path / "data"
    server = consul_dev("--data-dir", str(data))
    client = make_consul(server.addr)
    try:
        holder = await client.session.create(name="agent-n1", ttl=600, behavior="delete")
        await client.kv.put("hexmq/c1/members/n1", b"n1", acquire=holder)
        await client.kv.put("hexmq/c1/view", b"epoch 7", flags=3)
        await client.kv.put("hexmq/c1/old", b"x")
        await client.kv.delete("hexmq/c1/old")
        index_before, entries_before = await client.kv.get("hexmq/c1/", recurse=True)
        _, view_before = await client.kv.get("hexmq/c1/view")
    finally:
        await client.close()
    assert server.stop(signal.SIGTERM) == 0

    again = consul_dev("--data-dir", str(data), listen=f"127.0.0.1:{server.port}")
    client = make_consul(again.addr)
    try:
        index_after, entries_after = await client.kv.get("hexmq/c1/", recurse=True)
        assert entries_after == entries_before  # values, flags, indexes, lock holder
        assert int(index_after) == int(index_before)
        _, info = await client.session.info(holder)
        assert (info["Name"], info["Behavior"], info["TTL"]) == ("agent-n1", "delete", "600s")
        await client.kv.put("hexmq/c1/view", b"epoch 8", cas=view_before["ModifyIndex"])
        _, view_after = await client.kv.get("hexmq/c1/view")
        assert view_after["ModifyIndex"] > int(index_before)  # indexes never go backwards
        await client.session.destroy(holder)
        assert (await client.kv.get("hexmq/c1/members/n1"))[1] is None
    finally:
        await client.close()
    assert again.stop(signal.SIGINT) == 0
    assert "loaded" in again.log_text()


async def test_blocked_queries_answer_at_shutdown_and_it_exits_0(
    consul_dev: StartConsulDev,
) -> None:
    server = consul_dev()
    client = make_consul(server.addr)
    try:
        index, _ = await client.kv.get("k")
        watcher = asyncio.create_task(client.kv.get("k", index=index, wait="60s"))
        await asyncio.sleep(0.3)
        stopped_at = time.monotonic()
        code = await asyncio.to_thread(server.stop, signal.SIGTERM)
        assert code == 0
        assert time.monotonic() - stopped_at < 5
        _, entry = await asyncio.wait_for(watcher, 5)
        assert entry is None
    finally:
        await client.close()


def test_a_bad_listen_address_names_the_option() -> None:
    done = subprocess.run(
        [str(HEXMQ), "consul-dev", "--listen", "nowhere"], capture_output=True, timeout=30
    )
    assert done.returncode == 2
    assert b"--listen must be HOST:PORT" in done.stderr
    assert b"'nowhere'" in done.stderr


def test_an_address_in_use_exits_1(consul_dev: StartConsulDev) -> None:
    server = consul_dev()
    try:
        done = subprocess.run(
            [str(HEXMQ), "consul-dev", "--listen", server.addr], capture_output=True, timeout=30
        )
        assert done.returncode == 1
        assert f"cannot listen on {server.addr}".encode() in done.stderr
    finally:
        assert server.stop() == 0


def test_a_data_dir_in_use_or_of_another_node_is_refused(
    tmp_path: Path, consul_dev: StartConsulDev
) -> None:
    data = tmp_path / "data"
    server = consul_dev("--data-dir", str(data))
    try:
        done = subprocess.run(
            [str(HEXMQ), "consul-dev", "--listen", "127.0.0.1:0", "--data-dir", str(data)],
            capture_output=True,
            timeout=30,
        )
        assert done.returncode == 2
        assert b"is in use by another hexmq consul-dev" in done.stderr
    finally:
        assert server.stop() == 0
    other_node = ["--node-name", "other"]
    done = subprocess.run(
        [str(HEXMQ), "consul-dev", "--listen", "127.0.0.1:0", "--data-dir", str(data), *other_node],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert b"holds the state of node 'hexmq-consul-dev', not 'other'" in done.stderr


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsulDev]:
    server = start_consul_dev(tmp_path_factory.mktemp("consul-dev") / "consul-dev.log")
    try:
        yield server
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize(
    ("method", "path", "body", "text"),
    [
        ("PUT", "/v1/kv/k?cas=abc", b"", "Invalid cas: expected a whole number"),
        ("PUT", "/v1/kv/k?flags=-1", b"", "Invalid flags: expected a whole number"),
        ("GET", "/v1/kv/k?index=soon", b"", "Invalid index"),
        ("GET", "/v1/kv/k?index=1&wait=forever", b"", "Invalid wait time"),
        ("PUT", "/v1/kv/a:b", b"", "key contains invalid character ':' at position 1"),
        ("PUT", "/v1/session/create", b"{not json", "Request decode failed"),
        ("PUT", "/v1/agent/service/register", b'{"Name": "x", "Port": "80"}', "Port must be"),
        ("GET", "/v1/health/service/x?passing=maybe", b"", "Invalid value for ?passing"),
    ],
)
async def test_malformed_requests_are_a_400_saying_what_is_wrong(
    shared_server: ConsulDev, method: str, path: str, body: bytes, text: str
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, f"http://{shared_server.addr}{path}", data=body) as resp,
    ):
        assert resp.status == 400
        assert text in await resp.text()


async def test_each_invalidation_and_critical_check_is_one_info_line(
    consul_dev: StartConsulDev,
) -> None:
    server = consul_dev()
    client = make_consul(server.addr)
    try:
        await client.agent.service.register("web", service_id="web-1", check=Check.ttl("30s"))
        await client.agent.check.ttl_pass("service:web-1")
        bound = await client.session.create(name="bound", checks=["service:web-1"])
        await client.kv.put("leader", b"web-1", acquire=bound)
        await client.agent.check.ttl_fail("service:web-1", "stopped")
        other = await client.session.create(name="other")
        await client.session.destroy(other)
    finally:
        await client.close()
    assert server.stop() == 0
    lines = [line for line in server.log_text().splitlines() if " INFO " in line]
    critical = [line for line in lines if "consul_dev: check " in line]
    invalidated = [line for line in lines if "invalidated" in line]
    assert len(critical) == 1
    assert "check service:web-1 of service web-1 is critical: stopped" in critical[0]
    assert len(invalidated) == 2
    assert (
        f"session {bound} (bound) invalidated: check service:web-1 is critical" in (invalidated[0])
    )
    assert "released 1 key(s) (leader)" in invalidated[0]
    assert f"session {other} (other) invalidated: destroyed" in invalidated[1]


async def test_a_change_it_cannot_persist_is_a_500_and_it_exits_1(
    tmp_path: Path, consul_dev: StartConsulDev
) -> None:
    data = tmp_path / "data"
    server = consul_dev("--data-dir", str(data))
    (data / "state.json.tmp").mkdir()  # the next atomic write cannot create its temporary file
    async with (
        aiohttp.ClientSession() as http,
        http.put(f"http://{server.addr}/v1/kv/k", data=b"v") as resp,
    ):
        assert resp.status == 500
        assert "failed to persist the state" in await resp.text()
    assert await asyncio.to_thread(server.proc.wait, 10) == 1
    assert "cannot persist the state" in server.log_text()


def test_the_command_is_registered_with_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    from hexmq_cli import cli

    assert cli.main(["consul-dev", "--help"]) == 0
    out = capsys.readouterr().out
    for option in (
        *("--listen", "--data-dir", "--node-name", "--log-level", "--acl-token-file"),
        *("--https-cert", "--https-key", "--https-ca", "--https-verify-incoming"),
    ):
        assert option in out


# --- HTTPS and ACL tokens ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA certificate that signed the server's and the client's
    server: CertFiles  # for 127.0.0.1 and localhost
    client: CertFiles
    other_ca: Path  # a CA that signed neither


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = make_ca(d / "ca")
    server = issue_server(
        d / "ca",
        "consul-dev",
        CertFiles(d / "server.crt", d / "server.key"),
        dns_names=["localhost"],
        ip_addresses=["127.0.0.1"],
    )
    client = issue_server(
        d / "ca", "agent", CertFiles(d / "client.crt", d / "client.key"), dns_names=["agent"]
    )
    return Pki(ca.cert, server, client, make_ca(d / "other").cert)


def tls_args(pki: Pki) -> tuple[str, ...]:
    return ("--https-cert", str(pki.server.cert), "--https-key", str(pki.server.key))


async def test_it_serves_https_that_a_client_trusting_its_ca_verifies(
    consul_dev: StartConsulDev, pki: Pki
) -> None:
    server = consul_dev(*tls_args(pki))
    assert server.addr == f"https://127.0.0.1:{server.port}"
    client = make_consul(server.addr, ca=pki.ca)
    try:
        assert await client.kv.put("hexmq/c1/view", b"epoch 1")
        assert (await client.kv.get("hexmq/c1/view"))[1]["Value"] == b"epoch 1"
    finally:
        await client.close()
    # Without that CA (the system's only, or another one) the certificate is refused...
    for untrusting in (make_consul(server.addr), make_consul(server.addr, ca=pki.other_ca)):
        try:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await untrusting.kv.get("hexmq/c1/view")
        finally:
            await untrusting.close()
    # ... and plain HTTP to the HTTPS port gets no answer.
    plain = make_consul(f"http://127.0.0.1:{server.port}")
    try:
        with pytest.raises(aiohttp.ClientError):
            await plain.kv.get("hexmq/c1/view")
    finally:
        await plain.close()
    assert server.stop() == 0
    assert "serving the Consul HTTP API on https://" in server.log_text()


async def test_verify_incoming_refuses_clients_without_a_certificate_of_its_ca(
    consul_dev: StartConsulDev, pki: Pki
) -> None:
    server = consul_dev(*tls_args(pki), "--https-ca", str(pki.ca), "--https-verify-incoming")
    with_cert = make_consul(server.addr, ca=pki.ca, cert=pki.client.cert, key=pki.client.key)
    try:
        assert await with_cert.kv.put("k", b"v")
    finally:
        await with_cert.close()
    without = make_consul(server.addr, ca=pki.ca)
    try:
        with pytest.raises(aiohttp.ClientError):
            await without.kv.get("k")
    finally:
        await without.close()


async def test_a_token_rotated_in_the_file_is_taken_from_the_next_request_on(
    consul_dev: StartConsulDev, tmp_path: Path
) -> None:
    path = tmp_path / "management.token"
    old = write_token_file(path)
    server = consul_dev("--acl-token-file", str(path))
    old_client = make_consul(server.addr, token=old)
    # The membership agent's way: the token read from the file (again when it changes).
    following = make_consul(server.addr, token=TokenFile(path, "--consul-token-file").current)
    try:
        assert await old_client.kv.put("k", b"1")
        assert await following.kv.put("k", b"2")
        new = write_token_file(path)
        with pytest.raises(consul.ACLPermissionDenied, match=r"^ACL not found$"):
            await old_client.kv.get("k")
        assert (await following.kv.get("k"))[1]["Value"] == b"2"
        new_client = make_consul(server.addr, token=new)
        try:
            assert await new_client.kv.put("k", b"3")
        finally:
            await new_client.close()
    finally:
        await old_client.close()
        await following.close()
    assert server.stop() == 0
    log = server.log_text()
    assert "ACLs enabled, default policy deny" in log
    assert old not in log  # tokens are never logged
    assert new not in log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--acl-token-file", "{missing}"), "--acl-token-file {missing}: cannot read it"),
        (("--acl-token-file", "{empty}"), "--acl-token-file {empty} is empty"),
        (("--acl-token-file", "{anonymous}"), "'anonymous' is Consul's anonymous token"),
        (("--https-cert", "{cert}"), "--https-cert and --https-key go together"),
        (
            ("--https-cert", "{missing}", "--https-key", "{key}"),
            "cannot read --https-cert {missing}",
        ),
        (
            ("--https-cert", "{cert}", "--https-key", "{other_key}"),
            "does not match the certificate",
        ),
        (("--https-cert", "{key}", "--https-key", "{key}"), "holds no usable PEM certificate"),
        (("--https-ca", "{ca}"), "need --https-cert and --https-key"),
        (
            ("--https-cert", "{cert}", "--https-key", "{key}", "--https-verify-incoming"),
            "needs --https-ca",
        ),
    ],
)
def test_unusable_token_and_tls_files_stop_it_at_start_naming_the_option(
    tmp_path: Path, pki: Pki, args: tuple[str, ...], message: str
) -> None:
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "anonymous").write_text("anonymous\n")
    names = {
        "missing": str(tmp_path / "missing"),
        "empty": str(tmp_path / "empty"),
        "anonymous": str(tmp_path / "anonymous"),
        "cert": str(pki.server.cert),
        "key": str(pki.server.key),
        "other_key": str(pki.client.key),
        "ca": str(pki.ca),
    }
    argv = [arg.format(**names) for arg in args]
    done = subprocess.run(
        [str(HEXMQ), "consul-dev", "--listen", "127.0.0.1:0", *argv],
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 2, done.stderr
    assert message.format(**names).encode() in done.stderr
