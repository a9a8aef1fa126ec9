"""`hexmq secrets init`: every secret a deployment of hexmq needs, made once in one directory,
for deployments that `hexmq cluster up` does not make (compose's `secrets` volume, the source
of Kubernetes Secrets; docs/deploy.md).

    hexmq secrets init --dir DIR --nodes n1,n2,n3 [--consul-config] [--owner READER=UID[:GID]]

What it writes under DIR, keeping every file that exists (a second run changes nothing, a run
with more nodes adds theirs):

    tls/                    exactly what `hexmq certs cluster` writes (hexmq_cli.certs_cli): ca.crt,
                            ca.key, <node>/{edge,partition,membership}.crt|key, operator/<name>.*
    consul.token            the Consul ACL token the membership agents send (--consul-token-file)
    consul-acl.json         with --consul-config: the Consul agent's ACL config, ACLs on, default
                            policy deny, consul.token its initial management token
    redis/<node>.password   the node's Redis password for user `hexmq` (--redis-password-file)
    redis/<node>.acl        the node's Redis ACL file (`redis-server --aclfile`): `default` off,
                            `hexmq` with the password's SHA-256 only (hexmq.redis_security)

Who reads what, and so who owns it (`--owner READER=UID[:GID]`; without it a file stays with the
user that runs the command). Private files are 0600, certificates 0644, directories 0755:

    hexmq   the services     tls/<node>/<role>.key, consul.token, redis/<node>.password
    redis   redis-server     redis/<node>.acl
    consul  the Consul agent consul-acl.json
    (none)                   tls/ca.key and the operator's key: no service needs them

Nothing secret is printed, and nothing is taken from the command line. Exit codes: 0 done,
1 failed (the message says why), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from hexmq.redis_security import HEXMQ_USER, acl_lines, generate_password
from hexmq.trust import certs
from hexmq.trust.identity import DEFAULT_TRUST_DOMAIN, NODE_ROLES, Identity, IdentityError
from hexmq_cli import certs_cli

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

TLS_DIR: Final = "tls"
CONSUL_TOKEN: Final = "consul.token"
CONSUL_ACL_CONFIG: Final = "consul-acl.json"
REDIS_DIR: Final = "redis"
HEXMQ, REDIS, CONSUL = "hexmq", "redis", "consul"
READERS: Final = (HEXMQ, REDIS, CONSUL)

PRIVATE: Final = 0o600
PUBLIC: Final = 0o644
DIRECTORY: Final = 0o755


class SecretsError(ValueError):
    """What is in DIR cannot be completed without replacing something; the message says why."""


@dataclass(frozen=True, slots=True)
class Owner:
    uid: int
    gid: int = -1  # -1: the group stays as it is

    def __str__(self) -> str:
        return f"{self.uid}" if self.gid < 0 else f"{self.uid}:{self.gid}"


def parse_owner(text: str) -> tuple[str, Owner]:
    """`READER=UID[:GID]` (argparse type)."""
    reader, sep, ids = text.partition("=")
    uid_text, _, gid_text = ids.partition(":")
    if not sep or reader not in READERS or not uid_text.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected READER=UID[:GID] with READER one of {', '.join(READERS)}, got {text!r}"
        )
    if gid_text and not gid_text.isdigit():
        raise argparse.ArgumentTypeError(f"a group id is a number, got {gid_text!r}")
    return reader, Owner(int(uid_text), int(gid_text) if gid_text else -1)


def redis_password_file(directory: Path, node: str) -> Path:
    return directory / REDIS_DIR / f"{node}.password"


def redis_acl_file(directory: Path, node: str) -> Path:
    return directory / REDIS_DIR / f"{node}.acl"


def consul_acl_config(token: str) -> dict[str, object]:
    """The Consul agent's `acl` block (Consul 1.11+ names; `master` before). The agent token is
    the management token too: the single server then registers its own node in the catalog,
    where with no agent token it logs "blocked by ACLs" on every sync under default deny."""
    return {
        "acl": {
            "enabled": True,
            "default_policy": "deny",
            "enable_token_persistence": True,
            "tokens": {"initial_management": token, "agent": token},
        }
    }


def _node_ids(text: str) -> list[str]:
    ids = [n.strip() for n in text.split(",") if n.strip()]
    if not ids:
        raise IdentityError("--nodes lists no node id")
    for node in ids:
        Identity(NODE_ROLES[0], node)  # a node id as the certificates take it
    return ids


class _Writer:
    """Writes new files complete, with their owner and mode, in one rename: a reader never
    sees a half-written secret, nor one briefly readable by somebody else."""

    def __init__(
        self, directory: Path, owners: dict[str, Owner], say: Callable[[str], None]
    ) -> None:
        self.directory = directory
        self.owners = owners
        self.say = say
        self.made: list[Path] = []

    def _describe(self, path: Path, reader: str | None, mode: int) -> str:
        owner = self.owners.get(reader) if reader else None
        who = f", {reader} {owner}" if owner else ""
        return f"{path.relative_to(self.directory)} ({mode:04o}{who})"

    def settle(self, path: Path, reader: str | None, mode: int) -> None:
        """Give a file just made its owner and mode."""
        owner = self.owners.get(reader) if reader else None
        if owner is not None:
            os.chown(path, owner.uid, owner.gid)
        os.chmod(path, mode)
        self.made.append(path)
        self.say(f"made {self._describe(path, reader, mode)}")

    def directory_for(self, path: Path) -> None:
        missing = [p for p in (path, *path.parents) if not p.exists()]
        for folder in reversed(missing):
            folder.mkdir()
            os.chmod(folder, DIRECTORY)

    def write(self, path: Path, text: str, reader: str | None, mode: int = PRIVATE) -> None:
        self.directory_for(path.parent)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            owner = self.owners.get(reader) if reader else None
            if owner is not None:
                os.chown(tmp, owner.uid, owner.gid)
            os.chmod(tmp, mode)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, path)
        self.made.append(path)
        self.say(f"made {self._describe(path, reader, mode)}")


def _check_completable(directory: Path, nodes: Sequence[str]) -> None:
    """Refuse, before anything is written, what could only be completed by replacing a file."""
    # A new token would not be the one Consul's config names (with --consul-config or not).
    if (directory / CONSUL_ACL_CONFIG).exists() and not (directory / CONSUL_TOKEN).exists():
        raise SecretsError(
            f"{directory / CONSUL_ACL_CONFIG} exists without {CONSUL_TOKEN}: restore the "
            "token, or remove both to make new ones"
        )
    for node in nodes:
        if redis_acl_file(directory, node).exists() and not (
            redis_password_file(directory, node).exists()
        ):
            raise SecretsError(
                f"{redis_acl_file(directory, node)} exists without its password file: restore "
                f"{redis_password_file(directory, node).name}, or remove both to make new ones"
            )


def _check_owners(owners: dict[str, Owner]) -> None:
    """Only root may give a file to another user: say so now, not half-way through."""
    euid = os.geteuid()
    others = sorted(r for r, o in owners.items() if o.uid != euid)
    if euid != 0 and others:
        raise SecretsError(
            f"--owner {', '.join(others)}: only root may hand files to another user (in "
            "compose the secrets service runs as user 0)"
        )


def _tls(
    directory: Path,
    nodes: Sequence[str],
    operator: str,
    trust_domain: str,
    writer: _Writer,
) -> None:
    """`hexmq certs cluster` itself, then the new files handed to their readers."""
    tls = directory / TLS_DIR
    writer.directory_for(tls)
    before = set(tls.rglob("*"))
    args = certs_cli.build_parser("hexmq secrets init").parse_args(
        [
            "cluster",
            *("--dir", str(tls)),
            *("--nodes", ",".join(nodes)),
            *("--operator", operator),
            *("--trust-domain", trust_domain),
        ]
    )
    with contextlib.redirect_stdout(io.StringIO()):  # each new file is told below, once
        certs_cli.run(args)
    service_keys = {
        certs.identity_files(tls, Identity(role, node)).key for node in nodes for role in NODE_ROLES
    }
    for path in sorted(set(tls.rglob("*")) - before):
        if path.is_dir():
            os.chmod(path, DIRECTORY)
        elif path.suffix == ".key":
            writer.settle(path, HEXMQ if path in service_keys else None, PRIVATE)
        else:
            writer.settle(path, None, PUBLIC)


def init(
    directory: Path,
    nodes: Sequence[str],
    *,
    consul_config: bool = False,
    owners: dict[str, Owner] | None = None,
    operator: str = "admin",
    trust_domain: str = DEFAULT_TRUST_DOMAIN,
    say: Callable[[str], None] = print,
) -> list[Path]:
    """Make what is missing under `directory` (module docstring); the files made. Raises
    SecretsError, CertError, IdentityError or OSError."""
    owners = owners or {}
    _check_owners(owners)
    _check_completable(directory, nodes)
    writer = _Writer(directory, owners, say)
    writer.directory_for(directory)
    _tls(directory, nodes, operator, trust_domain, writer)

    token_file = directory / CONSUL_TOKEN
    if not token_file.exists():
        # A UUID, as Consul makes its tokens (a non-UUID management token is deprecated there).
        writer.write(token_file, f"{uuid.uuid4()}\n", HEXMQ)
    if consul_config and not (directory / CONSUL_ACL_CONFIG).exists():
        token = token_file.read_text().strip()
        config = json.dumps(consul_acl_config(token), indent=2) + "\n"
        writer.write(directory / CONSUL_ACL_CONFIG, config, CONSUL)

    for node in nodes:
        password_file = redis_password_file(directory, node)
        if not password_file.exists():
            writer.write(password_file, generate_password() + "\n", HEXMQ)
        acl_file = redis_acl_file(directory, node)
        if not acl_file.exists():
            password = password_file.read_text().strip()
            writer.write(acl_file, "\n".join(acl_lines(HEXMQ_USER, password)) + "\n", REDIS)
    say(f"{directory}: {len(writer.made)} files made, the others kept")
    return writer.made


def build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Make every secret a deployment of hexmq needs: the cluster CA and its "
        "certificates, the Consul ACL token (and Consul's ACL config), each node's Redis "
        "password and ACL file (docs/deploy.md).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "init",
        help="make what is missing under DIR, keeping every file there (run it again with "
        "more nodes to add theirs)",
    )
    p.add_argument("--dir", type=Path, required=True, help="where the secrets go")
    p.add_argument("--nodes", required=True, metavar="N1,N2,...", help="the node ids")
    p.add_argument(
        "--consul-config",
        action="store_true",
        help=f"also write DIR/{CONSUL_ACL_CONFIG}, the Consul agent's ACL config (ACLs on, "
        f"default deny, DIR/{CONSUL_TOKEN} the management token): give it to Consul with "
        "-config-file",
    )
    p.add_argument(
        "--owner",
        action="append",
        type=parse_owner,
        default=[],
        metavar="READER=UID[:GID]",
        help=f"give the files READER reads ({', '.join(READERS)}) to this user (repeatable; "
        "needs root): e.g. hexmq=10001 redis=999 consul=100, the users of the hexmq, redis "
        "and consul images",
    )
    p.add_argument("--operator", default="admin", help="the operator certificate's name")
    p.add_argument(
        "--trust-domain",
        default=DEFAULT_TRUST_DOMAIN,
        help="the cluster's trust domain (--cluster-trust-domain; default %(default)s)",
    )
    return parser


def main(argv: Sequence[str], prog: str = "hexmq secrets") -> int:
    args = build_parser(prog).parse_args(list(argv))
    try:
        init(
            args.dir,
            _node_ids(args.nodes),
            consul_config=args.consul_config,
            owners=dict(args.owner),
            operator=args.operator,
            trust_domain=args.trust_domain,
        )
    except (SecretsError, certs.CertError, IdentityError, OSError) as exc:
        print(f"{prog} {args.action}: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
