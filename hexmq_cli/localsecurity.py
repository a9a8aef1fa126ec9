"""The secrets of a local cluster (`hexmq cluster`) and what each of its processes is given.

`hexmq cluster up` makes, under DIR (docs/security.md):

    tls/ca.crt, tls/ca.key             the cluster CA (hexmq.trust.certs)
    tls/n<i>/{edge,partition,membership}.{crt,key}
    tls/n<i>-e<k>/edge.{crt,key}       the node's edge k > 1 (`up --edges-per-node`)
    tls/operator/admin.{crt,key}        what the `hexmq cluster` commands present
    consul.token                        the embedded agreement server's ACL token
    node<i>/redis.password              the node's Redis password (its redis.conf has the hash)
    node<i>/redis-operator.password     the password of the node's Redis user for operators

Keys, token and passwords are files readable by their owner only. Every process gets its part
through HEXMQ_* variables naming files, never a secret on its command line (which `ps` shows),
and never anything its release does not read: a release before TLS ignores variables it does
not know, so the same environment serves a node rolled back to it.

How a node secures the cluster's links is its `security` mode, in the order a running cluster
goes through when it is switched to TLS (`hexmq cluster secure`, docs/security.md):

| mode | serves | dials |
| --- | --- | --- |
| plain | plain text (--insecure-cluster) | plain text |
| plain+certs | plain text | TLS peers with TLS, plain ones in plain text |
| tls+plain-peers | mutual TLS | TLS peers with TLS, plain ones in plain text |
| tls | mutual TLS | TLS only |
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Final

from hexmq.redis_security import HEXMQ_USER as REDIS_USER
from hexmq.redis_security import OPERATOR_USER as REDIS_OPERATOR
from hexmq_cli.clusterstate import (
    NODE_PROCESS,
    REDIS_OPERATOR_FILE,
    REDIS_PASSWORD_FILE,
    ClusterState,
    NodeState,
    service_of,
)

if TYPE_CHECKING:
    import grpc

    from hexmq.trust.grpc_tls import ClusterTLS

PLAIN: Final = "plain"
PLAIN_DIALS_TLS: Final = "plain+certs"
TLS_DIALS_PLAIN: Final = "tls+plain-peers"
TLS: Final = "tls"
# In the order a cluster switching to TLS goes through them.
MODES: Final = (PLAIN, PLAIN_DIALS_TLS, TLS_DIALS_PLAIN, TLS)

TLS_DIR: Final = "tls"
CONSUL_TOKEN_FILE: Final = "consul.token"
OPERATOR_NAME: Final = "admin"
HEXMQ_SERVICES: Final = ("membership", "partition", "edge")

# Every variable this module may set, so that one inherited from the caller's shell (a stale
# HEXMQ_INSECURE_CLUSTER, say) never changes what a node runs as.
_MANAGED: Final = (
    "HEXMQ_CLUSTER_CA",
    "HEXMQ_CLUSTER_CERT",
    "HEXMQ_CLUSTER_KEY",
    "HEXMQ_INSECURE_CLUSTER",
    "HEXMQ_CLUSTER_PLAINTEXT_PEERS",
    "HEXMQ_CONSUL_TOKEN_FILE",
    "HEXMQ_ACL_TOKEN_FILE",
    "HEXMQ_REDIS_USER",
    "HEXMQ_REDIS_PASSWORD_FILE",
)


def serves_tls(mode: str) -> bool:
    return mode in (TLS_DIALS_PLAIN, TLS)


def tls_dir(state: ClusterState) -> Path:
    return state.dir / TLS_DIR


def consul_token_file(state: ClusterState) -> Path:
    return state.dir / CONSUL_TOKEN_FILE


def redis_password_file(node: NodeState) -> Path:
    return node.dir / REDIS_PASSWORD_FILE


def _write_secret(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def make_token() -> str:
    """A new secret (an ACL token, a Redis password): 256 bits, URL-safe text."""
    return secrets.token_urlsafe(32)


# --- making the secrets ----------------------------------------------------------------------


def ensure_certificates(state: ClusterState, nodes: list[NodeState] | None = None) -> None:
    """The CA (made once), the operator's certificate, and a certificate per service of each
    of `nodes` (default: all) that has none yet; each server certificate also names the
    node's address, for tools that check it (docs/security.md)."""
    from hexmq.trust import certs
    from hexmq.trust.identity import OPERATOR, Identity

    directory = tls_dir(state)
    if not (directory / certs.CA_CERT).exists():
        certs.make_ca(directory, name=f"hexmq cluster CA ({state.cluster_name})")
    operator = Identity(OPERATOR, OPERATOR_NAME)
    if not certs.identity_files(directory, operator).cert.exists():
        certs.issue(directory, operator)
    for node in state.nodes if nodes is None else nodes:
        # Each service's, and each further edge's (a co-located node's process has none).
        for name in [*HEXMQ_SERVICES, *node.edges[1:]]:
            identity = Identity(service_of(name), node.process_id(name))
            if not certs.identity_files(directory, identity).cert.exists():
                certs.issue(directory, identity, ip_addresses=[node.ports.host])


def ensure_consul_token(state: ClusterState) -> None:
    path = consul_token_file(state)
    if not path.exists():
        _write_secret(path, make_token())


