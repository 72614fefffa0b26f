"""Debuggable failures (issue 17 section 6, KIT-18): ``--seed``, ``-x``, ``-k``, ``-v``; nothing
written into the user's directory; ``expected_failures`` with or without ``test_``, unknown names
refused with a suggestion; the root cause said first, later failures with the same cause grouped.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvproto import MemoryTier
from kvproto.testing import MEMORY_HOOKS, TierSpec

from tests.cli import conform_report, kvproto_cli as main, tier_checks as _checks
from tests.kvproto.testing.gallery import BlockingLookup

ROOT = Path(__file__).resolve().parents[3]
TRUST = "tests.kvproto.testing.trust_tiers"
GALLERY = "tests.kvproto.testing.gallery"


def _conform(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    return conform_report(tmp_path, *args, "--profile", "fast")


def test_conform_writes_nothing_into_the_current_directory(tmp_path: Path) -> None:
    """Regression: ``kvproto conform`` left ``.hypothesis/`` (Hypothesis's constants cache) in the
    user's directory. Run from an empty directory, it must stay empty."""
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "HYPOTHESIS_STORAGE_DIRECTORY"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "kvproto", "conform", "memory", "--no-typecheck", "--profile", "fast"],
        cwd=empty, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(os.listdir(empty)) == []


def test_k_runs_only_the_checks_it_selects(tmp_path: Path) -> None:
    code, data = _conform(tmp_path, "memory", "-k", "lookup_does_not_block or lookup_answers")
    assert code == 0
    assert sorted(c["check"] for c in _checks(data)) == [
        "test_lookup_answers_a_lookup_result",
        "test_lookup_does_not_block",
    ]


def test_failfast_stops_at_the_first_failing_check(tmp_path: Path) -> None:
    code, data = _conform(tmp_path, f"{TRUST}:storage_down", "-x", "-k", "not state_machine and not differential")
    assert code == 1
    outcomes = [c["outcome"] for c in _checks(data)]
    first = next(i for i, o in enumerate(outcomes) if o in ("failed", "error"))
    assert all(o in ("passed", "skipped") for o in outcomes[:first])
    rest = [c for c in _checks(data)[first + 1 :]]
    assert rest and all(c["reason"] == "not run: -x stopped at the first failure" for c in rest)


def test_seed_is_used_and_reported(tmp_path: Path) -> None:
    code, data = _conform(tmp_path, "memory", "--seed", "1234", "--check", "state_machine_against_model")
    assert code == 0
    (tier,) = data["tiers"]
    assert tier["seed"] == 1234
    (check,) = tier["checks"]
    assert check["outcome"] == "passed"


def test_verbose_shows_the_tiers_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [f"{TRUST}:raises_from_take_events", "--check", "events_name_stored_blocks"]
    _conform(tmp_path, *args)
    quiet = capsys.readouterr().out
    _conform(tmp_path, *args, "-v")
    loud = capsys.readouterr().out
    assert "The tier's traceback" not in quiet
    assert "The tier's traceback" in loud and 'raise RuntimeError("event log unreachable")' in loud


def _blocking_with(expected: dict[str, str]) -> TierSpec:
    return TierSpec("blocking", "secondary", BlockingLookup, hooks=MEMORY_HOOKS, expected_failures=expected)


def blocking_expected_bare() -> TierSpec:
    return _blocking_with({"lookup_does_not_block": "a known bug"})


def blocking_expected_prefixed() -> TierSpec:
    return _blocking_with({"test_lookup_does_not_block": "a known bug"})


def memory_expected_typo() -> TierSpec:
    return TierSpec(
        "memory-typo", "secondary", MemoryTier, hooks=MEMORY_HOOKS, expected_failures={"lookup_dos_not_block": "?"}
    )


@pytest.mark.parametrize("factory", ["blocking_expected_bare", "blocking_expected_prefixed"])
def test_expected_failures_take_names_with_or_without_test_(factory: str, tmp_path: Path) -> None:
    code, data = _conform(tmp_path, f"{__name__}:{factory}", "--check", "lookup_does_not_block")
    (check,) = _checks(data)
    assert check["outcome"] == "xfailed", check
    assert code == 0


def test_an_unknown_expected_failure_is_refused_with_a_suggestion(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["conform", f"{__name__}:memory_expected_typo", "--no-typecheck"])
    assert code == 2
    out = capsys.readouterr().out
    assert "expected_failures names 'lookup_dos_not_block', which is not a kit check" in out
    assert "did you mean lookup_does_not_block?" in out


def test_a_wrong_byte_is_named_with_its_offset_and_slot(tmp_path: Path) -> None:
    _, data = _conform(tmp_path, f"{GALLERY}:verifies_first_block_only", "--check", "corrupt_block_fails_load")
    (check,) = _checks(data)
    assert check["violated_clause"] == "TIER-10"
    assert re.search(r"(one wrong byte|\d+ wrong bytes, the first) at offset \d+ \(0x[0-9a-f]{2} where 0x", check["reason"])
    assert "but slot " in check["reason"]


def test_later_failures_with_the_same_cause_are_grouped_under_the_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _conform(tmp_path, f"{TRUST}:storage_down", "-k", "events_report_removals or touch_of_unknown_keys")
    out = capsys.readouterr().out
    assert out.count("set-up failed") == 1
    assert "same cause as events_report_removals (above)" in out
