"""Throwaway certificates for TLS tests, made with the openssl command line: a CA, a server
certificate for 127.0.0.1/localhost and a client certificate, both signed by the CA."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CertFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(name: str, subject: str, extensions: str, d: Path) -> None:
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject),
        cwd=d,
    )
    (d / f"{name}.ext").write_text(extensions + "\n")
    _openssl(
        *("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key"),
        *("-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext"),
        cwd=d,
    )


def make_certs(d: Path) -> CertFiles:
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not on PATH (Debian: apt-get install openssl)")
    d.mkdir(parents=True, exist_ok=True)
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2"),
        *("-subj", "/CN=hexmq test CA"),
        cwd=d,
    )
    _signed(
        "server",
        "/CN=127.0.0.1",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth",
        d,
    )
    _signed("client", "/CN=test-client", "extendedKeyUsage=clientAuth", d)
    return CertFiles(
        ca=d / "ca.crt",
        server_cert=d / "server.crt",
        server_key=d / "server.key",
        client_cert=d / "client.crt",
        client_key=d / "client.key",
    )
