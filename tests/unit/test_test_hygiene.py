"""The test suite's own rules: mypy does not check tests/ (make typecheck covers hexmq,
services, hexmq_cli and spark), so a `type: ignore` comment there would be read by nothing."""

from __future__ import annotations

from pathlib import Path

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
