"""The partition service's Redis options made into one RedisAccess
(services/partition/redis_access.py): where the password comes from, what goes together, and
what redis-py and the transaction writer are given. Against a real Redis:
tests/integration/test_redis_security.py."""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Any

import pytest

from hexmq_cli import cli
from services.partition.redis_access import (
    PASSWORD_VARIABLE,
    RedisAccess,
    from_options,
    redacted,
)
from services.partition.redis_tx import RedisTransactions
from tests.support.certs import make_certs

URL = "redis://127.0.0.1:6379/0"
TLS_URL = "rediss://127.0.0.1:6380/0"


def options(url: str = URL, env: dict[str, str] | None = None, **given: Any) -> Any:
    kwargs: dict[str, Any] = {
        "user": None,
        "password_file": None,
        "ca": None,
        "cert": None,
        "key": None,
    }
    kwargs.update(given)
    return from_options(url, environ=env or {}, **kwargs)


def secret_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "redis.password"
    path.write_text(text)
    return path


def test_no_credentials_is_the_default_user_without_a_password() -> None:
    access, warnings = options()
    assert access == RedisAccess()
    assert access.who == "default"
    assert access.auth_args() == ()
    assert warnings == []
    assert access.pool_options(URL) == {"driver_info": None}


def test_the_password_file_is_read_and_stripped(tmp_path: Path) -> None:
    path = secret_file(tmp_path, "  pa ss\n")
    access, warnings = options(user="hexmq", password_file=path)
    assert (access.user, access.password, access.who) == ("hexmq", "pa ss", "hexmq")
    assert access.auth_args() == ("hexmq", "pa ss")
    assert warnings == []
    assert "pa ss" not in repr(access)


def test_the_password_from_the_environment(tmp_path: Path) -> None:
    access, _ = options(user="hexmq", env={PASSWORD_VARIABLE: "from-env\n"})
    assert access.password == "from-env"
    access, _ = options(env={PASSWORD_VARIABLE: " "})  # empty: unset
    assert access.password is None


def test_a_password_in_the_url_works_with_a_warning_naming_the_options() -> None:
    access, warnings = options("redis://hexmq:p%40ss@127.0.0.1:6379/0")
    assert (access.user, access.password) == ("hexmq", "p@ss")
    (warning,) = warnings
    assert "`ps`" in warning
    assert "--redis-password-file" in warning
    assert PASSWORD_VARIABLE in warning


@pytest.mark.parametrize(
    ("url", "use_file", "env", "named"),
    [
        ("redis://:a@h:1/0", True, {}, "the --redis URL, --redis-password-file"),
        (
            "redis://:a@h:1/0",
            False,
            {PASSWORD_VARIABLE: "b"},
            f"the --redis URL, {PASSWORD_VARIABLE}",
        ),
        (URL, True, {PASSWORD_VARIABLE: "b"}, f"--redis-password-file, {PASSWORD_VARIABLE}"),
    ],
)
def test_only_one_source_of_the_password(
    tmp_path: Path, url: str, use_file: bool, env: dict[str, str], named: str
) -> None:
    path = secret_file(tmp_path, "c") if use_file else None
    with pytest.raises(ValueError, match="password is given 2 ways") as info:
        options(url, env=env, password_file=path)
    assert named in str(info.value)


def test_an_unreadable_or_empty_password_file_is_refused_naming_the_option(tmp_path: Path) -> None:
    missing = tmp_path / "nothing"
    with pytest.raises(
        ValueError, match=re.escape(f"--redis-password-file {missing}: cannot read it")
    ):
        options(password_file=missing)
    empty = secret_file(tmp_path, " \n")
    with pytest.raises(ValueError, match=re.escape(f"--redis-password-file {empty} is empty")):
        options(password_file=empty)


def test_the_user_is_given_once_and_needs_a_password(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="both by --redis-user and in the --redis URL"):
        options("redis://hexmq:pw@127.0.0.1:6379/0", user="other")
    with pytest.raises(ValueError, match="--redis-user hexmq needs a password"):
        options(user="hexmq")


def test_tls_options_need_a_rediss_url_and_a_certificate_its_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--redis-ca need a rediss:// URL"):
        options(ca="/x/ca.crt")
    with pytest.raises(ValueError, match="--redis-cert and --redis-key go together"):
        options(TLS_URL, cert="/x/c.crt")
    with pytest.raises(ValueError, match="must be a redis://, rediss:// or unix:// URL"):
        options("http://127.0.0.1:6379")


def test_tls_files_are_read_at_start_and_a_bad_one_is_named(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"--redis-ca {tmp_path}/none.crt: ")):
        options(TLS_URL, ca=str(tmp_path / "none.crt"))
    with pytest.raises(ValueError, match=r"--redis-cert .* / --redis-key .*: "):
        options(TLS_URL, cert=str(certs.client_cert), key=str(certs.server_key))  # no pair
    access, _ = options(
        TLS_URL, ca=str(certs.ca), cert=str(certs.client_cert), key=str(certs.client_key)
    )
    context = access.ssl_context()
    assert context.check_hostname
    assert context.verify_mode == ssl.CERT_REQUIRED


def test_redis_py_and_the_writer_are_given_the_same_credentials_and_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path)
    access = RedisAccess(
        "hexmq", "pw", str(certs.ca), str(certs.client_cert), str(certs.client_key)
    )
    assert access.pool_options(TLS_URL) == {
        "driver_info": None,
        "username": "hexmq",
        "password": "pw",
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": str(certs.ca),
        "ssl_certfile": str(certs.client_cert),
        "ssl_keyfile": str(certs.client_key),
    }
    # No TLS settings for a plain URL (redis-py's plain connection takes none).
    assert access.pool_options(URL) == {"driver_info": None, "username": "hexmq", "password": "pw"}
    writer = RedisTransactions(TLS_URL, connect_timeout=1.0, access=access)
    assert writer._handshake == [("AUTH", "hexmq", "pw")]
    assert writer._ssl is not None
    assert RedisTransactions(URL, connect_timeout=1.0, access=access)._ssl is None


def test_a_url_is_logged_without_its_password() -> None:
    assert redacted("redis://hexmq:secret@127.0.0.1:6379/0") == "redis://hexmq:***@127.0.0.1:6379/0"
    assert redacted("rediss://:secret@h:1/0") == "rediss://:***@h:1/0"
    assert redacted(URL) == URL


def test_the_partition_service_refuses_bad_redis_options_before_starting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    base = ["partition", "--node-id", "n1", "--listen", "127.0.0.1:1", "--membership", "h:2"]
    code = cli.main(
        [*base, "--redis", "redis://:inurl@127.0.0.1:1/0"],
        env={"HEXMQ_REDIS_PASSWORD_FILE": str(secret_file(tmp_path, "x"))},
    )
    assert code == cli.EXIT_USAGE
    assert "the Redis password is given 2 ways" in caplog.text
    assert "inurl" not in caplog.text
