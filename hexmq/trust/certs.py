"""The cluster CA and the certificates it issues, made with `cryptography` (no hand-written
ASN.1, no openssl command line).

Every certificate is ECDSA P-256 (fast handshakes, small), SHA-256 signed, and carries:

- its identity as a URI SAN, `spiffe://<trust domain>/<role>/<node>` (hexmq.trust.identity);
- the DNS SANs `<role>.<node>.<trust domain>` and `<role>.<trust domain>`: the names a client
  of the cluster checks a server by (hexmq.trust.grpc_tls: a link to node n2's partition
  service accepts only `partition.n2.hexmq`), plus any DNS names and IP addresses asked for;
- extended key usage server and client auth (every cluster process is both).

Files: PEM; private keys PKCS#8, unencrypted, written 0600 (the process that uses one reads
it at start and on every renewal). A cluster's directory, as `hexmq certs cluster` and
`hexmq cluster up` write it:

    ca.crt                the CA certificate: every process trusts it (--cluster-ca)
    ca.key                the CA's key: only needed to issue more (keep it offline in production)
    <node>/<role>.crt     one certificate and key per service of each node
    <node>/<role>.key
    operator/<name>.crt   operators (hexmq cluster status/leave/...)
    operator/<name>.key
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from hexmq.trust.identity import DEFAULT_TRUST_DOMAIN, OPERATOR, Identity, from_sans

CA_DAYS: Final = 3650
LEAF_DAYS: Final = 825  # the longest a publicly trusted leaf may be valid, a common bound
CA_CERT: Final = "ca.crt"
CA_KEY: Final = "ca.key"
# A certificate made now is valid from a little before now: clocks of a cluster's machines
# differ by a few seconds, and a certificate "not yet valid" is refused.
_BACKDATE = datetime.timedelta(minutes=5)


class CertError(ValueError):
    """A certificate or key file that cannot be used; the message names the file."""


@dataclass(frozen=True, slots=True)
class CertFiles:
    cert: Path
    key: Path


def identity_files(directory: Path, identity: Identity) -> CertFiles:
    """Where a cluster directory keeps an identity's certificate and key."""
    folder = directory / (OPERATOR if identity.role == OPERATOR else identity.node)
    name = identity.node if identity.role == OPERATOR else identity.role
    return CertFiles(folder / f"{name}.crt", folder / f"{name}.key")


def server_names(identity: Identity, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> list[str]:
    """The DNS names a client checks this identity's server certificate against."""
    return [
        f"{identity.role}.{identity.node}.{trust_domain}",
        f"{identity.role}.{trust_domain}",
    ]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes) -> None:
    """Write a key readable by its owner only, never briefly readable by others."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _write_public(path: Path, data: bytes) -> None:
    """Replace the file in one step: a process reloading it never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except OSError as exc:
        raise CertError(f"cannot read certificate {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise CertError(f"{path} holds no PEM certificate: {exc}") from None


def load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise CertError(f"cannot read key {path}: {exc.strerror}") from None
    except (ValueError, TypeError) as exc:
        raise CertError(f"{path} holds no unencrypted PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertError(f"{path}: the CA key must be an EC key (hexmq certs makes P-256)")
    return key


def make_ca(directory: Path, *, name: str = "hexmq cluster CA", days: int = CA_DAYS) -> CertFiles:
    """A new self-signed CA in `directory` (ca.crt, ca.key). Refuses to replace one."""
    files = CertFiles(directory / CA_CERT, directory / CA_KEY)
    for path in (files.cert, files.key):
        if path.exists():
            raise CertError(f"{path} exists: a CA is never replaced silently")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(files.key, _key_pem(key))
    _write_public(files.cert, cert.public_bytes(serialization.Encoding.PEM))
    return files


def _alt_names(
    identity: Identity,
    trust_domain: str,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str],
) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity.uri(trust_domain))]
    names += [x509.DNSName(n) for n in [*server_names(identity, trust_domain), *dns_names]]
    for ip in ip_addresses:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise CertError(f"{ip!r} is not an IP address") from None
    return names


def _subject(role: str, name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "hexmq"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )


_LEAF_USAGE = x509.KeyUsage(
    digital_signature=True,
    key_cert_sign=False,
    crl_sign=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    encipher_only=False,
    decipher_only=False,
)
_BOTH_AUTH = x509.ExtendedKeyUsage(
    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
)


def _sign_leaf(
    ca_dir: Path,
    subject: x509.Name,
    alt_names: list[x509.GeneralName],
    out: CertFiles,
    days: int,
) -> CertFiles:
    ca_cert = load_cert(ca_dir / CA_CERT)
    ca_key = load_key(ca_dir / CA_KEY)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    # Never past the CA's own end.
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_LEAF_USAGE, critical=True)
        .add_extension(_BOTH_AUTH, critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(out.key, _key_pem(key))
    _write_public(out.cert, cert.public_bytes(serialization.Encoding.PEM))
    return out


def issue(
    ca_dir: Path,
    identity: Identity,
    *,
    out: CertFiles | None = None,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    days: int = LEAF_DAYS,
) -> CertFiles:
    """A new key and a certificate for `identity`, signed by the CA in `ca_dir`, written to
    `out` (default: the identity's place in `ca_dir`). An existing pair there is replaced,
    each file in one step (a renewal; the process using them picks them up)."""
    return _sign_leaf(
        ca_dir,
        _subject(identity.role, identity.node),
        _alt_names(identity, trust_domain, dns_names, ip_addresses),
        out or identity_files(ca_dir, identity),
        days,
    )


def issue_server(
    ca_dir: Path,
    name: str,
    out: CertFiles,
    *,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    days: int = LEAF_DAYS,
) -> CertFiles:
    """A certificate for a server that is not a cluster identity (a node's Redis, the
    embedded agreement server): its DNS names and IP addresses only."""
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    for ip in ip_addresses:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(ip)))
        except ValueError:
            raise CertError(f"{ip!r} is not an IP address") from None
    if not alt:
        raise CertError(f"a server certificate for {name} needs a DNS name or an IP address")
    return _sign_leaf(ca_dir, _subject("server", name), alt, out, days)


def request(
    identity: Identity,
    out_dir: Path,
    *,
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
) -> tuple[Path, Path]:
    """A new key and a certificate signing request for `identity`, for a CA of the operator's
    own (docs/security.md): the CSR asks for exactly the names `issue` would write."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(_subject(identity.role, identity.node))
        .add_extension(
            x509.SubjectAlternativeName(
                _alt_names(identity, trust_domain, dns_names, ip_addresses)
            ),
            critical=False,
        )
        .add_extension(_BOTH_AUTH, critical=False)
        .sign(key, hashes.SHA256())
    )
    base = out_dir / f"{identity.role}-{identity.node}"
    key_path, csr_path = base.with_suffix(".key"), base.with_suffix(".csr")
    _write_private(key_path, _key_pem(key))
    _write_public(csr_path, csr.public_bytes(serialization.Encoding.PEM))
    return key_path, csr_path


@dataclass(frozen=True, slots=True)
class CertInfo:
    identity: Identity | None
    subject: str
    issuer: str
    not_before: datetime.datetime
    not_after: datetime.datetime
    dns_names: list[str]
    uris: list[str]


def describe(path: Path, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> CertInfo:
    cert = load_cert(path)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        dns = san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        uris, dns = [], []
    return CertInfo(
        identity=from_sans(uris, trust_domain),
        subject=cert.subject.rfc4514_string(),
        issuer=cert.issuer.rfc4514_string(),
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
        dns_names=dns,
        uris=uris,
    )