def ensure_redis_password(node: NodeState) -> None:
    """The node's Redis passwords, made once and kept in node<i>/redis.password (the
    partition service's) and node<i>/redis-operator.password (an operator's); its redis.conf
    gets their hashes (hexmq.redis_security)."""
    for path in (redis_password_file(node), node.dir / REDIS_OPERATOR_FILE):
        if not path.exists():
            _write_secret(path, make_token())


def redis_login(node: NodeState) -> tuple[str, str] | None:
    """(user, password) of the operator for the node's Redis, None while it asks for none."""
    if not node.redis_auth:
        return None
    return REDIS_OPERATOR, (node.dir / REDIS_OPERATOR_FILE).read_text().strip()


# --- what each process is given ---------------------------------------------------------------


def _tls_variables(state: ClusterState, node: NodeState, process: str) -> dict[str, str]:
    from hexmq.trust import certs
    from hexmq.trust.identity import Identity

    directory = tls_dir(state)
    files = certs.identity_files(directory, Identity(service_of(process), node.process_id(process)))
    return {
        "HEXMQ_CLUSTER_CA": str(directory / certs.CA_CERT),
        "HEXMQ_CLUSTER_CERT": str(files.cert),
        "HEXMQ_CLUSTER_KEY": str(files.key),
    }


def service_variables(state: ClusterState, node: NodeState, service: str) -> dict[str, str]:
    """The HEXMQ_* variables of one of a node's processes (none for its Redis, whose secrets
    are in its redis.conf); `service` names the process (`edge2`: the node's second edge). A
    co-located node's `hexmq node` gets each service's as HEXMQ_NODE_<SERVICE>_<OPTION>: the
    section of that service reads it (hexmq_cli/node.py)."""
    if service == NODE_PROCESS:
        return {
            f"HEXMQ_NODE_{hexmq_service.upper()}_{name.removeprefix('HEXMQ_')}": value
            for hexmq_service in HEXMQ_SERVICES
            for name, value in service_variables(state, node, hexmq_service).items()
        }
    if service_of(service) not in HEXMQ_SERVICES:
        return {}
    out: dict[str, str] = {}
    mode = node.security
    if mode == PLAIN:
        out["HEXMQ_INSECURE_CLUSTER"] = "true"
    elif mode == PLAIN_DIALS_TLS:
        out["HEXMQ_INSECURE_CLUSTER"] = "true"
        out.update(_tls_variables(state, node, service))
    elif mode == TLS_DIALS_PLAIN:
        out["HEXMQ_CLUSTER_PLAINTEXT_PEERS"] = "true"
        out.update(_tls_variables(state, node, service))
    elif mode == TLS:
        out.update(_tls_variables(state, node, service))
    else:
        raise ValueError(f"node {node.node}: unknown security mode {mode!r}")
    if service == "membership" and consul_token_file(state).exists():
        # Given as soon as the token exists: a cluster switching to it has its agents present
        # it before the agreement server asks for it (`hexmq cluster secure`).
        out["HEXMQ_CONSUL_TOKEN_FILE"] = str(consul_token_file(state))
    if service == "partition" and node.redis_auth:
        out["HEXMQ_REDIS_USER"] = REDIS_USER
        out["HEXMQ_REDIS_PASSWORD_FILE"] = str(redis_password_file(node))
    return out


def agreement_variables(state: ClusterState) -> dict[str, str]:
    """The embedded agreement server's: its ACL token file, once the cluster has one."""
    return {"HEXMQ_ACL_TOKEN_FILE": str(consul_token_file(state))} if state.consul_acl else {}


def environment(base: dict[str, str], variables: dict[str, str]) -> dict[str, str]:
    """`base` without any variable this module manages, plus `variables`."""
    node_sections = tuple(f"HEXMQ_NODE_{s.upper()}_" for s in HEXMQ_SERVICES)
    env = {k: v for k, v in base.items() if k not in _MANAGED and not k.startswith(node_sections)}
    env.update(variables)
    return env


# --- the operator's side ----------------------------------------------------------------------


def operator_tls(state: ClusterState) -> ClusterTLS:
    """What the `hexmq cluster` commands present to the nodes: the operator certificate when
    the cluster has one. It serves nothing, and dials each node as the node serves."""
    from hexmq.trust import certs
    from hexmq.trust.grpc_tls import ClusterTLS, TLSFiles
    from hexmq.trust.identity import OPERATOR, Identity

    directory = tls_dir(state)
    identity = Identity(OPERATOR, OPERATOR_NAME)
    files = certs.identity_files(directory, identity)
    if not files.cert.exists():
        return ClusterTLS.insecure()
    return ClusterTLS(
        identity,
        TLSFiles(directory / certs.CA_CERT, files.cert, files.key),
        serve_tls=False,
    )


def node_channel(state: ClusterState, node: NodeState, service: str) -> grpc.Channel:
    """A channel (synchronous API) from the operator to a node's membership or partition
    service."""
    from hexmq.trust.identity import Identity

    port = node.ports.membership if service == "membership" else node.ports.partition
    return operator_tls(state).sync_channel(
        node.ports.addr(port),
        peer=Identity(service, node.node_id),
        peer_tls=serves_tls(node.security),
    )
