"""FsTier passes the conformance kit in both modes, and through its entry point (FS-12)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from kvproto import SecondaryTier

from tests.cli import kvproto_cli as main
from tests.impls._kit_hooks import HookTableTests

fs = pytest.importorskip("kvproto_fs", reason="kvproto-fs is not installed: pip install -e impls/fs (./dev does it)")
from kvproto_fs._conformance import FS_HOOKS, kit_tier  # noqa: E402  (after the importorskip)


class TestPrivateFsTier(HookTableTests):
    """Private mode (the default): index answers, start-up scan, no eviction."""

    kit_profile = "fast"
    HOOKS = FS_HOOKS
    TABLE_HOOKS = ("short_io", "fail_io", "refuse_direct", "lose_directories", "refuse_links", "plant_leftovers",
                   "leftovers", "reopen_with_layout")

    @pytest.fixture
    def tier_factory(self, tmp_path: Path) -> Callable[[memoryview], SecondaryTier]:
        count = iter(range(10**6))

        def build(buffer: memoryview) -> SecondaryTier:
            root = tmp_path / f"tier-{next(count)}"
            root.mkdir()
            tier: SecondaryTier = kit_tier(buffer, fs.FsTierConfig(root=root, read_threads=2, write_threads=2), "fs")
            return tier

        return build


def test_conform_fs_passes_every_check_through_the_entry_point(tmp_path: Path) -> None:
    """`kvproto conform fs` (shared mode, byte budget): every capability declared, no check skipped but
    the two that only bind a tier without an ability (CAP-3, CAP-4)."""
    report = tmp_path / "r.json"
    assert main(["conform", "fs", "--profile", "fast", "--json", str(report)]) == 0
    (tier,) = json.loads(report.read_text())["tiers"]
    assert tier["typecheck"]["passed"] is True
    caps = tier["capabilities"]
    assert all(caps[c] is True for c in ("persistence", "sharing", "eviction", "async_lookup", "partial_jobs"))
    outcomes = {c["check"]: c["outcome"] for c in tier["checks"]}
    # Only the checks of what an undeclared ability promises skip, as vacuous (CAP-1).
    vacuous = {c["check"] for c in tier["checks"] if c["outcome"] == "skipped" and c["reason"].startswith("vacuous")}
    assert vacuous == {"test_retry_only_when_declared", "test_jobs_are_whole_without_partial_jobs"}
    # fs keeps its byte budget in LRU order but does not declare lru (CAP-6): that check says so.
    needs = {c["check"] for c in tier["checks"] if c["outcome"] == "skipped" and c["reason"].startswith("needs ")}
    # The kit's 64-byte rows never take FsTier's O_DIRECT path: TIER-35 says it was not checked (the
    # mutation spec fs_direct, over 4 KiB rows, runs it).
    # The hooks only the obj spec defines (a request plan TIER-33, another writer replacing a block
    # TIER-34, storage down at start-up KIT-20, expected abilities KIT-21) are named as not checked.
    assert needs == {
        "test_touch_keeps_a_block_under_lru", "test_refused_direct_io_still_moves_the_bytes",
        "test_existence_batches_keep_the_declared_request_plan",
        "test_a_block_replaced_after_its_hit_never_loads_the_new_bytes",
        "test_a_constructor_refuses_storage_that_is_down", "test_the_tier_declares_what_its_spec_expects",
        # nor lose_write_races (TIER-10: a create-if-absent write lost to a failed writer, S3's 409): a link
        # refused with EEXIST always finds the file there
        "test_a_write_lost_to_a_failed_writer_is_no_store",
        # The kit's fs spec keeps 48 blocks (its byte budget, for the eviction checks): too few for the
        # many-block persistence check (the mutation spec fs_private, without a budget, runs it).
        "test_persistence_of_many_blocks",
        # The kit's fs spec runs durability='none' (no fsync): TIER-31's failed-sync check says it was not
        # checked (`--option durability=data` and the mutation spec fs_private run it).
        "test_a_store_whose_sync_fails_is_reported_failed",
    }
    assert {o for name, o in outcomes.items() if name not in vacuous | needs} == {"passed"}, outcomes
    assert outcomes["test_a_store_outlives_its_directory_vanishing"] == "passed"  # TIER-36, through KitFileOps
    assert outcomes["test_a_killed_writer_leaves_no_false_hit"] == "passed"
    assert outcomes["test_sharing_between_instances"] == "passed"
    assert caps["holds_hits"] is True  # TIERKIT-6: a HIT kept through another instance's deletion
    assert outcomes["test_a_hit_loads_after_another_instance_deleted_the_block"] == "passed"
    assert outcomes["test_held_hits_are_released_on_every_path"] == "passed"
    assert outcomes["test_held_hits_are_released_after_a_failed_load"] == "passed"
    assert outcomes["test_releasing_held_hits_closes_only_their_own_descriptors"] == "passed"
    for check in ("test_short_transfers_move_every_byte", "test_io_errors_inside_transfers_fail_cleanly",
                  "test_a_large_batch_sees_the_other_instances_blocks"):  # TIER-30..32, through KitFileOps
        assert outcomes[check] == "passed", check


def test_conform_fs_with_durability_data_checks_a_failed_sync(tmp_path: Path) -> None:
    """`kvproto conform fs --option durability=data`: FsTier fsyncs before each link (FS-4), so TIER-31's
    failed-sync check runs (the kit's hook fails its fsync calls) and passes; with the spec's default
    (durability='none') the same check says it was not checked."""
    outcomes: dict[str, tuple[str, str]] = {}
    for durability in ("data", "none"):
        report = tmp_path / f"{durability}.json"
        argv = ["conform", "fs", "--option", f"durability={durability}", "--no-typecheck", "--no-coverage",
                "--check", "a_store_whose_sync_fails_is_reported_failed", "--json", str(report)]
        assert main(argv) == 0
        ((check,),) = [tier["checks"] for tier in json.loads(report.read_text())["tiers"]]
        outcomes[durability] = (check["outcome"], check["reason"] or "")
    assert outcomes["data"][0] == "passed", outcomes
    assert outcomes["none"][0] == "skipped" and "fail_sync failed no call" in outcomes["none"][1], outcomes
