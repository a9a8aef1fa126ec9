"""The test suite's own rules: mypy does not check tests/ (make typecheck covers hexmq,
services, hexmq_cli and spark), so a `type: ignore` comment there would be read by nothing; make
test hands out its longest files first (tests/conftest.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import conftest as suite

TESTS = Path(__file__).resolve().parents[1]


def test_no_type_ignore_comments_in_tests() -> None:
    marker = "# type: " + "ignore"  # (split, so that this file does not match itself)
    found = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if marker in line
    ]
    assert found == []


@dataclass
class _Item:
    nodeid: str


def test_make_test_hands_out_the_longest_recorded_files_first_and_unknown_ones_before_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = tmp_path / "file_durations.json"
    record.write_text(json.dumps({"tests/a.py": 5.0, "tests/b.py": 300.0, "tests/c.py": 40.0}))
    monkeypatch.setattr(suite, "FILE_DURATIONS", record)
    names = [
        "tests/a.py::t1",
        "tests/a.py::t2",
        "tests/c.py::t",
        "tests/new.py::t",
        "tests/b.py::t",
    ]
    items: list[Any] = [_Item(name) for name in names]
    suite.pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == [
        "tests/new.py::t",
        "tests/b.py::t",
        "tests/c.py::t",
        "tests/a.py::t1",
        "tests/a.py::t2",
    ]
