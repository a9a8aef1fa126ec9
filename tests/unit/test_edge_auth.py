"""Password files (mosquitto_passwd's formats) and the edge's verdict on CONNECT credentials."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.edge.access import AccessControl
from services.edge.auth import PasswordFile, hash_password, parse_hash
from services.edge.passwd import set_password
from tests.support.access import MOSQUITTO_FILE


# Written by mosquitto_passwd 2.0.11 (`-b` for alice, `-H sha512 -b` for bob).
def test_mosquitto_passwd_hashes_verify() -> None:
    users = PasswordFile.parse(MOSQUITTO_FILE, "pw")
    assert users.verify("alice", b"secret")
    assert users.verify("bob", b"s2")
    assert not users.verify("alice", b"Secret")
    assert not users.verify("bob", b"secret")
    assert not users.verify("carol", b"secret")
    assert users.verify("alice", b"secret")  # again, from the cache of verified logins


def test_hash_password_writes_what_mosquitto_reads() -> None:
    line = hash_password("pa55", salt=b"0123456789ab")
    assert line.startswith("$7$101$MDEyMzQ1Njc4OWFi$")
    entry = parse_hash(line)
    assert entry.matches(b"pa55")
    assert not entry.matches(b"pa56")
    assert parse_hash(hash_password("x", iterations=1000)).iterations == 1000


def test_comments_blank_lines_and_surrounding_spaces_are_ignored() -> None:
    text = f"# users\n\n  carol:{hash_password('c')}  \n"
    assert PasswordFile.parse(text, "pw").verify("carol", b"c")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("no-colon-here", "expected USER:HASH"),
        (":$7$101$AAAA$AAAA", "expected USER:HASH"),
        ("dave:plaintext", "unknown password hash"),
        ("dave:$7$many$AAAA$AAAA", "iteration count 'many' is not a number"),
        ("dave:$7$0$AAAA$AAAA", "at least 1"),
        ("dave:$7$101$not base64!$AAAA", "salt is not valid base64"),
        ("dave:$6$AAAA$AAAA", "must be 64 bytes"),
        ("dave:$5$AAAA$AAAA", "unknown password hash"),
    ],
)
def test_a_bad_line_is_named_with_file_and_line(line: str, message: str) -> None:
    text = f"# header\n{MOSQUITTO_FILE}{line}\n"
    with pytest.raises(ValueError) as err:
        PasswordFile.parse(text, "/etc/hexmq/passwd")
    assert "password file /etc/hexmq/passwd, line 4" in str(err.value)
    assert message in str(err.value)


def test_a_user_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"line 3.*'alice' appears twice"):
        PasswordFile.parse(MOSQUITTO_FILE + "alice:" + hash_password("x"), "pw")


def test_load_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"cannot read password file {tmp_path}/nope"):
        PasswordFile.load(tmp_path / "nope")


def test_authenticate_codes() -> None:
    users = PasswordFile.parse(MOSQUITTO_FILE, "pw")
    closed = AccessControl(users, allow_anonymous=False)
    assert closed.authenticate("alice", b"secret") == (0, "")
    assert closed.authenticate("alice", b"wrong")[0] == 0x86
    assert closed.authenticate("alice", None)[0] == 0x86
    assert closed.authenticate("nobody", b"secret")[0] == 0x86
    assert closed.authenticate(None, None)[0] == 0x87
    assert closed.authenticate(None, b"secret")[0] == 0x87
    open_ = AccessControl(users, allow_anonymous=True)
    assert open_.authenticate(None, None) == (0, "")
    assert open_.authenticate("alice", b"wrong")[0] == 0x86  # a wrong password is not anonymous
    # Without a password file a user name is taken as given.
    assert AccessControl().authenticate("anyone", None) == (0, "")


def test_passwd_helper_adds_and_replaces_users(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    path.write_text(MOSQUITTO_FILE)
    set_password(path, "carol", "c1", 101)
    set_password(path, "alice", "new", 101)
    users = PasswordFile.load(path)
    assert sorted(users.users) == ["alice", "bob", "carol"]
    assert users.verify("alice", b"new")
    assert users.verify("bob", b"s2")
    assert users.verify("carol", b"c1")
    assert path.stat().st_mode & 0o777 == 0o600
