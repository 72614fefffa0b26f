"""The kit proves itself: ``kvproto conform`` fails each broken tier on the clause naming its bug (KIT-13),
with the same verdict every run (KIT-19; issue 40: "the same verdict in 5 of 5 runs").

Each gallery tier runs ``kvproto conform TARGET --check CHECK --repeat N``: the check it must fail, N times
over in one session (each run builds the tier afresh), 5 runs under the fast profile, 3 for the tiers whose
bug only a longer search reaches (the explorer's, under the default profile). A gallery tier's other checks
judge a tier with a known bug, so they are not run here: the reference and honest tiers' full runs are
tests of their own (test_reference_tiers.py, test_honest_tiers.py, test_determinism.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import kvproto_cli as main
from tests.kvproto.testing.gallery_index import GALLERY, Expected

RUNS = 5
"""Runs of the promised check per gallery tier under the fast profile."""
LONGER_SEARCH_RUNS = 3
"""Runs where the gallery entry needs a longer search (its profile is not ``fast``)."""


@pytest.mark.parametrize("target", sorted(GALLERY), ids=lambda t: t.rsplit(":", 1)[-1])
def test_conform_fails_broken_tier_on_its_clause_every_run(target: str, tmp_path: Path) -> None:
    expected: Expected = GALLERY[target]
    runs = RUNS if expected.profile == "fast" else LONGER_SEARCH_RUNS
    report = tmp_path / "report.json"
    code = main(["conform", target, "--profile", expected.profile, "--no-typecheck", "--no-coverage",
                 "--check", expected.check, "--repeat", str(runs), "--json", str(report)])
    data = json.loads(report.read_text())
    assert code == 1
    assert data["passed"] is False
    tiers = data["tiers"]
    assert isinstance(tiers, list) and len(tiers) == 1
    assert tiers[0]["error"] is None, tiers[0]["error"]
    checks = {c["check"]: c for c in tiers[0]["checks"] if c["outcome"] != "deselected"}
    assert list(checks) == [expected.check]
    verdict = checks[expected.check]
    every_run = [(r["outcome"], r["violated_clause"]) for r in verdict["runs"]]
    assert every_run == [("failed", expected.clause)] * runs, (every_run, verdict["reason"][:600])
    assert verdict["outcome"] == "failed", verdict
    assert verdict["violated_clause"] == expected.clause, verdict
    assert expected.words in verdict["reason"], verdict["reason"]
