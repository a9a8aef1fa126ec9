"""The TLS context of `hexmq consul-dev --https-cert --https-key [--https-ca
[--https-verify-incoming]]`: HTTPS, TLS 1.2 or newer, as Consul's HTTPS listener (tls.https /
tls.defaults: cert_file, key_file, ca_file, verify_incoming)."""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(
    cert: Path, key: Path, ca: Path | None = None, verify_incoming: bool = False
) -> ssl.SSLContext:
    """A server context; ValueError naming the option and file that cannot be used.

    With `ca`, a client certificate is asked for and, when given, must be signed by that CA;
    `verify_incoming` refuses the handshake without one (Consul's verify_incoming)."""
    for option, path in (("--https-cert", cert), ("--https-key", key), ("--https-ca", ca)):
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
        raise ValueError(f"--https-cert {cert} holds no usable PEM certificate: {exc}") from None
    try:
        ctx.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        why = (
            "does not match the certificate"
            if exc.reason == "KEY_VALUES_MISMATCH"
            else "holds no usable PEM private key (or needs a password)"
        )
        raise ValueError(f"--https-key {key} {why} ({cert}): {exc}") from None
    if ca is None:
        if verify_incoming:
            raise ValueError("--https-verify-incoming needs --https-ca (the CA that signs them)")
        return ctx
    try:
        ctx.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise ValueError(f"--https-ca {ca} holds no usable PEM certificate: {exc}") from None
    ctx.verify_mode = ssl.CERT_REQUIRED if verify_incoming else ssl.CERT_OPTIONAL
    return ctx
