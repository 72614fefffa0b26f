"""The committed figures of the reference tiers' code the kit ran (docs/code-run/*.json, written by
``./dev code-run``: KIT-24) are well formed, every reference tier is recorded, and issue 40's
exceptions are exact: every tier below 95% of lines run names why, and no reason is left for a tier
that reaches it (no stale excuses). The kit runs themselves are not part of the suite; test_coverage.py
checks docs/kit-coverage.md renders them."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from tests.kvproto.testing.code_run_report import (
    BELOW_TARGET,
    CODE_RUN_DIR,
    TIERS,
    BadCodeRunReport,
    below_target,
    load_reports,
    render_section,
    validate,
)


def test_every_reference_tier_is_recorded() -> None:
    assert [r["tier"] for r in load_reports()] == list(TIERS)
    assert {p.stem for p in CODE_RUN_DIR.glob("*.json")} == set(TIERS)


def test_every_tier_below_the_target_names_its_exception_and_no_other_does() -> None:
    below = below_target(load_reports())
    assert sorted(BELOW_TARGET) == sorted(below), "BELOW_TARGET must name exactly the tiers under 95% of lines run"
    for tier, why in BELOW_TARGET.items():
        assert why.strip() and "\n" not in why, tier


def test_the_section_lists_each_exception_with_its_functions_not_checked() -> None:
    text = "\n".join(render_section())
    for report in load_reports():
        assert f"| {report['tier']} " in text
    for tier, why in BELOW_TARGET.items():
        assert f"### Below 95%: {tier}\n\nException: {why}" in text
    assert "**none named**" not in text


def _good() -> dict[str, Any]:
    return {
        "tier": "memory", "command": ["kvproto", "conform", "memory", "--no-typecheck", "--json", "REPORT.json"],
        "profile": "default", "verdict": "conforms", "error": None, "failed_checks": [], "wall_s": 4.5,
        "coverage": {
            "packages": ["kvproto._memory_tier"], "left_out": [], "lines": 10, "lines_run": 8, "share": 0.8,
            "branches": 4, "branches_run": 1, "branch_share": 0.25, "not_checked": ["kvproto._memory_tier.f"],
            "modules": {"kvproto._memory_tier": {"lines": 10, "lines_run": 8, "branches": 4, "branches_run": 1}},
            "not_measured": None,
        },
    }


def test_validator_accepts_a_good_report() -> None:
    assert validate(_good(), "good")["tier"] == "memory"


@pytest.mark.parametrize(
    ("path", "value", "said"),
    [
        (("tier",), "nosuch", "unknown tier"),
        (("command",), ["kvproto", "conform", "fs"], "does not run memory"),
        (("profile",), "fast", "not the default"),
        (("verdict",), "maybe", "not one of"),
        (("error",), "it broke", "verdict 'conforms' with error"),
        (("coverage",), None, "no figures and no error"),
        (("coverage", "share"), 0.9, "share 0.9 is not lines_run / lines"),
        (("coverage", "lines_run"), 11, "more run than counted"),
        (("coverage", "modules", "kvproto._memory_tier", "lines"), 9, "the modules' lines sum to 9"),
        (("coverage", "branches"), True, "'branches' is True"),
    ],
)
def test_validator_names_what_is_wrong(path: tuple[str, ...], value: Any, said: str) -> None:
    bad = copy.deepcopy(_good())
    at: Any = bad
    for key in path[:-1]:
        at = at[key]
    at[path[-1]] = value
    with pytest.raises(BadCodeRunReport, match=re.escape(said)):
        validate(json.loads(json.dumps(bad)), "bad")
