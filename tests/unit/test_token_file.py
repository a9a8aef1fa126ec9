"""TokenFile (services/membership/token_file.py): a token read from a file at start, refused
there when unusable, and read again only when the file changes (a rotation)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from services.membership import token_file
from services.membership.token_file import RACY_NS, TokenFile, TokenFileError


def rotate(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_the_token_is_the_files_content_stripped(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  f00d-token\n")
    assert TokenFile(path, "--acl-token-file").current() == "f00d-token"


@pytest.mark.parametrize(
    ("content", "why"),
    [(None, "cannot read it"), ("", "is empty"), (" \n", "is empty"), (b"\xff\xfe", "UTF-8")],
)
def test_an_unusable_file_is_refused_at_start_naming_the_option(
    tmp_path: Path, content: str | bytes | None, why: str
) -> None:
    path = tmp_path / "token"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(TokenFileError) as info:
        TokenFile(path, "--consul-token-file")
    assert str(info.value).startswith(f"--consul-token-file {path}")
    assert why in str(info.value)


def test_a_rotation_is_picked_up_and_the_file_is_read_only_when_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("old\n")
    later = 0  # how far the clock is ahead of the file's last change

    def clock() -> int:
        return time.time_ns() + later

    later = 10 * RACY_NS  # the file was written a while ago
    token = TokenFile(path, "--acl-token-file", clock=clock)
    reads = 0
    read = TokenFile._read

    def counting(self: TokenFile) -> str:
        nonlocal reads
        reads += 1
        return read(self)

    monkeypatch.setattr(TokenFile, "_read", counting)
    for _ in range(100):
        assert token.current() == "old"
    assert reads == 0  # one stat() per call, no read while nothing changed
    caplog.set_level(logging.INFO, logger=token_file.log.name)
    later = 0
    rotate(path, "new\n")
    assert token.current() == "new"
    assert token.current() == "new"
    assert reads == 2  # a file changed within a tick of the read is read again...
    later = 10 * RACY_NS
    assert token.current() == "new"
    assert token.current() == "new"
    assert reads == 3  # ... until it has been quiet for a while: then no more
    assert "changed: using the new token" in caplog.text
    assert "new" not in caplog.text.replace("the new token", "")  # the token is never logged


def test_a_same_size_write_within_the_file_times_tick_is_not_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # File times that tick once a second (coarser than here, as on some file systems): two
    # writes in one tick leave the same times.
    def coarse(st: os.stat_result) -> tuple[int, int, int, int, int]:
        second = 1_000_000_000
        return (
            st.st_dev,
            st.st_ino,
            st.st_size,
            st.st_mtime_ns // second,
            st.st_ctime_ns // second,
        )

    monkeypatch.setattr(token_file, "_signature", coarse)
    monkeypatch.setattr(token_file, "RACY_NS", 2)  # in those coarse units: 2 s
    path = tmp_path / "token"
    path.write_text("aaaa\n")
    token = TokenFile(path, "--acl-token-file", clock=lambda: time.time_ns() // 1_000_000_000)
    path.write_text("bbbb\n")  # same size, in place, most likely within the same second
    assert token.current() == "bbbb"


def test_a_half_written_or_removed_file_keeps_the_last_token_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "token"
    path.write_text("good\n")
    token = TokenFile(path, "--acl-token-file")
    path.write_text("")  # a truncating write caught half-way
    caplog.set_level(logging.WARNING, logger=token_file.log.name)
    for _ in range(5):
        assert token.current() == "good"
    path.unlink()
    for _ in range(5):
        assert token.current() == "good"
    warnings = [r for r in caplog.records if "keeping the previous token" in r.getMessage()]
    assert len(warnings) == 2  # one for the empty file, one for the missing one
    rotate(path, "better\n")
    assert token.current() == "better"
