"""CrossHair over the scans: the reference meets its contracts, kvproto.scan behaves exactly like it.

Bounded by iterations (``kvproto.testing.scans.CROSSHAIR_ITERATIONS``), not wall time. The mutant
runs show the comparison can fail: a diffbehavior that cannot tell a wrong
scan from the reference would prove nothing.
"""

from __future__ import annotations

import pytest

from kvproto.testing.scans import CROSSHAIR_TARGETS, CheckResult, crosshair_diff_check, run_checks, standard_checks

pytestmark = pytest.mark.crosshair

_TARGETS = CROSSHAIR_TARGETS
_MUTANTS = "spec.crosshair_mutants"


@pytest.fixture(scope="module")
def crosshair_results() -> dict[str, CheckResult]:
    """Every CrossHair run of this module, two at a time (they are subprocesses)."""
    checks = [c for c in standard_checks() if c.kind == "crosshair"]
    checks += [
        crosshair_diff_check(
            "mutant prefix",
            f"{_TARGETS}.kvproto_prefix",
            f"{_MUTANTS}.mutant_prefix_stops_at_retry",
            clauses="SCAN-2",
        ),
        crosshair_diff_check(
            "mutant window",
            f"{_TARGETS}.kvproto_window",
            f"{_MUTANTS}.mutant_window_defers_on_any_pending",
            clauses="SCAN-8",
        ),
    ]
    return {c.name: r for c, r in zip(checks, run_checks(checks, crosshair_parallel=2), strict=True)}


@pytest.mark.parametrize(
    "name",
    [
        "crosshair check: reference contracts",
        "crosshair diffbehavior: prefix",
        "crosshair diffbehavior: window",
    ],
)
def test_crosshair_finds_nothing(crosshair_results: dict[str, CheckResult], name: str) -> None:
    """SCAN-1..SCAN-10: no counterexample to the contracts, no difference from the reference."""
    result = crosshair_results[name]
    assert result.passed, result.detail
    assert result.explored is not None and result.explored > 0, "no paths explored"


@pytest.mark.parametrize(
    ("name", "scan_output"),
    [
        ("mutant prefix", "mutant_prefix_stops_at_retry : returns"),
        ("mutant window", "mutant_window_defers_on_any_pending : returns"),
    ],
)
def test_crosshair_diff_catches_a_wrong_scan(
    crosshair_results: dict[str, CheckResult], name: str, scan_output: str
) -> None:
    """The same diffbehavior run, same budget, against a deliberately wrong scan reports a difference."""
    result = crosshair_results[name]
    assert not result.passed
    assert "Given: (" in result.detail and scan_output in result.detail, result.detail
