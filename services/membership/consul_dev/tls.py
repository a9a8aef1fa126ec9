"""The TLS context of `hexmq consul-dev --https-cert --https-key [--https-ca
[--https-verify-incoming]]`: HTTPS, TLS 1.2 or newer, as Consul's HTTPS listener (tls.https /
tls.defaults: cert_file, key_file, ca_file, verify_incoming)."""

from __future__ import annotations

import ssl
from pathlib import Path

from hexmq import tls_server

FLAGS = tls_server.Flags("--https-cert", "--https-key", "--https-ca", "--https-verify-incoming")


def server_context(
    cert: Path, key: Path, ca: Path | None = None, verify_incoming: bool = False
) -> ssl.SSLContext:
    """A server context; ValueError naming the option and file that cannot be used.

    With `ca`, a client certificate is asked for and, when given, must be signed by that CA;
    `verify_incoming` refuses the handshake without one (Consul's verify_incoming)."""
    return tls_server.server_context(cert, key, ca, verify_incoming, FLAGS)
