"""A server TLS context from PEM files, for the listeners that speak TLS outside gRPC (the
edge's MQTT over TLS, consul-dev's HTTPS): TLS 1.2 or newer, and errors that name the option
and file that cannot be used."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Flags:
    """The options the files came from, for the error messages."""

    cert: str = "--tls-cert"
    key: str = "--tls-key"
    ca: str = "--tls-ca"
    require: str = "--tls-require-client-cert"


def server_context(
    cert: Path,
    key: Path,
    ca: Path | None = None,
    require_client_cert: bool = False,
    flags: Flags = Flags(),
) -> ssl.SSLContext:
    """A server context; ValueError naming the option and file that cannot be used.

    With `ca`, a client certificate is asked for and, when given, must be signed by that CA;
    `require_client_cert` refuses the handshake without one."""
    for option, path in ((flags.cert, cert), (flags.key, key), (flags.ca, ca)):
        if path is not None:
            try:
                path.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {option} {path}: {exc.strerror}") from None
    # Not create_default_context(): it would also trust the system's CAs for client certificates.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        # The certificate on its own first, so that an error names the right file.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_verify_locations(cafile=cert)
    except ssl.SSLError as exc:
        raise ValueError(f"{flags.cert} {cert} holds no usable PEM certificate: {exc}") from None
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = (
            "does not match the certificate"
            if exc.reason == "KEY_VALUES_MISMATCH"
            else "holds no usable PEM private key (or needs a password)"
        )
        raise ValueError(f"{flags.key} {key} {why} ({cert}): {exc}") from None
    if ca is None:
        if require_client_cert:
            raise ValueError(f"{flags.require} needs {flags.ca} (the CA that signs them)")
        return ctx
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise ValueError(f"{flags.ca} {ca} holds no usable PEM certificate: {exc}") from None
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return ctx
