"""The fault suite's network machinery in seconds, part of `make test`: a namespace of its
own, two servers as two nodes, NAT by group id, a one-way cut and the heal
(tests/faults/selftest.py). Skips, saying why, where no namespace can be made."""

from __future__ import annotations

from tests.faults.conftest import faults_command


def test_the_namespace_gives_nodes_their_addresses_and_cuts_them(namespace: None) -> None:
    done = faults_command(["selftest"], timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NAT by group id, one-way cut and heal work" in done.stdout
    assert "a node's own cut, plain cuts and a kept port work" in done.stdout


def test_a_run_outside_the_namespace_says_why_it_cannot_start(monkeypatch) -> None:
    from tests.faults import __main__ as cli
    from tests.faults import netns

    monkeypatch.setattr(netns, "why_unavailable", lambda: "the fault suite needs root")
    monkeypatch.delenv(netns.INSIDE, raising=False)
    assert cli.main(["run", "--seed", "1"]) == cli.EXIT_UNAVAILABLE
