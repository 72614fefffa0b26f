"""``kvproto conform vllm:MODULE:CLASS`` with no option, on the three broken vLLM plugin tiers of
``broken_vllm_tiers.py`` (issue 40; their harm inside vLLM's real manager: test_vllm_tier_bugs_harm.py):
each fails on the clause the wrapper's vLLM-like driving (VLLM-9) makes it break; their correct twin
conforms."""

from __future__ import annotations

from typing import Any

import pytest

from tests.adapters.kit_reports import conform_report
from tests.adapters.vllm.test_kit_finds_vllm_defects import NO_RESET_CHECKS

GALLERY = "vllm:tests.adapters.vllm.broken_vllm_tiers"
Reports = dict[str, tuple[int, dict[str, dict[str, Any]]]]

#: Each broken tier -> the clause its failures name, and words every such failure's reason holds.
BUGS: dict[str, tuple[str, tuple[str, ...]]] = {
    # Polled on the wrapper's tier-poll thread, get_finished_jobs raises after taking the results.
    "ThreadBoundJournal": ("TIER-11", ("ThreadBoundJournal sets tolerates_off_thread_polling", "vllm_offload_tier_poll")),
    # Each store job is a finished request's last cascade: finishing it drops the job's result.
    "DropsJobsOfFinishedRequests": ("TIER-11", ("never reported finished",)),
    # A multi-key load missing a middle key names a key it never wrote as loaded.
    "PrefixSuccessfulKeys": ("TIER-10", ("was never written",)),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Reports:
    out = tmp_path_factory.mktemp("conform-vllm-bugs")
    return {name: conform_report(out / f"{name}.json", f"{GALLERY}:{name}") for name in [*BUGS, "JournaledTier"]}


def _failed(checks: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: c for n, c in checks.items() if c["outcome"] == "failed"}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_the_kit_fails_each_broken_vllm_tier_on_its_clause(reports: Reports, bug: str) -> None:
    code, checks = reports[bug]
    # Every failure names a clause: no check of the kit's own crashes on a job never reported.
    named = _failed(checks)
    clause, words = BUGS[bug]
    assert code == 1 and named, f"{bug} conformed"
    for name, check in named.items():
        assert check["violated_clause"] == clause, (name, check["violated_clause"], check["reason"][:400])
        assert all(w in check["reason"] for w in words), (name, check["reason"][:400])


def test_a_tier_that_keeps_a_thread_bound_handle_fails_the_plain_checks(reports: Reports) -> None:
    """Every check that reports a job polls on the tier-poll thread first: the simplest store fails."""
    _, checks = reports["ThreadBoundJournal"]
    assert checks["test_hit_after_successful_store"]["violated_clause"] == "TIER-11"


def test_the_correct_twin_conforms_with_no_option(reports: Reports) -> None:
    code, checks = reports["JournaledTier"]
    assert {n: c["reason"][:300] for n, c in _failed(checks).items()} == {} and code == 0
    assert {n for n, c in checks.items() if c["outcome"] == "xfailed"} == set(NO_RESET_CHECKS)
