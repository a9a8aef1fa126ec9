"""How the partition service reaches its node's Redis: as whom (an ACL user and its password)
and how it knows it is talking to that Redis (TLS, for a `rediss://` URL).

Both of the service's clients take one RedisAccess, built once from the options by
`from_options`: redis-py's pool for reads and snapshots (services/partition/store.py
`redis_client`) and the hot path's transaction writer (services/partition/redis_tx.py), so
they authenticate as the same user and trust the same certificates.

The password comes from a file (`--redis-password-file`) or the environment
(HEXMQ_REDIS_PASSWORD), never from a command line: any local user reads command lines with
`ps`. One in the `--redis` URL still works, with a warning. docs/operations.md, "The partition
service's Redis", has the operator's side (the redis.conf lines, hexmq/redis_security.py).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio.connection import parse_url

# The environment variable with the password (not an option: hexmq.envoptions.NOT_OPTIONS).
PASSWORD_VARIABLE: Final = "HEXMQ_REDIS_PASSWORD"
SCHEMES: Final = ("redis://", "rediss://", "unix://")


@dataclass(frozen=True, slots=True)
class RedisAccess:
    """Credentials and TLS settings for the node's Redis. TLS is on when the URL is
    `rediss://`; then Redis's certificate must be signed by `ca` or a CA the system trusts
    (redis-py adds `ca` to the system's) and name the URL's host, and `cert`/`key` are this
    client's certificate (for a Redis with `tls-auth-clients yes`)."""

    user: str | None = None  # None: Redis's `default` user
    password: str | None = field(default=None, repr=False)
    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    @property
    def who(self) -> str:
        """The user as Redis knows it, for messages."""
        return self.user or "default"

    def auth_args(self) -> tuple[str, ...]:
        """AUTH's arguments ([user] password); () without a password."""
        if self.password is None:
            return ()
        return (self.user, self.password) if self.user else (self.password,)

    def pool_options(self, url: str) -> dict[str, Any]:
        """redis-py's connection keyword arguments for the Redis at `url`."""
        # No CLIENT SETINFO on connect (redis-py naming itself): Redis 7.0 has no such command
        # and from 7.2 the ACL user for hexmq may not run it (hexmq/redis_security.py).
        options: dict[str, Any] = {"driver_info": None}
        if self.password is not None:
            options["password"] = self.password
            if self.user:
                options["username"] = self.user
        if is_tls(url):
            # What redis-py makes of these is what ssl_context() makes: one trust for both.
            options.update(
                ssl_cert_reqs="required",
                ssl_check_hostname=True,
                ssl_ca_certs=self.ca,
                ssl_certfile=self.cert,
                ssl_keyfile=self.key,
            )
        return options

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context redis-py's SSLConnection builds from pool_options(): the system's
        CAs and `ca`, host name checked, this client's certificate if given. ValueError naming
        the option whose file cannot be used."""
        context = ssl.create_default_context()
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        if self.cert is not None:
            try:
                context.load_cert_chain(certfile=self.cert, keyfile=self.key)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(
                    f"--redis-cert {self.cert} / --redis-key {self.key}: {_why(exc)}"
                ) from None
        if self.ca is not None:
            try:
                context.load_verify_locations(cafile=self.ca)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"--redis-ca {self.ca}: {_why(exc)}") from None
        return context


def is_tls(url: str) -> bool:
    return url.startswith("rediss://")


def redacted(url: str) -> str:
    """The URL with any password replaced by ***, for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)


def read_password_file(path: Path) -> str:
    try:
        password = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--redis-password-file {path}: cannot read it: {_why(exc)}") from None
    if not password:
        raise ValueError(f"--redis-password-file {path} is empty")
    return password


def from_options(
    url: str,
    *,
    user: str | None,
    password_file: Path | None,
    ca: str | None,
    cert: str | None,
    key: str | None,
    environ: Mapping[str, str],
) -> tuple[RedisAccess, list[str]]:
    """The access the options describe, and warnings to log; ValueError naming the option
    for settings that cannot work together or files that cannot be used."""
    if not url.startswith(SCHEMES):
        raise ValueError(
            f"--redis must be a redis://, rediss:// or unix:// URL, got {redacted(url)!r}"
        )
    params = parse_url(url)
    warnings: list[str] = []
    sources: dict[str, str] = {}
    if params.get("password"):
        sources["the --redis URL"] = params["password"]
        warnings.append(
            "--redis holds a password: on a command line any local user sees it with `ps`; "
            f"give it with --redis-password-file FILE or {PASSWORD_VARIABLE} instead"
        )
    if password_file is not None:
        sources["--redis-password-file"] = read_password_file(password_file)
    if environ.get(PASSWORD_VARIABLE, "").strip():
        sources[PASSWORD_VARIABLE] = environ[PASSWORD_VARIABLE].strip()
    if len(sources) > 1:
        raise ValueError(
            f"the Redis password is given {len(sources)} ways ({', '.join(sources)}): give one"
        )
    password = next(iter(sources.values()), None)
    url_user = params.get("username") or None
    if user and url_user:
        raise ValueError(
            "the Redis user is given both by --redis-user and in the --redis URL: give one"
        )
    user = user or url_user
    if user and password is None:
        raise ValueError(
            f"--redis-user {user} needs a password: --redis-password-file FILE or "
            f"{PASSWORD_VARIABLE}"
        )
    tls_options = [
        name
        for name, value in (("--redis-ca", ca), ("--redis-cert", cert), ("--redis-key", key))
        if value
    ]
    if tls_options and not is_tls(url):
        raise ValueError(f"{', '.join(tls_options)} need a rediss:// URL in --redis (TLS)")
    if (cert is None) != (key is None):
        raise ValueError(
            "--redis-cert and --redis-key go together (a client certificate and its key)"
        )
    access = RedisAccess(user=user, password=password, ca=ca, cert=cert, key=key)
    if is_tls(url):
        access.ssl_context()  # the files are read now: a bad one stops the start, named
    return access, warnings
