"""``kvproto conform`` with no target passes every reference tier kvproto ships (KIT-9, KIT-11)."""

from __future__ import annotations

import json
from pathlib import Path

from kvproto.cli import main
from kvproto.testing._targets import reference_tiers


def test_reference_tiers_are_registered() -> None:
    names = {ep.name for ep in reference_tiers()}
    assert {"memory", "memory-async", "memory-threaded", "cpu"} <= names


def test_conform_without_target_passes_every_reference_tier(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    junit = tmp_path / "report.xml"
    code = main(["conform", "--no-typecheck", "--json", str(report), "--junit", str(junit)])
    data = json.loads(report.read_text())
    failing = {
        t["tier"]: [(c["check"], c["reason"]) for c in t["checks"] if c["outcome"] in ("failed", "error")]
        for t in data["tiers"]
        if not t["passed"]
    }
    assert failing == {}
    assert code == 0
    assert {t["tier"] for t in data["tiers"]} >= {"memory", "memory-async", "memory-threaded", "cpu"}
    for tier in data["tiers"]:
        outcomes = {c["outcome"] for c in tier["checks"]}
        assert outcomes <= {"passed", "skipped"}
        for check in tier["checks"]:
            assert check["clause"].split("-")[0] in {"LR", "TIER", "KIT"}
            if check["outcome"] == "skipped":
                assert check["reason"].startswith("needs ")
    assert junit.read_text().startswith("<?xml")
