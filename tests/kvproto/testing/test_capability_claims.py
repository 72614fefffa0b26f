"""A declaration never buys a pass (issue 25): the verdict names what a declaration left unchecked
(CAP-1), a non-evicting primary gets the pin checks run (CAP-5), and a test hook that misses its
job is the hook's fault, never the tier's (KIT-5)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import pytest

from kvproto import MemoryTier, OffloadKey, SecondaryTier
from kvproto.testing import ConformanceFailure, KitLimits, SecondaryDriver, SecondaryTierTests, key_pool, make_buffer

from tests.cli import kvproto_cli as main
from tests.kvproto.testing.misfits import LateArming

_PIN_CHECKS = (
    "test_pinned_block_is_not_evicted",
    "test_complete_load_releases_pin",
    "test_releasing_a_pin_never_taken_is_misuse",
    "test_two_pins_released_once_stay_protected",
    "test_prepare_store_never_evicts_its_own_input",
    "test_holds_what_it_stored_without_eviction",
)


def _driver(tier_class: type[MemoryTier]) -> SecondaryDriver:
    """A driver over a fresh ``tier_class`` tier (a MemoryTier) and its own buffer."""
    buffer = make_buffer(32, 64)
    tier = tier_class(buffer)
    return SecondaryDriver(tier, buffer, tier.capabilities, KitLimits(max_job_steps=4, job_timeout_s=0.05))


def _conform(args: list[str], tmp_path: Path) -> tuple[int, dict[str, object]]:
    report = tmp_path / "report.json"
    code = main(["conform", *args, "--no-typecheck", "--profile", "fast", "--json", str(report)])
    return code, json.loads(report.read_text())


def _tier(data: dict[str, object]) -> dict[str, object]:
    tiers = data["tiers"]
    assert isinstance(tiers, list) and len(tiers) == 1
    tier: dict[str, object] = tiers[0]
    return tier


def test_the_verdict_names_the_clauses_a_declaration_left_unchecked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """MemoryTier declares neither persistence nor sharing, and declares partial_jobs: the summary
    line and the JSON name TIER-18 (no persistence, no sharing) and CAP-4 (partial_jobs declared),
    not only a count of skips."""
    monkeypatch.setenv("COLUMNS", "400")
    checks = ["persistence_across_instances", "sharing_between_instances", "jobs_are_whole_without_partial_jobs",
              "retry_only_when_declared"]
    code, data = _conform(["memory", *(a for c in checks for a in ("--check", c))], tmp_path)
    assert code == 0
    tier = _tier(data)
    assert tier["unchecked_clauses"] == {"TIER-18": ["no persistence", "no sharing"], "CAP-4": ["partial_jobs declared"]}
    unchecked = tier["unchecked"]
    assert isinstance(unchecked, list)
    assert {(u["check"], u["capability"], u["declared"]) for u in unchecked} == {
        ("test_persistence_across_instances", "persistence", False),
        ("test_sharing_between_instances", "sharing", False),
        ("test_jobs_are_whole_without_partial_jobs", "partial_jobs", True),
    }
    checks_run = {c["check"]: c["outcome"] for c in tier["checks"]}  # type: ignore[attr-defined]  # JSON: list of dicts
    assert checks_run["test_retry_only_when_declared"] == "passed"
    out = capsys.readouterr().out
    assert "TIER-18: no persistence, no sharing; CAP-4: partial_jobs declared" in out


def test_a_correct_non_evicting_primary_conforms_with_the_pin_checks_run(tmp_path: Path) -> None:
    """A primary declaring no eviction, answering None when full, conforms, and every pin check
    and the no-eviction check ran and passed (none skipped); only the eviction report is left out."""
    code, data = _conform(["tests.kvproto.testing.honest_tiers:no_eviction_primary"], tmp_path)
    tier = _tier(data)
    outcomes = {c["check"]: c for c in tier["checks"]}  # type: ignore[attr-defined]  # JSON: list of dicts
    failing = [(n, c["reason"]) for n, c in outcomes.items() if c["outcome"] in ("failed", "error")]
    assert failing == []
    assert code == 0
    for name in _PIN_CHECKS:
        assert outcomes[name]["outcome"] == "passed", (name, outcomes[name])
    assert outcomes["test_eviction_reports_evicted_keys"]["outcome"] == "skipped"
    # CAP-6 (a declared LRU order honours touch) binds only a tier declaring lru: named, not hidden (CAP-1).
    assert tier["unchecked_clauses"] == {"TIER-6": ["no eviction"], "CAP-6": ["no lru"]}


def test_an_evicting_primary_skips_only_the_vacuous_check(tmp_path: Path) -> None:
    """memory-primary declares eviction: the no-eviction check is the one skipped, as vacuous, and named."""
    code, data = _conform(["memory-primary", *(a for c in _PIN_CHECKS for a in ("--check", c))], tmp_path)
    assert code == 0
    tier = _tier(data)
    outcomes = {c["check"]: c for c in tier["checks"]}  # type: ignore[attr-defined]  # JSON: list of dicts
    assert outcomes["test_holds_what_it_stored_without_eviction"]["outcome"] == "skipped"
    assert outcomes["test_holds_what_it_stored_without_eviction"]["reason"].startswith("vacuous")
    assert all(outcomes[n]["outcome"] == "passed" for n in _PIN_CHECKS[:-1])
    assert tier["unchecked_clauses"] == {"CAP-2": ["eviction declared"]}


class _Racy(SecondaryTierTests):
    """The kit's checks with a fail_next_jobs hook that arms one job late (see misfits.LateArming)."""

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        assert isinstance(tier, LateArming)
        tier.arm_late(n)


