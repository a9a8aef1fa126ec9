"""The fault runs of `make test-fault` (docs/faults.md): the fixed, seeded set, or with
FAULT_RUNS=N (FAULT_SEED=S) N random runs. Each run is `python -m tests.faults run ...` in a
network namespace of its own; a failure prints the run's failures and the command that
replays it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import HEXMQ
from tests.faults.conftest import RunFaults
from tests.faults.crosscheck import run_crosscheck
from tests.faults.specs import (
    FIXED,
    RESULTS,
    RunSpec,
    campaign_from_environment,
    random_specs,
)

CAMPAIGN = campaign_from_environment()
CAMPAIGN_SPECS = random_specs(*CAMPAIGN) if CAMPAIGN else []
CAMPAIGN_DIR = RESULTS / (f"campaign-{CAMPAIGN[1]}" if CAMPAIGN else "campaign")
FIXED_DIR = RESULTS / "fixed"


def _check(spec: RunSpec, out: Path, run_faults: RunFaults) -> None:
    argv = spec.argv(out)
    result = run_faults(argv, out / spec.name)
    verdict = result["verdict"]
    replay = f"python -m tests.faults {' '.join(argv)}"
    print(f"{spec.name}: {json.dumps(result.get('counts'))} -> {out / spec.name}")
    assert verdict["ok"], (
        f"fault run {spec.name} (seed {spec.seed}) failed: {verdict['failures']}\n"
        f"faults: {[(f['kind'], f['targets']['nodes']) for f in result.get('faults', [])]}\n"
        f"result: {out / spec.name / 'result.json'}\nreplay: {replay}\n" + result.get("error", "")
    )
    if spec.trace:
        # The Spark job's audit and failover timeline of the same run (docs/faults.md).
        agreed = run_crosscheck(out / spec.name, HEXMQ)
        (out / spec.name / "crosscheck.json").write_text(json.dumps(agreed, indent=1) + "\n")
        print(f"{spec.name}: trace cross-check {json.dumps(agreed['counts'])}")
        assert not agreed["problems"], (
            f"the Spark job and the checker disagree on {spec.name}: {agreed['problems']}\n"
            f"replay: {replay}"
        )


@pytest.mark.fault
@pytest.mark.timeout(1500)
@pytest.mark.skipif(CAMPAIGN is not None, reason="FAULT_RUNS set: the random campaign runs")
@pytest.mark.parametrize("spec", FIXED, ids=[s.name for s in FIXED])
def test_fixed_schedule(spec: RunSpec, run_faults: RunFaults) -> None:
    _check(spec, FIXED_DIR.absolute(), run_faults)


@pytest.mark.fault
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("spec", CAMPAIGN_SPECS, ids=[s.name for s in CAMPAIGN_SPECS])
def test_random_schedule(spec: RunSpec, run_faults: RunFaults) -> None:
    _check(spec, CAMPAIGN_DIR.absolute(), run_faults)
