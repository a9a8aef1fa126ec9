"""`hexmq consul-dev`: serve the Consul HTTP API subset the membership agents use.

One process for one machine (local clusters, tests, the fault suite); production runs Consul
servers. Prints `serving on http://HOST:PORT` (`https://` with `--https-cert`) on stdout once it
accepts requests (with `--listen HOST:0` the port is the one the system chose). Exit codes: 0
after SIGTERM or SIGINT, 1 when it cannot serve (address in use, state not writable), 2 on bad
arguments, a token or TLS file it cannot use, or a data directory it cannot use.

`--acl-token-file FILE` enables Consul's ACLs with default policy deny (acl.py): the file's
content is the one management token (acl.tokens.initial_management), read again when the file
changes. The token is taken from a file only, never from the command line, where `ps` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import ssl
from pathlib import Path

from aiohttp import web

from hexmq.service import run_service, setup_logging
from services.membership.consul_dev.acl import ANONYMOUS_SECRET
from services.membership.consul_dev.datafile import DataDir, DataDirError
from services.membership.consul_dev.http import ConsulHTTP
from services.membership.consul_dev.state import ConsulState
from services.membership.consul_dev.tls import server_context
from services.membership.token_file import TokenFile, TokenFileError

log = logging.getLogger("hexmq.consul_dev")

DEFAULT_LISTEN = "127.0.0.1:8500"
DEFAULT_NODE_NAME = "hexmq-consul-dev"
SHUTDOWN_GRACE_S = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help="where to serve the HTTP API (default %(default)s; port 0: any free port)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the state in DIR/state.json, written on every change and read at start "
        "(default: in memory only)",
    )
    parser.add_argument(
        "--node-name",
        default=DEFAULT_NODE_NAME,
        help="the node this server is: sessions and services live on it (default %(default)s)",
    )
    parser.add_argument(
        "--acl-token-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="enable ACLs with default policy deny: FILE holds the one management token "
        "(read again when the file changes); without it every request is allowed",
    )
    parser.add_argument(
        "--https-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="serve HTTPS (TLS 1.2+) with this PEM certificate (chain); needs --https-key",
    )
    parser.add_argument(
        "--https-key", type=Path, default=None, metavar="FILE", help="the certificate's PEM key"
    )
    parser.add_argument(
        "--https-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="ask clients for a certificate signed by this CA (checked when one is given)",
    )
    parser.add_argument(
        "--https-verify-incoming",
        action="store_true",
        help="refuse clients without a certificate signed by --https-ca (Consul's verify_incoming)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")


def management_token(args: argparse.Namespace) -> TokenFile | None:
    """The --acl-token-file (None: ACLs disabled); TokenFileError naming the option."""
    if args.acl_token_file is None:
        return None
    token = TokenFile(args.acl_token_file, "--acl-token-file")
    if token.current() == ANONYMOUS_SECRET:
        raise TokenFileError(
            f"--acl-token-file {args.acl_token_file}: 'anonymous' is Consul's anonymous "
            "token, not a management token"
        )
    return token


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The HTTPS context (None: plain HTTP); ValueError naming the option."""
    if args.https_cert is None and args.https_key is None:
        if args.https_ca is not None or args.https_verify_incoming:
            raise ValueError(
                "--https-ca and --https-verify-incoming need --https-cert and --https-key"
            )
        return None
    if args.https_cert is None or args.https_key is None:
        raise ValueError("--https-cert and --https-key go together")
    return server_context(
        args.https_cert, args.https_key, args.https_ca, args.https_verify_incoming
    )


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"--listen must be HOST:PORT with PORT 0-65535, got {text!r}")
    return host.strip("[]"), int(port_text)


def _advertised(host: str) -> str:
    """The address Consul would report for itself: a wildcard listen means loopback here."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def run(args: argparse.Namespace) -> int:
    setup_logging("consul-dev", args.node_name, args.log_level)
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    if not args.node_name:
        log.error("--node-name must not be empty")
        return 2
    try:
        token = management_token(args)
        tls = tls_context(args)
    except ValueError as exc:  # TokenFileError included
        log.error("%s", exc)
        return 2
    scheme = "http" if tls is None else "https"
    data_dir = DataDir(args.data_dir) if args.data_dir is not None else None
    try:
        doc = None
        if data_dir is not None:
            data_dir.lock()
            doc = data_dir.load()
        if doc is not None and doc.get("node_name") != args.node_name:
            raise DataDirError(
                f"{data_dir.file if data_dir else ''} holds the state of node "
                f"{doc.get('node_name')!r}, not {args.node_name!r}: start with --node-name "
                f"{doc.get('node_name')} or use another --data-dir"
            )
    except DataDirError as exc:
        log.error("%s", exc)
        return 2

    async def main(stop: asyncio.Event) -> int:
        now = asyncio.get_running_loop().time()
        if doc is None:
            state = ConsulState(args.node_name, address=_advertised(host))
        else:
            try:
                state = ConsulState.restore(doc, now)
            except ValueError as exc:
                log.error("%s: %s", data_dir.file if data_dir else "state", exc)
                return 2
            log.info(
                "loaded %s: index %d, %d key(s), %d session(s) (their TTLs start afresh)",
                data_dir.file if data_dir else "",
                state.last_index,
                len(state.kv.entries),
                len(state.sessions),
            )
        server = ConsulHTTP(
            state,
            leader=_host_port(_advertised(host), 8300),
            persist=data_dir.save if data_dir is not None else None,
            management_token=token.current if token is not None else None,
        )
        if data_dir is not None and doc is None:
            try:
                data_dir.save(state.snapshot())  # the node's identity from the first start on
            except OSError as exc:
                log.error("cannot write %s: %s", data_dir.file, exc.strerror or exc)
                return 1
        runner = web.AppRunner(server.app, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        try:
            await site.start()
        except OSError as exc:
            log.error("cannot listen on %s: %s", args.listen, exc.strerror or exc)
            await runner.cleanup()
            return 1
        bound = runner.addresses[0]
        address = _host_port(bound[0], bound[1])
        server.start()
        log.info(
            "serving the Consul HTTP API on %s://%s (node %s, %s, %s%s)",
            scheme,
            address,
            args.node_name,
            f"state in {data_dir.file}" if data_dir else "state in memory only",
            "ACLs disabled (no --acl-token-file): every request is allowed"
            if token is None
            else f"ACLs enabled, default policy deny, management token in {token.path}",
            ", client certificates required" if args.https_verify_incoming else "",
        )
        print(f"serving on {scheme}://{address}", flush=True)
        stopping = asyncio.create_task(stop.wait())
        failing = asyncio.create_task(server.failed.wait())
        await asyncio.wait({stopping, failing}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        failing.cancel()
        log.info("stopping")
        server.close()  # blocked queries answer now, so the runner has nothing to wait for
        await runner.cleanup()
        if data_dir is not None:
            data_dir.unlock()
        return 1 if server.failed.is_set() else 0

    return run_service(main)
