"""bench's hexmq with several edge processes per node (`--edges-per-node`, issue 28)."""

from __future__ import annotations

import pytest

from bench import cli
from bench.brokers import Hexmq


def test_a_hexmq_with_two_edges_per_node_is_told_apart() -> None:
    assert Hexmq().label == "hexmq"
    assert Hexmq(edges=2).label == "hexmq-2e"
    assert Hexmq(edges=2).edges == 2
    assert Hexmq(edges=2, variant="plain").label == "hexmq-plain"


def test_the_single_suite_takes_a_list_of_edge_counts() -> None:
    parser = cli.build_parser()
    assert parser.parse_args([]).edges_per_node == [1]
    assert parser.parse_args(["--edges-per-node", "1,2"]).edges_per_node == [1, 2]
    for bad in ("0", "1,1", "6", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--edges-per-node", bad])
