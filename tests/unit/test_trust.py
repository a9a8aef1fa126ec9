"""hexmq.trust: identities, the CA and its certificates, what each RPC admits, and TLS settings
that follow renewed files (docs/security.md)."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hexmq.health import SERVING, add_health
from hexmq.trust import certs
from hexmq.trust.grpc_tls import (
    ClusterTLS,
    PeerRefused,
    TLSConfigError,
    TLSFiles,
    add_cluster_tls_arguments,
)
from hexmq.trust.guard import refusal
from hexmq.trust.identity import (
    EDGE,
    MEMBERSHIP,
    OPERATOR,
    PARTITION,
    Identity,
    IdentityError,
    from_auth_context,
    from_sans,
    parse_uri,
)

# --- identities -----------------------------------------------------------------------------


def test_an_identity_is_a_spiffe_uri_of_role_and_node() -> None:
    edge = Identity(EDGE, "n2")
    assert edge.uri() == "spiffe://hexmq/edge/n2"
    assert parse_uri("spiffe://hexmq/edge/n2") == edge
    assert parse_uri("spiffe://prod/partition/n1", "prod") == Identity(PARTITION, "n1")


@pytest.mark.parametrize(
    "uri",
    [
        "spiffe://other/edge/n2",  # another trust domain
        "spiffe://hexmq/edge",  # no node
        "spiffe://hexmq/edge/n2/x",  # too deep
        "spiffe://hexmq/root/n2",  # no such role
        "spiffe://hexmq/edge/n 2",  # not a node id
        "https://hexmq/edge/n2",
    ],
)
def test_what_is_not_an_identity_of_the_cluster_is_refused(uri: str) -> None:
    with pytest.raises(IdentityError):
        parse_uri(uri)


def test_a_certificate_naming_two_identities_names_none() -> None:
    one, two = "spiffe://hexmq/edge/n1", "spiffe://hexmq/edge/n2"
    assert from_sans([one, "spiffe://elsewhere/edge/n2"]) == Identity(EDGE, "n1")
    assert from_sans([one, two]) is None
    assert from_sans([]) is None


def test_a_plain_text_caller_has_no_identity() -> None:
    assert from_auth_context({}) is None
    assert from_auth_context({"transport_security_type": [b"insecure"]}) is None
    auth = {
        "transport_security_type": [b"ssl"],
        "x509_subject_alternative_name": [b"edge.n1.hexmq", b"spiffe://hexmq/edge/n1"],
    }
    assert from_auth_context(auth) == Identity(EDGE, "n1")


# --- what each call admits ---------------------------------------------------------------------


def test_refusals_say_why() -> None:
    edge_n2 = Identity(EDGE, "n2")
    assert refusal(edge_n2, roles={EDGE}) is None
    assert refusal(edge_n2, roles={EDGE}, claimed="n2") is None
    assert "claims to be 'n1'" in str(refusal(edge_n2, roles={EDGE}, claimed="n1"))
    assert "may not make this call" in str(refusal(edge_n2, roles={PARTITION}))
    assert "names no identity" in str(refusal(None, roles={EDGE}))
    partition_n2 = Identity(PARTITION, "n2")
    assert "only node n3 itself" in str(refusal(partition_n2, roles={PARTITION}, node="n3"))
    assert refusal(Identity(PARTITION, "n3"), roles={PARTITION}, node="n3") is None
    assert "not a member" in str(refusal(partition_n2, roles={PARTITION}, members={"n1"}))
    # An operator may do what it is admitted to on any node, but only that.
    operator = Identity(OPERATOR, "alice")
    assert refusal(operator, roles={PARTITION, OPERATOR}, node="n3") is None
    assert refusal(operator, roles={PARTITION}, node="n3") is not None


# --- certificates ------------------------------------------------------------------------------


def test_issued_certificates_name_the_identity_and_keys_are_private(tmp_path: Path) -> None:
    certs.make_ca(tmp_path)
    files = certs.issue(tmp_path, Identity(PARTITION, "n1"), ip_addresses=["127.0.0.2"])
    info = certs.describe(files.cert)
    assert info.identity == Identity(PARTITION, "n1")
    assert info.dns_names == ["partition.n1.hexmq", "partition.hexmq"]
    assert files == certs.identity_files(tmp_path, Identity(PARTITION, "n1"))
    for key in (files.key, tmp_path / "ca.key"):
        assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    operator = certs.issue(tmp_path, Identity(OPERATOR, "alice"))
    assert operator.cert == tmp_path / "operator" / "alice.crt"


def test_a_ca_is_never_replaced(tmp_path: Path) -> None:
    certs.make_ca(tmp_path)
    with pytest.raises(certs.CertError, match="never replaced"):
        certs.make_ca(tmp_path)


def test_a_request_for_an_operators_own_ca_asks_for_the_same_names(tmp_path: Path) -> None:
    from cryptography import x509

    key, csr_path = certs.request(Identity(EDGE, "e7"), tmp_path)
    csr = x509.load_pem_x509_csr(csr_path.read_bytes())
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == ["spiffe://hexmq/edge/e7"]
    assert "edge.e7.hexmq" in san.get_values_for_type(x509.DNSName)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600


# --- a process's settings -----------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_cluster_tls_arguments(parser)
    return parser.parse_args(list(argv))


def _files_args(files: TLSFiles, *more: str) -> argparse.Namespace:
    return _args(
        *("--cluster-ca", str(files.ca), "--cluster-cert", str(files.cert)),
        *("--cluster-key", str(files.key), *more),
    )


@pytest.fixture
def n1_partition(tmp_path: Path) -> TLSFiles:
    certs.make_ca(tmp_path)
    pair = certs.issue(tmp_path, Identity(PARTITION, "n1"))
    return TLSFiles(tmp_path / "ca.crt", pair.cert, pair.key)


def test_tls_is_the_default_and_needs_the_files() -> None:
    with pytest.raises(
        TLSConfigError, match="needs --cluster-ca, --cluster-cert and --cluster-key"
    ):
        ClusterTLS.from_args(_args(), Identity(PARTITION, "n1"))
    with pytest.raises(TLSConfigError, match="go together"):
        ClusterTLS.from_args(_args("--cluster-ca", "/x"), Identity(PARTITION, "n1"))


def test_a_process_never_starts_as_somebody_else(n1_partition: TLSFiles) -> None:
    assert ClusterTLS.from_args(_files_args(n1_partition), Identity(PARTITION, "n1")).serve_tls
    with pytest.raises(TLSConfigError, match="names partition n1, but this process is edge n1"):
        ClusterTLS.from_args(_files_args(n1_partition), Identity(EDGE, "n1"))
    with pytest.raises(TLSConfigError, match="no identity of trust domain 'prod'"):
        ClusterTLS.from_args(
            _files_args(n1_partition, "--cluster-trust-domain", "prod"), Identity(PARTITION, "n1")
        )


def test_who_is_dialled_how(n1_partition: TLSFiles) -> None:
    me = Identity(PARTITION, "n1")
    strict = ClusterTLS.from_args(_files_args(n1_partition), me)
    assert strict.dials_tls(True)
    with pytest.raises(PeerRefused, match="serves plain text"):
        strict.dials_tls(False)
    switching = ClusterTLS.from_args(_files_args(n1_partition, "--cluster-plaintext-peers"), me)
    assert (switching.dials_tls(True), switching.dials_tls(False)) == (True, False)
    plain_with_certs = ClusterTLS.from_args(_files_args(n1_partition, "--insecure-cluster"), me)
    assert not plain_with_certs.serve_tls
    assert (plain_with_certs.dials_tls(True), plain_with_certs.dials_tls(False)) == (True, False)
    plain = ClusterTLS.from_args(_args("--insecure-cluster"), me)
    assert not plain.dials_tls(False)
    with pytest.raises(PeerRefused, match="no cluster certificate"):
        plain.dials_tls(True)
    with pytest.raises(TLSConfigError):
        ClusterTLS.from_args(_args("--insecure-cluster", "--cluster-plaintext-peers"), me)


# --- renewal without a restart ------------------------------------------------------------------


async def test_a_server_takes_a_renewed_certificate_without_a_restart(tmp_path: Path) -> None:
    """The partition service's certificate is renewed by a new CA (a CA rotation: the server
    trusts both meanwhile): a client that trusts only the new CA gets in once the files are
    replaced, with no restart; before, it could not."""
    old_ca, new_ca = tmp_path / "old", tmp_path / "new"
    certs.make_ca(old_ca)
    certs.make_ca(new_ca)
    server_id, client_id = Identity(PARTITION, "n1"), Identity(EDGE, "n2")
    live = TLSFiles(tmp_path / "ca.crt", tmp_path / "partition.crt", tmp_path / "partition.key")
    certs.issue(old_ca, server_id, out=certs.CertFiles(live.cert, live.key))
    live.ca.write_bytes((old_ca / "ca.crt").read_bytes())
    server_tls = ClusterTLS(server_id, live)
    server = grpc.aio.server()
    health = add_health(server)
    port = server_tls.add_port(server, "127.0.0.1:0")
    await server.start()
    await health.set("", SERVING)

    client_pair = certs.issue(new_ca, client_id)
    client = ClusterTLS(client_id, TLSFiles(new_ca / "ca.crt", client_pair.cert, client_pair.key))

    async def check() -> bool:
        async with client.channel(f"127.0.0.1:{port}", peer=server_id) as channel:
            try:
                await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=3
                )
            except grpc.aio.AioRpcError:
                return False
            return True

    try:
        assert not await check()
        # Renew: a certificate of the new CA, and both CAs trusted while the cluster moves.
        certs.issue(new_ca, server_id, out=certs.CertFiles(live.cert, live.key))
        live.ca.write_bytes((old_ca / "ca.crt").read_bytes() + (new_ca / "ca.crt").read_bytes())
        assert await check()
    finally:
        await server.stop(None)


def test_a_client_presents_renewed_files_from_its_next_channel(n1_partition: TLSFiles) -> None:
    tls = ClusterTLS(Identity(PARTITION, "n1"), n1_partition)
    first, generation = tls.channel_credentials(), tls.generation()
    assert tls.channel_credentials() is first  # unchanged files: the same credentials
    certs.issue(n1_partition.ca.parent, Identity(PARTITION, "n1"))
    assert tls.generation() > generation
    assert tls.channel_credentials() is not first


# --- hexmq certs -------------------------------------------------------------------------------


def test_hexmq_certs_cluster_makes_what_every_service_starts_with(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hexmq_cli.cli import main

    assert main(["certs", "cluster", "--dir", str(tmp_path), "--nodes", "n1,n2"]) == 0
    for node in ("n1", "n2"):
        for role in (EDGE, PARTITION, MEMBERSHIP):
            pair = certs.identity_files(tmp_path, Identity(role, node))
            files = TLSFiles(tmp_path / "ca.crt", pair.cert, pair.key)
            tls = ClusterTLS.from_args(_files_args(files), Identity(role, node))
            assert tls.serve_tls
    assert certs.describe(tmp_path / "operator" / "admin.crt").identity == Identity(
        OPERATOR, "admin"
    )
    # Run again: the CA and every certificate are kept, not replaced.
    before = (tmp_path / "n1" / "edge.crt").read_bytes()
    assert main(["certs", "cluster", "--dir", str(tmp_path), "--nodes", "n1,n2,n3"]) == 0
    assert (tmp_path / "n1" / "edge.crt").read_bytes() == before
    assert (tmp_path / "n3" / "membership.crt").exists()
    assert "edge n1: " in capsys.readouterr().out
    assert main(["certs", "ca", "--dir", str(tmp_path)]) == 1
    assert "never replaced" in capsys.readouterr().err
