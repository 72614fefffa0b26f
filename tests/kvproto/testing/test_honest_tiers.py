"""The kit passes correct tiers that look unusual: a small evicting tier, a tier whose jobs stop at
the first bad key (issue #9: no false blame; KIT-7, KIT-8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli import kvproto_cli as main


@pytest.mark.parametrize("factory", ["small_memory", "stops_at_first_bad_key", "clocked_primary"])
def test_conform_passes_an_unusual_but_correct_tier(factory: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code = main(
        ["conform", f"tests.kvproto.testing.honest_tiers:{factory}", "--no-typecheck", "--json", str(report)]
    )
    data = json.loads(report.read_text())
    failing = [(c["check"], c["reason"]) for t in data["tiers"] for c in t["checks"] if c["outcome"] in ("failed", "error")]
    assert failing == []
    assert code == 0
