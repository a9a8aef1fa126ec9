"""TLS on the cluster's gRPC links: the `--cluster-*` options of every service, credentials
that follow renewed files, and whether a given peer is dialled with TLS or in plain text.

    tls = ClusterTLS.from_args(args, Identity(PARTITION, args.node_id))   # checks the files
    tls.add_port(server, args.listen)               # TLS, client certificate required
    channel = tls.channel(target, peer=Identity(PARTITION, "n2"), peer_tls=member.tls)
    tls.caller(context)                             # the caller's Identity (servicers)

Mutual TLS is the default: a server asks every caller for a certificate of the cluster CA,
and a client checks the server's certificate names the service it meant to reach (the DNS
name `<role>.<node>.<trust domain>`, hexmq.trust.certs). `--insecure-cluster` serves and
dials plain text instead, with a warning at start.

Renewal without a restart: the files are looked at again (by size, time and inode) on every
TLS handshake a server makes and every channel a client opens; changed files take effect
from then on, connections already open keep their session.

Switching a running cluster from plain text to TLS (docs/security.md, "From plain text to
TLS") needs peers of both kinds for a while, so each member says in the view whether it
serves TLS (`Member.tls`), and a process dials each peer the way it serves:

| this process | peer serves TLS | peer serves plain text |
| --- | --- | --- |
| default (TLS) | TLS | refused (logged) |
| `--cluster-plaintext-peers` | TLS | plain text |
| `--insecure-cluster` with certificate files | TLS | plain text |
| `--insecure-cluster` without | refused (logged) | plain text |
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from hexmq.trust.certs import CertError, describe, server_names
from hexmq.trust.identity import (
    DEFAULT_TRUST_DOMAIN,
    Identity,
    IdentityError,
    check_trust_domain,
    from_auth_context,
)

log = logging.getLogger(__name__)

INSECURE_WARNING = (
    "--insecure-cluster: this process serves and dials the cluster's gRPC links in plain "
    "text, without identities: any process that can reach its ports can act as a member "
    "(docs/security.md)"
)


class TLSConfigError(ValueError):
    """The --cluster-* options or their files cannot be used; the message says which."""


def add_cluster_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every service takes for its cluster links (each also HEXMQ_<OPTION>)."""
    group = parser.add_argument_group(
        "cluster trust",
        "mutual TLS on every gRPC link inside the cluster (docs/security.md); the files are "
        "read again when they change (certificate renewal needs no restart)",
    )
    group.add_argument(
        "--cluster-ca", type=Path, metavar="FILE", help="PEM: the cluster CA certificate(s)"
    )
    group.add_argument(
        "--cluster-cert",
        type=Path,
        metavar="FILE",
        help="PEM: this process's certificate, naming its node and role",
    )
    group.add_argument("--cluster-key", type=Path, metavar="FILE", help="PEM: its private key")
    group.add_argument(
        "--cluster-trust-domain",
        default=DEFAULT_TRUST_DOMAIN,
        metavar="NAME",
        help="the trust domain of the cluster's identities (spiffe://NAME/ROLE/NODE) "
        "(default %(default)s)",
    )
    group.add_argument(
        "--insecure-cluster",
        action="store_true",
        help="serve and dial the cluster's links in plain text, with no identities (logged "
        "as a warning at start); with certificate files, peers that serve TLS are still "
        "dialled with TLS (switching a cluster to TLS)",
    )
    group.add_argument(
        "--cluster-plaintext-peers",
        action="store_true",
        help="serve TLS, but dial peers that still serve plain text in plain text: only "
        "while a cluster switches to TLS (docs/security.md)",
    )


@dataclass(frozen=True, slots=True)
class TLSFiles:
    ca: Path
    cert: Path
    key: Path


class _Material:
    """The three files' bytes, read again whenever one of them changed on disk."""

    def __init__(self, files: TLSFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp: tuple[tuple[int, int, int], ...] | None = None
        self._bytes: tuple[bytes, bytes, bytes] = (b"", b"", b"")
        self.generation = 0

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.files.ca, self.files.cert, self.files.key):
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def current(self) -> tuple[tuple[bytes, bytes, bytes], int]:
        """(ca, cert, key) bytes and their generation (it grows with every change seen). A
        file that cannot be read now keeps the last good material (logged)."""
        with self._lock:
            try:
                stamp = self._stat()
                if stamp != self._stamp:
                    read = tuple(
                        p.read_bytes() for p in (self.files.ca, self.files.cert, self.files.key)
                    )
                    if self._stamp is not None:
                        log.info(
                            "cluster TLS files changed: using the new ones (%s)", self.files.cert
                        )
                    self._bytes = read  # type: ignore[assignment]
                    self._stamp = stamp
                    self.generation += 1
            except OSError as exc:
                if self._stamp is None:
                    raise
                log.warning("cannot read the cluster TLS files (%s); keeping the last ones", exc)
            return self._bytes, self.generation


