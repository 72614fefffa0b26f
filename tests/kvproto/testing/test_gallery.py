"""The kit proves itself: ``kvproto conform`` fails each broken tier on the clause naming its bug (KIT-13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import kvproto_cli as main
from tests.kvproto.testing.gallery_index import GALLERY, Expected

EXPLORER = "explore_instances_sizes_and_interleavings"


def _conform(target: str, tmp_path: Path, profile: str = "fast", *, explore: bool = True) -> tuple[int, dict[str, object]]:
    """``kvproto conform TARGET`` (no type check, no coverage); ``explore``: False leaves the explorer out
    (it runs on every tier, and its own gallery tiers are the ones that must fail it: CI time)."""
    report = tmp_path / "report.json"
    argv = ["conform", target, "--profile", profile, "--no-typecheck", "--no-coverage", "--json", str(report)]
    code = main(argv if explore else [*argv, "-k", f"not {EXPLORER}"])
    return code, json.loads(report.read_text())


@pytest.mark.parametrize("target", sorted(GALLERY), ids=lambda t: t.rsplit(":", 1)[-1])
def test_conform_fails_broken_tier_on_its_clause(target: str, tmp_path: Path) -> None:
    expected: Expected = GALLERY[target]
    code, data = _conform(target, tmp_path, expected.profile, explore=EXPLORER in expected.check)
    assert code == 1
    assert data["passed"] is False
    tiers = data["tiers"]
    assert isinstance(tiers, list) and len(tiers) == 1
    checks = {c["check"]: c for c in tiers[0]["checks"]}
    verdict = checks[expected.check]
    assert verdict["outcome"] == "failed", verdict
    assert verdict["violated_clause"] == expected.clause, verdict
    assert expected.words in verdict["reason"], verdict["reason"]
