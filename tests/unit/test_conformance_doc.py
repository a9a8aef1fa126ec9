"""docs/conformance.md cannot drift from the tests: every test it names exists, every statement
id is well formed and appears once, each status agrees with its tests, and the summary counts
match the tables.

The document's area tables all have the header ``HEADER``; a row is
``| statement | what it says | status | tests |`` with tests written as `` `path::name` ``
(or `` `path::Class::name` ``), or ``-`` when there are none.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "conformance.md"

HEADER = "| statement | what it says | status | tests |"
SEPARATOR = "| --- | --- | --- | --- |"
SUMMARY_HEADER = "| status | statements |"

#: A 5.0 id, a 3.1.1 id marked as such, a section without a numbered id (with a topic in
#: parentheses when the section has more than one such row), or a DESIGN.md guarantee.
STATEMENT = re.compile(
    r"MQTT-\d+\.\d+\.\d+-\d+(?: \(3\.1\.1\))?|§\d+(?:\.\d+)*(?: \([a-z0-9 ]+\))?|G[1-7]"
)
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(\w+(?:::\w+)?)`")
STATUSES = ("met", "partly", "untested", "not yet", "not yet (in progress)")
WITH_TESTS = {"met", "partly"}


class Row(NamedTuple):
    line: int
    statement: str
    says: str
    status: str
    tests: str

    @property
    def refs(self) -> list[tuple[str, str]]:
        return TEST_REF.findall(self.tests)


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


@cache
def doc_lines() -> tuple[str, ...]:
    return tuple(DOC.read_text(encoding="utf-8").splitlines())


@cache
def rows() -> tuple[Row, ...]:
    """Every row of every area table, checked for shape on the way."""
    lines = doc_lines()
    out: list[Row] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != HEADER:
            i += 1
            continue
        assert lines[i + 1].strip() == SEPARATOR, f"line {i + 2}: expected {SEPARATOR!r}"
        i += 2
        while i < len(lines) and lines[i].startswith("|"):
            parts = cells(lines[i])
            assert len(parts) == 4, f"line {i + 1}: {len(parts)} cells, not 4: {lines[i]!r}"
            out.append(Row(i + 1, *parts))
            i += 1
    return tuple(out)


@cache
def defined(path: str) -> frozenset[str]:
    """Functions of a test file, top level (``name``) and in classes (``Class::name``)."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"), filename=path)
    names: set[str] = set()
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, functions):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            methods = (item for item in node.body if isinstance(item, functions))
            names.update(f"{node.name}::{item.name}" for item in methods)
    return frozenset(names)


def test_the_doc_has_area_tables() -> None:
    assert sum(line.strip() == HEADER for line in doc_lines()) >= 10
    assert len(rows()) >= 100


def test_statement_ids_are_well_formed() -> None:
    bad = [(r.line, r.statement) for r in rows() if not STATEMENT.fullmatch(r.statement)]
    assert bad == []


def test_each_statement_appears_once() -> None:
    counts = Counter(r.statement for r in rows())
    assert [s for s, n in counts.items() if n > 1] == []


def test_every_row_says_something() -> None:
    assert [r.line for r in rows() if not r.says] == []


def test_status_and_tests_agree() -> None:
    for row in rows():
        where = f"line {row.line} ({row.statement})"
        assert row.status in STATUSES, f"{where}: unknown status {row.status!r}"
        # Every mention of a test file is a well-formed reference.
        assert row.tests.count("tests/") == len(row.refs), f"{where}: malformed test reference"
        if row.status in WITH_TESTS:
            assert row.refs, f"{where}: {row.status!r} needs at least one test"
        else:
            assert not row.refs, f"{where}: {row.status!r} names no test"
            assert row.tests.startswith("-"), f"{where}: write '-' when there is no test"


def test_every_referenced_test_exists() -> None:
    # In the tables and in the prose around them.
    missing = []
    for number, line in enumerate(doc_lines(), 1):
        for path, name in TEST_REF.findall(line):
            if not (ROOT / path).is_file():
                missing.append(f"line {number}: no file {path}")
            elif name not in defined(path):
                missing.append(f"line {number}: {path} defines no {name}")
    assert missing == []


def test_summary_matches_the_tables() -> None:
    lines = doc_lines()
    start = next(i for i, line in enumerate(lines) if line.strip() == SUMMARY_HEADER)
    summary: dict[str, int] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        status, count = cells(line)
        summary[status] = int(count)
    counts = Counter(r.status for r in rows())
    assert summary == {**{s: counts[s] for s in STATUSES}, "total": len(rows())}
