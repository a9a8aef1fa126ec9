"""`hexmq certs`: the cluster CA and its certificates, for deployments that `hexmq cluster up`
does not make (compose, Kubernetes, machines of your own; docs/security.md).

    hexmq certs cluster --dir DIR --nodes n1,n2,n3      CA (once) + every service + an operator
    hexmq certs ca --dir DIR                            a new CA (never replaces one)
    hexmq certs issue --dir DIR --role ROLE --node N    one certificate (a renewal replaces it)
    hexmq certs request --role ROLE --node N --out D    key + CSR for a CA of your own
    hexmq certs show FILE                               the identity, names and validity

Exit codes: 0 done, 1 failed (the message says why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hexmq.trust import certs
from hexmq.trust.identity import (
    DEFAULT_TRUST_DOMAIN,
    NODE_ROLES,
    OPERATOR,
    ROLES,
    Identity,
    IdentityError,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def _names(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dns",
        action="append",
        default=[],
        metavar="NAME",
        help="also name this host (repeatable): tools that check a server by its host name",
    )
    p.add_argument(
        "--ip", action="append", default=[], metavar="ADDR", help="also name this address"
    )
    p.add_argument(
        "--trust-domain",
        default=DEFAULT_TRUST_DOMAIN,
        help="the cluster's trust domain (--cluster-trust-domain; default %(default)s)",
    )


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Make the cluster CA and the certificates of its services and operators "
        "(mutual TLS inside the cluster, docs/security.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser(
        "cluster",
        help="the CA (made if DIR has none) and a certificate for every service of every "
        "node and for an operator; existing certificates are kept",
    )
    p.add_argument("--dir", type=Path, required=True, help="where the CA and certificates go")
    p.add_argument("--nodes", required=True, metavar="N1,N2,...", help="the node ids")
    p.add_argument("--operator", default="admin", help="the operator's name (default admin)")
    p.add_argument("--days", type=int, default=certs.LEAF_DAYS, help="validity of each")
    _names(p)

    p = actions.add_parser("ca", help="a new CA in DIR (ca.crt, ca.key); never replaces one")
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--name", default="hexmq cluster CA", help="the CA's common name")
    p.add_argument("--days", type=int, default=certs.CA_DAYS)

    p = actions.add_parser(
        "issue",
        help="a new key and certificate for one identity, signed by DIR's CA (replaces the "
        "one there: a renewal, which running services pick up)",
    )
    p.add_argument("--dir", type=Path, required=True, help="the CA's directory")
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--node", required=True, help="the node id (an operator: its name)")
    p.add_argument("--days", type=int, default=certs.LEAF_DAYS)
    p.add_argument("--out-cert", type=Path, help="write here (default DIR/NODE/ROLE.crt)")
    p.add_argument("--out-key", type=Path, help="(default DIR/NODE/ROLE.key)")
    _names(p)

    p = actions.add_parser(
        "request",
        help="a new key and a certificate signing request (PEM) for a CA of your own: sign it "
        "with the extensions it asks for",
    )
    p.add_argument("--role", choices=ROLES, required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--out", type=Path, required=True, help="directory for ROLE-NODE.key/.csr")
    _names(p)

    p = actions.add_parser("show", help="what a certificate says: identity, names, validity")
    p.add_argument("file", type=Path)
    p.add_argument("--trust-domain", default=DEFAULT_TRUST_DOMAIN)
    return parser


def _node_ids(text: str) -> list[str]:
    ids = [n.strip() for n in text.split(",") if n.strip()]
    if not ids:
        raise IdentityError("--nodes lists no node id")
    return ids


def run(args: argparse.Namespace) -> int:
    if args.action == "ca":
        files = certs.make_ca(args.dir, name=args.name, days=args.days)
        print(f"CA: {files.cert} (key {files.key}: keep it offline in production)")
    elif args.action == "issue":
        identity = Identity(args.role, args.node)
        out = None
        if args.out_cert or args.out_key:
            if not (args.out_cert and args.out_key):
                raise IdentityError("--out-cert and --out-key go together")
            out = certs.CertFiles(args.out_cert, args.out_key)
        files = certs.issue(
            args.dir,
            identity,
            out=out,
            trust_domain=args.trust_domain,
            dns_names=args.dns,
            ip_addresses=args.ip,
            days=args.days,
        )
        print(f"{identity}: {files.cert} (key {files.key})")
    elif args.action == "cluster":
        if not (args.dir / certs.CA_CERT).exists():
            certs.make_ca(args.dir)
            print(f"CA: {args.dir / certs.CA_CERT}")
        wanted = [Identity(role, n) for n in _node_ids(args.nodes) for role in NODE_ROLES]
        wanted.append(Identity(OPERATOR, args.operator))
        for identity in wanted:
            files = certs.identity_files(args.dir, identity)
            if files.cert.exists():
                print(f"{identity}: {files.cert} (kept)")
                continue
            certs.issue(
                args.dir,
                identity,
                trust_domain=args.trust_domain,
                dns_names=args.dns,
                ip_addresses=args.ip,
                days=args.days,
            )
            print(f"{identity}: {files.cert}")
    elif args.action == "request":
        key, csr = certs.request(
            Identity(args.role, args.node),
            args.out,
            trust_domain=args.trust_domain,
            dns_names=args.dns,
            ip_addresses=args.ip,
        )
        print(f"key {key}, request {csr}")
    else:  # show
        info = certs.describe(args.file, args.trust_domain)
        print(f"identity:  {info.identity or 'none of trust domain ' + repr(args.trust_domain)}")
        print(f"subject:   {info.subject}")
        print(f"issuer:    {info.issuer}")
        print(f"valid:     {info.not_before:%Y-%m-%d %H:%M} to {info.not_after:%Y-%m-%d %H:%M} UTC")
        print(f"dns names: {', '.join(info.dns_names) or '-'}")
    return EXIT_OK


def main(argv: Sequence[str], prog: str = "hexmq certs") -> int:
    args = build_parser(prog).parse_args(list(argv))
    try:
        return run(args)
    except (certs.CertError, IdentityError, OSError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
