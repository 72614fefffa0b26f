"""The out-of-tree example tier (examples/kvproto-example-tier) passes the kit both ways (docs/writing-a-tier.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kvproto import OffloadKey, SecondaryTier
from kvproto.envelope import HEADER_BYTES
from kvproto.testing import SecondaryTierTests

from tests.cli import kvproto_cli as main

example = pytest.importorskip(
    "kvproto_example_tier",
    reason="the example tier is not installed: pip install -e examples/kvproto-example-tier (./dev does it)",
)


class TestExampleFileTier(SecondaryTierTests):
    """What the tutorial tells an author to write in their own test suite."""

    kit_profile = "fast"

    @pytest.fixture
    def tier_factory(self, tmp_path: Path) -> Callable[[memoryview], SecondaryTier]:
        count = iter(range(10**6))
        return lambda buffer: example.FileTier(buffer, tmp_path / f"tier-{next(count)}")

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        assert isinstance(tier, example.FileTier)
        reopened: SecondaryTier = example.FileTier(buffer, tier.root)
        return reopened

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        assert isinstance(tier, example.FileTier)
        path: Path = tier.root / tier.name_of(key)
        return path.read_bytes()[HEADER_BYTES:] if path.exists() else None


def test_conform_and_typecheck_pass_through_the_entry_point(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    assert main(["conform", "example", "--profile", "fast", "--json", str(report)]) == 0
    (tier,) = json.loads(report.read_text())["tiers"]
    assert tier["typecheck"]["passed"] is True
    assert tier["capabilities"]["persistence"] is True
    by_name = {c["check"]: c["outcome"] for c in tier["checks"]}
    assert by_name["test_persistence_across_instances"] == "passed"
    assert by_name["test_corrupt_block_fails_load"] == "passed"


def test_the_first_entry_point_name_still_conforms(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    assert main(["conform", "example-file", "--profile", "fast", "--no-typecheck", "--json", str(report)]) == 0
    (tier,) = json.loads(report.read_text())["tiers"]
    assert tier["passed"] is True