class ClusterTLS:
    """One process's cluster-link security: how it serves, how it dials, who calls it."""

    def __init__(
        self,
        identity: Identity | None,
        files: TLSFiles | None,
        *,
        serve_tls: bool = True,
        plaintext_peers: bool = False,
        trust_domain: str = DEFAULT_TRUST_DOMAIN,
    ) -> None:
        if serve_tls and files is None:
            raise TLSConfigError(
                "mutual TLS inside the cluster needs --cluster-ca, --cluster-cert and "
                "--cluster-key (hexmq certs makes them; --insecure-cluster serves plain text)"
            )
        self.identity = identity
        self.files = files
        self.serve_tls = serve_tls
        self.plaintext_peers = plaintext_peers or not serve_tls
        self.trust_domain = trust_domain
        self._material = _Material(files) if files is not None else None
        self._server_generation = 0
        self._channel_creds: tuple[int, grpc.ChannelCredentials] | None = None

    @classmethod
    def insecure(cls) -> ClusterTLS:
        """Plain text both ways (tests of plain-text behaviour, the previous release's way)."""
        return cls(None, None, serve_tls=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace, identity: Identity | None) -> ClusterTLS:
        """From a service's --cluster-* options; checks the files now (readable, the
        certificate names `identity`: a process never starts as somebody else). Raises
        TLSConfigError naming the option or file."""
        try:
            domain = check_trust_domain(args.cluster_trust_domain)
        except IdentityError as exc:
            raise TLSConfigError(f"--cluster-trust-domain: {exc}") from None
        given = [args.cluster_ca, args.cluster_cert, args.cluster_key]
        if any(given) and not all(given):
            raise TLSConfigError("--cluster-ca, --cluster-cert and --cluster-key go together")
        files = TLSFiles(*given) if all(given) else None
        if args.insecure_cluster and args.cluster_plaintext_peers:
            raise TLSConfigError(
                "--cluster-plaintext-peers is for a process that serves TLS; "
                "--insecure-cluster already dials plain-text peers"
            )
        if files is not None:
            check_files(files, identity, domain)
        return cls(
            identity,
            files,
            serve_tls=not args.insecure_cluster,
            plaintext_peers=args.cluster_plaintext_peers,
            trust_domain=domain,
        )

    def describe(self) -> str:
        if not self.serve_tls:
            dial = "TLS peers with TLS" if self.files else "plain text only"
            return f"plain text (--insecure-cluster; dials {dial})"
        peers = ", plain-text peers in plain text" if self.plaintext_peers else ""
        return f"mutual TLS as {self.identity} (CA {self.files.ca if self.files else '-'}{peers})"

    def warn_if_insecure(self) -> None:
        if not self.serve_tls:
            log.warning("%s", INSECURE_WARNING)

    # --- serving ---------------------------------------------------------------------------

    def server_credentials(self) -> grpc.ServerCredentials:
        assert self._material is not None
        (ca, cert, key), generation = self._material.current()
        self._server_generation = generation
        initial = grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)
        return grpc.dynamic_ssl_server_credentials(
            initial, self._fetch_server_config, require_client_authentication=True
        )

    def _fetch_server_config(self) -> Any:
        # Called by gRPC on its own threads before each handshake: None keeps the current one.
        assert self._material is not None
        try:
            (ca, cert, key), generation = self._material.current()
        except OSError:
            return None
        if generation == self._server_generation:
            return None
        self._server_generation = generation
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def add_port(self, server: grpc.aio.Server, listen: str) -> int:
        """Listen on `listen`: TLS with client certificates required, or plain text when
        insecure. Raises RuntimeError when the address cannot be bound (as gRPC does)."""
        port: int
        if self.serve_tls:
            port = server.add_secure_port(listen, self.server_credentials())
        else:
            port = server.add_insecure_port(listen)
        return port

    def caller(self, context: grpc.aio.ServicerContext) -> Identity | None:
        """The identity the caller's certificate names (None over plain text)."""
        return from_auth_context(context.auth_context(), self.trust_domain)

    # --- dialling --------------------------------------------------------------------------

    def dials_tls(self, peer_tls: bool) -> bool:
        """Whether a peer that serves TLS (or not) is dialled with TLS; raises
        PeerRefused when this process must not dial it at all."""
        if peer_tls:
            if self.files is None:
                raise PeerRefused("it serves TLS and this process has no cluster certificate")
            return True
        if not self.plaintext_peers:
            raise PeerRefused(
                "it serves plain text (--insecure-cluster) and this process dials TLS only "
                "(--cluster-plaintext-peers allows it while a cluster switches to TLS)"
            )
        return False

    def generation(self) -> int:
        """Grows whenever the files changed on disk: a long-lived channel made before is
        renewed (RenewingChannel). 0 without files."""
        if self._material is None:
            return 0
        try:
            return self._material.current()[1]
        except OSError:
            return self._material.generation

    def channel_credentials(self) -> grpc.ChannelCredentials:
        assert self._material is not None
        (ca, cert, key), generation = self._material.current()
        cached = self._channel_creds
        if cached is None or cached[0] != generation:
            cached = (generation, grpc.ssl_channel_credentials(ca, key, cert))
            self._channel_creds = cached
        return cached[1]

    def channel_options(
        self, peer: Identity | str, options: Sequence[tuple[str, Any]] = ()
    ) -> list[tuple[str, Any]]:
        """`options` and the name the peer's certificate must carry: `peer` is its Identity,
        or only its role when the caller does not know its node (`<role>.<trust domain>`)."""
        if isinstance(peer, Identity):
            name = server_names(peer, self.trust_domain)[0]
        else:
            name = f"{peer}.{self.trust_domain}"
        return [*options, ("grpc.ssl_target_name_override", name)]

    def channel(
        self,
        target: str,
        *,
        peer: Identity | str,
        peer_tls: bool | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> grpc.aio.Channel:
        """An asyncio channel to `peer` at `target`. `peer_tls`: whether the peer serves TLS
        (its view member's `tls`); None: it serves the way this process does (the services
        of one node). Raises PeerRefused when the table above says so."""
        if self.dials_tls(self.serve_tls if peer_tls is None else peer_tls):
            return grpc.aio.secure_channel(
                target, self.channel_credentials(), options=self.channel_options(peer, options)
            )
        return grpc.aio.insecure_channel(target, options=list(options))

    def sync_channel(
        self,
        target: str,
        *,
        peer: Identity | str,
        peer_tls: bool | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> grpc.Channel:
        """The same, for the synchronous API (the `hexmq cluster` commands, tests)."""
        if self.dials_tls(self.serve_tls if peer_tls is None else peer_tls):
            return grpc.secure_channel(
                target, self.channel_credentials(), options=self.channel_options(peer, options)
            )
        return grpc.insecure_channel(target, options=list(options))


class PeerRefused(Exception):
    """This process must not dial that peer (the message says why)."""


def check_files(files: TLSFiles, identity: Identity | None, trust_domain: str) -> None:
    """The files can be read, hold PEM, and the certificate names `identity`."""
    for option, path in (
        ("--cluster-ca", files.ca),
        ("--cluster-cert", files.cert),
        ("--cluster-key", files.key),
    ):
        if not path.is_file():
            raise TLSConfigError(f"{option} {path}: no such file")
        try:
            path.read_bytes()
        except OSError as exc:
            raise TLSConfigError(f"{option} {path}: {exc.strerror}") from None
    try:
        info = describe(files.cert, trust_domain)
        describe(files.ca, trust_domain)
    except CertError as exc:
        raise TLSConfigError(str(exc)) from None
    if identity is not None and info.identity != identity:
        named = info.identity or f"no identity of trust domain {trust_domain!r}"
        raise TLSConfigError(
            f"--cluster-cert {files.cert} names {named}, but this process is {identity} "
            "(hexmq certs issue --role ROLE --node NODE makes the right one)"
        )


class RenewingChannel:
    """A long-lived channel that is made anew once the credentials changed on disk, so that
    its reconnections present the renewed certificate (a gRPC channel keeps the credentials
    it was made with). The channel it replaces is closed at the next renewal or `close`:
    calls still running on it finish meanwhile."""

    def __init__(self, dial: Callable[[], grpc.aio.Channel], tls: ClusterTLS) -> None:
        self._dial = dial
        self._tls = tls
        self._channel: grpc.aio.Channel | None = None
        self._generation = -1
        self._retired: grpc.aio.Channel | None = None

    async def get(self) -> grpc.aio.Channel:
        """The channel (PeerRefused when this process must not dial the peer)."""
        generation = self._tls.generation()
        if self._channel is None or generation != self._generation:
            fresh = self._dial()
            if self._retired is not None:
                await self._retired.close()
            self._retired, self._channel = self._channel, fresh
            self._generation = generation
        return self._channel

    async def close(self) -> None:
        for channel in (self._retired, self._channel):
            if channel is not None:
                await channel.close()
        self._channel = self._retired = None