def test_a_hook_that_fails_the_wrong_job_is_kit5_naming_the_hook() -> None:
    """Armed for the next job, the racy hook fails the one after: KIT-5 names the hook, the job it
    was armed for and the job that failed instead."""
    kit = _driver(LateArming)
    keys = key_pool("racy", 2)
    _Racy().arm_fail_next_jobs(kit, 1)
    armed = kit.submit_store(keys[:1], [0])
    other = kit.submit_store(keys[1:], [1])
    with pytest.raises(ConformanceFailure) as caught:
        kit.wait([armed, other])
    assert caught.value.clause == "KIT-5"
    assert "fail_next_jobs" in caught.value.detail
    assert f"job {armed.job_id}" in caught.value.detail and f"job {other.job_id}" in caught.value.detail
    kit.shutdown()


def test_a_racy_hook_inside_a_check_is_kit5_not_a_lost_write() -> None:
    """The check of a failed store, run with the racy hook: KIT-5 naming the hook, not TIER-4/TIER-10."""
    kit = _driver(LateArming)
    with pytest.raises(ConformanceFailure) as caught:
        _Racy().test_no_hit_after_failed_store(kit)
    assert caught.value.clause == "KIT-5" and "fail_next_jobs" in caught.value.detail
    kit.shutdown()


def test_a_racy_hook_is_blamed_never_the_tier(tmp_path: Path) -> None:
    """Through ``kvproto conform``: every check that arms the racy hook fails on KIT-5 naming it,
    and no check fails on a tier clause (the tier under the hook is a correct MemoryTier)."""
    arming = [
        "no_hit_before_store_finished", "no_hit_after_failed_store", "events_name_stored_blocks",
        "fail_next_jobs_hook_fails_exactly_n_jobs", "state_machine_against_model", "differential_against_memory_tier",
        "hit_after_successful_store",
    ]
    code, data = _conform(
        ["tests.kvproto.testing.misfits:racy_hook", *(a for c in arming for a in ("--check", c))], tmp_path
    )
    assert code == 1
    checks = _tier(data)["checks"]
    assert isinstance(checks, list)
    failed = [c for c in checks if c["outcome"] in ("failed", "error")]
    assert [c["violated_clause"] for c in failed] == ["KIT-5"] * len(failed), failed
    assert all("fail_next_jobs" in c["reason"] for c in failed), failed
    names = {c["check"] for c in failed}
    assert {"test_no_hit_before_store_finished", "test_no_hit_after_failed_store", "test_events_name_stored_blocks",
            "test_fail_next_jobs_hook_fails_exactly_n_jobs"} <= names
    assert {c["check"]: c["outcome"] for c in checks}["test_hit_after_successful_store"] == "passed"


def test_memory_tier_partials_fail_cap4_only_when_undeclared() -> None:
    """The driver's CAP-4: the same partial result passes with partial_jobs declared and fails without."""
    from dataclasses import replace

    for declared in (True, False):
        buffer = make_buffer(32, 64)
        tier = MemoryTier(buffer)
        caps = replace(tier.capabilities, partial_jobs=declared)
        kit = SecondaryDriver(tier, buffer, caps, KitLimits(max_job_steps=4, job_timeout_s=0.05))
        keys = key_pool(f"cap4-{declared}", 3)
        tier.fail_keys(keys[1:2])
        if declared:
            assert not kit.store(keys).success
        else:
            with pytest.raises(ConformanceFailure) as caught:
                kit.store(keys)
            assert caught.value.clause == "CAP-4"
        kit.shutdown()


class _NoOpCorrupt(SecondaryTierTests):
    """A corrupt_on_read hook that damages nothing."""

    def corrupt_on_read(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
        pass


def test_a_corrupt_hook_that_damages_nothing_is_kit5_not_the_tiers_fault() -> None:
    """The load of a block the hook was to damage returns its right bytes (the driver checked): the
    hook had no effect, KIT-5, never TIER-10 against a tier that served nothing wrong."""
    kit = _driver(MemoryTier)
    with pytest.raises(ConformanceFailure) as caught:
        _NoOpCorrupt().test_corrupt_block_fails_load(kit)
    assert caught.value.clause == "KIT-5" and "corrupt_on_read" in caught.value.detail
    kit.shutdown()
