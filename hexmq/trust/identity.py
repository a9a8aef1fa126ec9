"""Who a cluster process is: one node and one role, named by its certificate.

A certificate of the cluster's CA carries its holder's identity as a URI subject alternative
name in SPIFFE form (the workload-identity convention gRPC itself reads as `peer_spiffe_id`):

    spiffe://hexmq/partition/n1      the partition service of node n1
    spiffe://hexmq/edge/n2           the edge of node n2
    spiffe://hexmq/membership/n3     the membership agent of node n3
    spiffe://hexmq/operator/alice    an operator (the `hexmq cluster` commands, scripts)

The first path segment is the role, the second the node id (for an operator, a name). The
trust domain ("hexmq" unless `--cluster-trust-domain` says otherwise) must match: a CA shared
by several clusters then still keeps them apart. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

EDGE: Final = "edge"
PARTITION: Final = "partition"
MEMBERSHIP: Final = "membership"
OPERATOR: Final = "operator"
ROLES: Final = (EDGE, PARTITION, MEMBERSHIP, OPERATOR)
# The services of a node (an operator belongs to no node).
NODE_ROLES: Final = (EDGE, PARTITION, MEMBERSHIP)

DEFAULT_TRUST_DOMAIN: Final = "hexmq"
# Node ids (the membership agent checks them with this too: services/membership/records.py),
# operator names alike; a trust domain as SPIFFE allows it (lower case letters, digits, '.',
# '-', '_').
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_TRUST_DOMAIN = re.compile(r"[a-z0-9][a-z0-9._-]{0,254}")


class IdentityError(ValueError):
    """A name that is not an identity of this scheme; the message says why."""


def check_trust_domain(domain: str) -> str:
    if not _TRUST_DOMAIN.fullmatch(domain):
        raise IdentityError(
            f"a trust domain is lower-case letters, digits, '.', '-' and '_', got {domain!r}"
        )
    return domain


@dataclass(frozen=True, slots=True)
class Identity:
    role: str
    # The node id (for an operator: the operator's name).
    node: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise IdentityError(f"a role is one of {', '.join(ROLES)}, got {self.role!r}")
        if not NODE_ID.fullmatch(self.node):
            raise IdentityError(
                f"a node id or operator name is 1-63 letters, digits, '_', '.' or '-', "
                f"got {self.node!r}"
            )

    def uri(self, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> str:
        return f"spiffe://{check_trust_domain(trust_domain)}/{self.role}/{self.node}"

    def __str__(self) -> str:
        return f"{self.role} {self.node}"


def parse_uri(uri: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity:
    """The identity a SPIFFE URI names; IdentityError if it is not one of this cluster's."""
    prefix = f"spiffe://{trust_domain}/"
    if not uri.startswith(prefix):
        raise IdentityError(f"{uri!r} is not an identity of trust domain {trust_domain!r}")
    parts = uri[len(prefix) :].split("/")
    if len(parts) != 2:
        raise IdentityError(f"{uri!r} is not spiffe://{trust_domain}/ROLE/NAME")
    return Identity(parts[0], parts[1])


def from_sans(uris: Sequence[str], trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity | None:
    """The one identity among a certificate's URI SANs, or None when it names none or
    several (a certificate must not speak for two identities)."""
    found = set()
    for uri in uris:
        try:
            found.add(parse_uri(uri, trust_domain))
        except IdentityError:
            continue
    return found.pop() if len(found) == 1 else None


def from_auth_context(
    auth: Mapping[str, Sequence[bytes]], trust_domain: str = DEFAULT_TRUST_DOMAIN
) -> Identity | None:
    """The caller's identity from a gRPC `context.auth_context()` (its certificate's subject
    alternative names, as gRPC verified them against the cluster CA), or None: a plain-text
    caller, or a certificate that names no identity of this trust domain."""
    if auth.get("transport_security_type") != [b"ssl"]:
        return None
    sans = [v.decode(errors="replace") for v in auth.get("x509_subject_alternative_name", ())]
    return from_sans([s for s in sans if s.startswith("spiffe://")], trust_domain)
