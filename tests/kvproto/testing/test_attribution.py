"""No false blame (issue 17 section 2, KIT-17): a preflight store and load before any check, set-up
failures reported against the step's clause, a tier's exception on the check's clause with the
tier's traceback, a hook's exception as the hook's.

The tiers are in trust_tiers.py; each test runs ``kvproto conform`` in-process (or the runner
behind it) and reads its report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli import conform_report

HERE = "tests.kvproto.testing.trust_tiers"
#: The clauses a tier whose storage is down used to be blamed on (none of them broken).
FALSE_BLAMES = {"TIER-14", "TIER-5", "TIER-12", "TIER-16", "KIT-5"}


def _conform(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    return conform_report(tmp_path, *args, "--profile", "fast")


def test_a_tier_whose_storage_is_down_gets_one_preflight_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: every job reported failed used to be blamed on TIER-14 ("reset_cache dropped 4
    stored blocks"), TIER-5, TIER-12 and KIT-5. Now the preflight stops the run, with one message."""
    code, data = _conform(tmp_path, f"{HERE}:storage_down")
    assert code == 1
    (tier,) = data["tiers"]
    assert tier["passed"] is False
    assert tier["error_clause"] == "KIT-17"
    assert tier["error"].startswith("preflight failed: the tier reported every store failed")
    assert "storage looks down" in tier["error"] and "cannot store on it at all as configured" in tier["error"]
    # The tier's own words (its first warning), since a failed job carries no reason.
    assert "[Errno 111] Connection refused" in tier["error"]
    assert {c["outcome"] for c in tier["checks"]} == {"not run"}
    assert not {c["violated_clause"] for c in tier["checks"]} - {None}
    shown = capsys.readouterr().out
    assert "preflight failed" in shown
    assert not any(clause in shown for clause in ("TIER-14 ", "TIER-5 ", "TIER-12 "))


SET_UP_CHECKS = [
    "test_events_report_removals",
    "test_touch_of_unknown_keys_is_a_no_op",
    "test_on_request_finished_drops_request_state",
    "test_reset_cache_forgets_blocks",
    "test_fail_next_jobs_hook_fails_exactly_n_jobs",
    "test_partial_job_reports_succeeded_keys",
]


def test_a_check_whose_set_up_store_failed_blames_the_store_clause_not_its_own(tmp_path: Path) -> None:
    """Without the preflight (a run of selected checks, as in an author's own pytest), each check
    verifies its own set-up: a store the kit made no fault for, reported failed, is "set-up failed"
    on TIER-10 (the clause of store jobs), an error (its own clause unjudged), never a failure of the
    check's clause."""
    selected = [arg for name in SET_UP_CHECKS for arg in ("--check", name)]
    code, data = _conform(tmp_path, f"{HERE}:storage_down", *selected)
    assert code == 1
    (tier,) = data["tiers"]
    assert tier["error"] is None
    checks = tier["checks"]
    assert sorted(c["check"] for c in checks) == sorted(SET_UP_CHECKS)
    for c in checks:
        assert c["outcome"] == "error", c
        assert c["violated_clause"] == "TIER-10", c
        assert c["reason"].startswith("[TIER-10] set-up failed: the tier reported store job"), c
        assert f"this check of {c['clause']} could not judge the tier" in c["reason"]
    assert not {c["violated_clause"] for c in checks} & FALSE_BLAMES


def test_the_preflight_passes_every_correct_tier_it_is_given(tmp_path: Path) -> None:
    """The preflight stops nothing that can store: the tier whose hook is broken (its storage is
    fine) and the one raising from take_events go on to their checks."""
    for target in ("broken_hook", "raises_from_take_events"):
        _, data = _conform(tmp_path, f"{HERE}:{target}", "--check", "test_empty_tier_misses")
        (tier,) = data["tiers"]
        assert tier["error"] is None, tier["error"]
        assert [c["outcome"] for c in tier["checks"]] == ["passed"]


def test_a_tier_that_raises_on_its_first_store_gets_one_preflight_message(tmp_path: Path) -> None:
    """A threaded tier whose worker crashes at the first job: the preflight says so, once."""
    code, data = _conform(tmp_path, "tests.kvproto.testing.misfits:worker_crash_once")
    assert code == 1
    (tier,) = data["tiers"]
    assert tier["error_clause"] == "KIT-17"
    assert tier["error"].startswith("preflight failed: the tier raised RuntimeError: worker thread 2 died")
    assert "(in get_finished_jobs, misfits.py:" in tier["error"]


def test_an_exception_the_tier_raises_is_the_checks_failure_with_the_tiers_traceback(tmp_path: Path) -> None:
    """Regression: a tier's exception inside a check was reported with clause "-" and no traceback."""
    code, data = _conform(tmp_path, f"{HERE}:raises_from_take_events", "--check", "events_name_stored_blocks")
    assert code == 1
    ((check,),) = [t["checks"] for t in data["tiers"]]
    assert check["outcome"] == "failed"
    assert check["violated_clause"] == "TIER-14"
    assert check["reason"].startswith("[TIER-14] the tier raised RuntimeError: event log unreachable (in take_events")
    assert "The tier's traceback" in check["details"]
    assert "trust_tiers.py" in check["details"] and "raise RuntimeError" in check["details"]


def test_an_exception_a_hook_raises_says_it_came_from_the_hook(tmp_path: Path) -> None:
    code, data = _conform(tmp_path, f"{HERE}:broken_hook", "--check", "partial_job_reports_succeeded_keys")
    assert code == 1
    ((check,),) = [t["checks"] for t in data["tiers"]]
    assert check["violated_clause"] == "KIT-5"
    assert "the backdoor hook fail_keys() raised ValueError: this hook cannot fail keys" in check["reason"]
    assert "came from the test hook, not from the tier" in check["reason"]
    assert "The hook's traceback" in check["details"] and "_broken_fail_keys" in check["details"]
