"""``kvproto conform`` with no target passes every installed reference tier (KIT-9, KIT-11)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.cli import kvproto_cli as main

#: The reference tiers kvproto ships, those of kvproto-cpu where it and torch are installed, and kvproto-redis's
#: where it is installed (each run starts its own redis-server on loopback: ./dev and .ci/run install it).
REFERENCE = {"memory", "memory-async", "memory-threaded", "memory-primary"} | (
    {"cpu"} if importlib.util.find_spec("kvproto_cpu") and importlib.util.find_spec("torch") else set()
) | ({"redis", "redis-cluster"} if importlib.util.find_spec("kvproto_redis") else set())


@pytest.mark.timeout(1800)  # every reference tier under the default profile, the explorer's search included
def test_conform_without_target_passes_every_reference_tier(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    junit = tmp_path / "report.xml"
    code = main(["conform", "--no-typecheck", "--no-coverage", "--json", str(report), "--junit", str(junit)])
    data = json.loads(report.read_text())
    failing = {
        t["tier"]: [(c["check"], c["reason"]) for c in t["checks"] if c["outcome"] in ("failed", "error")]
        for t in data["tiers"]
        if not t["passed"]
    }
    assert failing == {}
    assert code == 0
    checked = {t["tier"] for t in data["tiers"]}
    assert checked >= REFERENCE
    # The example tier is installed too, but its distribution is not marked kvproto-reference.
    assert not checked & {"example", "example-file"}
    for tier in data["tiers"]:
        outcomes = {c["outcome"] for c in tier["checks"]}
        assert outcomes <= {"passed", "skipped"}
        for check in tier["checks"]:
            assert check["clause"].split("-")[0] in {"LR", "TIER", "CAP", "KIT"}
            if check["outcome"] == "skipped":
                assert check["reason"].startswith(("needs ", "vacuous: "))
        # Every skip for a declaration is named in the verdict (CAP-1).
        skipped = {c["check"] for c in tier["checks"] if c["outcome"] == "skipped" and "capability '" in c["reason"]}
        assert {u["check"] for u in tier["unchecked"] if u["capability"]} == skipped
    assert junit.read_text().startswith("<?xml")
