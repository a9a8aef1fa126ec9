"""How make test's and make test-colocated's clusters are packed (tests/conftest.py,
`separate_unless_told`): a process per service unless a test names a packing, co-located nodes
under HEXMQ_TEST_PACKING=colocated, and a test's own choice either way."""

from __future__ import annotations

import pytest

from tests.conftest import PACKING_VARIABLE, separate_unless_told


def test_make_test_packs_a_process_per_service_unless_a_test_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PACKING_VARIABLE, raising=False)
    assert separate_unless_told(["--rf", "2"]) == ["--separate"]
    assert separate_unless_told(["--colocated"]) == []
    assert separate_unless_told(["--edges-per-node", "2"]) == []


def test_make_test_colocated_packs_co_located_nodes_where_no_test_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PACKING_VARIABLE, "colocated")
    assert separate_unless_told(["--rf", "2"]) == ["--colocated"]
    # A test that kills one service of a node keeps its process per service.
    assert separate_unless_told(["--rf", "2", "--separate"]) == []
    monkeypatch.setenv(PACKING_VARIABLE, "one-big-process")
    with pytest.raises(pytest.UsageError, match="separate or colocated"):
        separate_unless_told([])
