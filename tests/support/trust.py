"""Certificates for the processes tests start themselves, so that they run as deployed: with
mutual TLS on every cluster link (docs/security.md).

- Beside a `hexmq cluster` (an extra edge, a tool): `cluster_env(cluster_dir, role, node)` issues
  a certificate from that cluster's own CA (DIR/tls) and returns the HEXMQ_CLUSTER_* variables
  that give it to a process; `cluster_tls(...)` is the same identity for the test's own calls.
- Alone (membership agents with stand-in partition services, tests/support/agent_cluster.py):
  `own_ca()` is a CA made once per test process, used the same way.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import grpc
import redis

from hexmq.redis_security import OPERATOR_USER
from hexmq.trust import certs
from hexmq.trust.grpc_tls import ClusterTLS, TLSFiles
from hexmq.trust.identity import OPERATOR, Identity
from hexmq_cli.clusterstate import REDIS_OPERATOR_FILE

_OWN_CA: Path | None = None


def own_ca() -> Path:
    """A CA directory for this test process's own clusters (made on first use, removed at
    exit)."""
    global _OWN_CA
    if _OWN_CA is None:
        directory = Path(tempfile.mkdtemp(prefix="hexmq-test-ca-"))
        atexit.register(shutil.rmtree, directory, ignore_errors=True)
        certs.make_ca(directory, name="hexmq test CA")
        _OWN_CA = directory
    return _OWN_CA


def cluster_ca(cluster_dir: Path) -> Path:
    """The CA directory of a `hexmq cluster` in `cluster_dir`."""
    return cluster_dir / "tls"


# Threads that make their first call at once (the fault suite polls every node in parallel)
# would each issue the pair, and one could end with another's key beside its certificate.
_ISSUING = threading.Lock()


def files_for(ca_dir: Path, role: str, node: str) -> TLSFiles:
    """The CA, certificate and key of (role, node) under `ca_dir`, issued on first use."""
    identity = Identity(role, node)
    pair = certs.identity_files(ca_dir, identity)
    with _ISSUING:
        if not pair.cert.exists():
            certs.issue(ca_dir, identity, ip_addresses=["127.0.0.1"])
    return TLSFiles(ca_dir / certs.CA_CERT, pair.cert, pair.key)


def env_for(ca_dir: Path, role: str, node: str) -> dict[str, str]:
    """HEXMQ_CLUSTER_CA/CERT/KEY for a process that is (role, node) of `ca_dir`'s cluster."""
    files = files_for(ca_dir, role, node)
    return {
        "HEXMQ_CLUSTER_CA": str(files.ca),
        "HEXMQ_CLUSTER_CERT": str(files.cert),
        "HEXMQ_CLUSTER_KEY": str(files.key),
    }


def cluster_env(cluster_dir: Path, role: str, node: str) -> dict[str, str]:
    return env_for(cluster_ca(cluster_dir), role, node)


def tls_for(ca_dir: Path, role: str, node: str) -> ClusterTLS:
    """What a test's own calls present as (role, node): it dials TLS peers only."""
    return ClusterTLS(Identity(role, node), files_for(ca_dir, role, node), serve_tls=True)


def operator_tls(ca_dir: Path) -> ClusterTLS:
    return tls_for(ca_dir, OPERATOR, "tests")


def cluster_tls(cluster_dir: Path, role: str, node: str) -> ClusterTLS:
    return tls_for(cluster_ca(cluster_dir), role, node)


def cluster_channel(cluster_dir: Path, target: str, peer: Identity) -> grpc.Channel:
    """A test's own call (synchronous API) to a service of a `hexmq cluster`, as an operator
    of its CA; in plain text to a cluster started with --insecure-cluster (no CA)."""
    if not (cluster_ca(cluster_dir) / certs.CA_CERT).exists():
        return grpc.insecure_channel(target)
    return tls_for(cluster_ca(cluster_dir), OPERATOR, "tests").sync_channel(target, peer=peer)


def cluster_aio_channel(
    cluster_dir: Path, target: str, peer: Identity, role: str = OPERATOR, node: str = "tests"
) -> grpc.aio.Channel:
    """The same for asyncio, as (role, node) of the cluster's CA."""
    if not (cluster_ca(cluster_dir) / certs.CA_CERT).exists():
        return grpc.aio.insecure_channel(target)
    return tls_for(cluster_ca(cluster_dir), role, node).channel(target, peer=peer)


def node_redis(
    cluster_dir: Path, node: int, port: int, host: str = "127.0.0.1", **options: Any
) -> redis.Redis:
    """A test's client of node `node`'s Redis as the operator (every key and command: SCAN,
    dumps), or without credentials where the node's Redis asks for none."""
    password = cluster_dir / f"node{node}" / REDIS_OPERATOR_FILE
    if not password.exists():
        return redis.Redis(host=host, port=port, **options)
    return redis.Redis(
        host=host,
        port=port,
        username=OPERATOR_USER,
        password=password.read_text().strip(),
        **options,
    )
