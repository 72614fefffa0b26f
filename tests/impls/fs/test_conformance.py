"""FsTier passes the conformance kit in both modes, and through its entry point (FS-12)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from kvproto import OffloadKey, SecondaryTier
from kvproto.testing import FaultyBackend, SecondaryTierTests
from tests.cli import kvproto_cli as main

fs = pytest.importorskip("kvproto_fs", reason="kvproto-fs is not installed: pip install -e impls/fs (./dev does it)")
from kvproto_fs._conformance import FS_HOOKS  # noqa: E402  (after the importorskip)


def _hook(name: str, *args: Any) -> Any:
    return FS_HOOKS[name](*args)


class TestPrivateFsTier(SecondaryTierTests):
    """Private mode (the default): index answers, start-up scan, no eviction."""

    kit_profile = "fast"

    @pytest.fixture
    def tier_factory(self, tmp_path: Path) -> Callable[[memoryview], SecondaryTier]:
        count = iter(range(10**6))

        def build(buffer: memoryview) -> SecondaryTier:
            root = tmp_path / f"tier-{next(count)}"
            root.mkdir()
            tier: SecondaryTier = fs.FsTier(
                buffer, fs.FsTierConfig(root=root, read_threads=2, write_threads=2), wrap=FaultyBackend
            )
            return tier

        return build

    def reopen(self, tier: SecondaryTier, buffer: memoryview) -> SecondaryTier:
        reopened: SecondaryTier = _hook("reopen", tier, buffer)
        return reopened

    def read_block(self, tier: SecondaryTier, key: OffloadKey) -> bytes | None:
        got: bytes | None = _hook("read_block", tier, key)
        return got

    def seed_block(self, tier: SecondaryTier, key: OffloadKey, data: bytes) -> None:
        _hook("seed_block", tier, key, data)

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        _hook("fail_next_jobs", tier, n)

    def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        _hook("fail_keys", tier, keys)

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        _hook("corrupt_on_read", tier, keys)


def test_conform_fs_passes_every_check_through_the_entry_point(tmp_path: Path) -> None:
    """`kvproto conform fs` (shared mode, byte budget): every capability declared, no check skipped."""
    report = tmp_path / "r.json"
    assert main(["conform", "fs", "--profile", "fast", "--json", str(report)]) == 0
    (tier,) = json.loads(report.read_text())["tiers"]
    assert tier["typecheck"]["passed"] is True
    caps = tier["capabilities"]
    assert all(caps[c] is True for c in ("persistence", "sharing", "eviction", "async_lookup", "partial_jobs"))
    outcomes = {c["check"]: c["outcome"] for c in tier["checks"]}
    assert set(outcomes.values()) == {"passed"}, outcomes
    assert outcomes["test_sharing_between_instances"] == "passed"
