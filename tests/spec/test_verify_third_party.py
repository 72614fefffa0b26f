"""``kvproto verify --prefix/--window``: an engine's own scans checked against the reference (SCAN-11, SCAN-12).

Everything goes through the command line, as an integrator runs it. The scans
under test are in ``tests/spec/third_party_scans.py`` and ``spec/mutants.py``.
CrossHair runs in one test only (``crosshair`` marker, bounded by iterations);
the others pass ``--no-crosshair`` and small budgets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import spec.mutants
from tests.cli import kvproto_cli

SCANS = "tests.spec.third_party_scans"
#: Small budgets: sequences up to length 5, 100 examples per property, no CrossHair.
FAST = ["--no-crosshair", "--max-len", "5", "--examples", "100"]
#: Runs of the exhaustive checks at length 5: 1 + 4 + ... + 4^5 sequences, 16 window settings each.
SEQUENCES_5 = sum(4**n for n in range(6))


def _verify(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    report = tmp_path / "verify.json"
    code = kvproto_cli(["verify", *args, "--json", str(report)])
    return code, json.loads(report.read_text()) if report.exists() else {}


def _checks(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The report's checks by name, the length suffix dropped: ``exhaustive window``, ``property: ...``."""
    return {c["check"].split(" (len")[0]: c for c in report["checks"]}


@pytest.mark.parametrize(
    ("prefix", "window", "returns"),
    [("good_prefix", "good_window", "Hits | Defer"), ("prefix_returning_int", "window_returning_int", "int | None")],
)
def test_correct_third_party_scans_pass(tmp_path: Path, prefix: str, window: str, returns: str) -> None:
    """SCAN-11: independent re-implementations pass every check, returning Hits/Defer or int | None."""
    code, report = _verify(tmp_path, "--prefix", f"{SCANS}:{prefix}", "--window", f"{SCANS}:{window}", *FAST)
    assert code == 0, report
    checks = _checks(report)
    assert set(checks) == {
        "exhaustive prefix",
        "exhaustive window",
        "property: prefix invariants",
        "property: prefix = reference",
        "property: window invariants",
        "property: window = reference",
    }
    assert all(c["passed"] and not c["counterexamples"] for c in checks.values())
    assert checks["exhaustive prefix"]["explored"] == SEQUENCES_5
    assert checks["exhaustive window"]["explored"] == SEQUENCES_5 * 4 * 4
    assert report["targets"]["window"] == {
        "target": f"{SCANS}:{window}",
        "legacy_answers": False,
        "returns": returns,
    }
    assert report["skipped"] == ["crosshair diffbehavior: prefix", "crosshair diffbehavior: window"]


def test_without_a_target_verify_checks_kvproto_scan(tmp_path: Path) -> None:
    """SCAN-11: with neither flag, kvproto verify checks kvproto.scan (here without CrossHair)."""
    code, report = _verify(tmp_path, "--no-crosshair", "--max-len", "3", "--examples", "20")
    assert code == 0, report
    assert report["targets"] == {}
    assert "exhaustive window" in _checks(report) and "property: as_legacy" in _checks(report)
    assert len(report["skipped"]) == 3  # the contracts check and both diffbehavior runs


#: Each mutant of spec/mutants.py: its flag, the clause it breaks, and its first counterexample.
MUTANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "prefix_stops_at_retry": (
        "--prefix",
        {
            "clause": "SCAN-2",
            "answers": ["RETRY", "MISS"],
            "window": None,
            "initial_window": None,
            "scan": "Defer(RETRY)",
            "scan_calls": [0],
            "reference": "Defer(RETRY)",
            "reference_calls": [0, 1],
        },
    ),
    "window_defers_on_any_pending": (
        "--window",
        {
            "clause": "SCAN-8",
            "answers": ["MISS", "HIT_PENDING"],
            "window": 1,
            "initial_window": 2,
            "scan": "Defer(HIT_PENDING)",
            "scan_calls": [1, 0],
            "reference": "Hits(0)",
            "reference_calls": [1, 0],
        },
    ),
}


def test_every_mutant_is_listed() -> None:
    assert sorted(MUTANTS) == sorted(spec.mutants.__all__)


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_each_mutant_fails_with_a_counterexample_naming_its_clause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mutant: str
) -> None:
    """SCAN-11: the exhaustive check stops at --counterexamples differences, the first one exactly
    the shortest input that shows the mistake; the properties fail too; the exit status is 1."""
    flag, first = MUTANTS[mutant]
    kind = flag.removeprefix("--")
    code, report = _verify(tmp_path, flag, f"spec.mutants:{mutant}", *FAST, "--counterexamples", "3")
    assert code == 1
    assert report["passed"] is False
    checks = _checks(report)
    exhaustive = checks[f"exhaustive {kind}"]
    assert not exhaustive["passed"]
    found = exhaustive["counterexamples"]
    assert len(found) == 3
    assert {key: found[0][key] for key in first} == first
    assert all(c["clause"] == first["clause"] for c in found)
    assert not checks[f"property: {kind} invariants"]["passed"]
    out = capsys.readouterr().out
    assert f"exhaustive {kind} (len <= 5" in out and "failed; first counterexamples:" in out
    assert f"  {first['clause']}: answers [{', '.join(first['answers'])}]" in out


def test_legacy_scans_in_the_style_of_an_engine_pass_with_the_documented_conflation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SCAN-12: scans over bool | None lookups returning int | None pass on MISS/HIT/RETRY; on
    inputs holding a HIT_PENDING the window scan answers as if it were RETRY, which is reported
    (never failed): it defers where kvproto's scan loads, or looks up more keys."""
    code, report = _verify(
        tmp_path,
        "--legacy",
        "--prefix", f"{SCANS}:legacy_prefix",
        "--window", f"{SCANS}:legacy_window",
        *FAST,
    )
    assert code == 0, report
    assert report["targets"]["prefix"]["legacy_answers"] is True
    assert report["targets"]["prefix"]["returns"] == "int | None"
    checks = _checks(report)
    # Checked on the answers bool | None can express: MISS, HIT, RETRY.
    assert checks["exhaustive prefix"]["explored"] == sum(3**n for n in range(6))
    assert checks["exhaustive window"]["explored"] == sum(3**n for n in range(6)) * 16
    prefix = checks["bool | None conflation: prefix"]
    window = checks["bool | None conflation: window"]
    assert prefix["informational"] and window["informational"]
    assert prefix["passed"] and window["passed"]
    # The prefix scan treats HIT_PENDING and RETRY alike anyway: nothing lost.
    assert prefix["detail"].startswith("0 of the ") and prefix["counterexamples"] == []
    examples = window["counterexamples"]
    assert examples and all(c["clause"] == "SCAN-12" and "HIT_PENDING" in c["answers"] for c in examples)
    first = examples[0]
    assert first["answers"] == ["HIT", "MISS", "HIT_PENDING"]
    assert first["lookup_said"] == [True, False, None]
    assert first["scan"] == "None" and first["reference"] == "1"  # kvproto loads block 0; bool | None defers
    out = capsys.readouterr().out
    assert "bool | None conflation: window (len <= 5): " in out


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (
            ["--legacy", "--prefix", f"{SCANS}:legacy_prefix_stops_at_none"],
            {"clause": "SCAN-2", "answers": ["RETRY", "MISS"], "lookup_said": [None, False], "scan": "None"},
        ),
        (
            ["--prefix", f"{SCANS}:prefix_looks_up_indices"],
            {
                "clause": "SCAN-1..3",
                "answers": ["MISS"],
                "scan_calls": [],
                "scan": "raised ContractViolation: lookup called with 0, which is not one of the keys: "
                "the lookup takes a key (lookup(keys[i])), not an index",
            },
        ),
    ],
    ids=["legacy-gives-up-at-None", "looks-up-indices"],
)
def test_wrong_third_party_scans_fail(tmp_path: Path, args: list[str], first: dict[str, Any]) -> None:
    """SCAN-11, SCAN-12: a legacy scan that stops at None, a scan that calls lookup(i)."""
    code, report = _verify(tmp_path, *args, *FAST)
    assert code == 1
    found = _checks(report)["exhaustive prefix"]["counterexamples"]
    assert {key: found[0][key] for key in first} == first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prefix", "no_such_module_anywhere:scan"], "cannot import 'no_such_module_anywhere'"),
        (["--prefix", f"{SCANS}:no_such_scan"], "has no attribute 'no_such_scan'"),
        (["--prefix", SCANS], "expected pkg.module:function"),
        (["--prefix", f"{SCANS}:not_a_scan"], "42 is not callable"),
        (["--prefix", f"{SCANS}:takes_one_argument"], "signature (lookup) does not accept"),
        (["--window", f"{SCANS}:good_prefix"], "called as fn(lookup, keys, window, initial_window=None)"),
        (["--window", f"{SCANS}:window_without_initial_window"], "unexpected keyword argument 'initial_window'"),
        (["--prefix", f"{SCANS}:returns_a_bool"], "answered True for a single HIT key"),
        (["--prefix", "broken_scans_module:scan"], "importing 'broken_scans_module' raised RuntimeError: broken"),
        (["--legacy"], "--legacy applies to the scans of --prefix and --window"),
        (["--prefix", f"{SCANS}:good_prefix", "--examples", "0"], "--examples must be at least 1"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    """SCAN-11: an unimportable, uncallable or ill-shaped target is a usage error: exit 2, one line, no traceback."""
    (tmp_path / "broken_scans_module.py").write_text("raise RuntimeError('broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code = kvproto_cli(["verify", *args, "--no-crosshair"])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvproto verify: error: "), captured.err
    assert message in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_without_crosshair_installed_the_other_checks_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SCAN-11: CrossHair is optional; without it verify says so, skips those checks, and its
    exit status reflects the checks that ran."""
    monkeypatch.setitem(sys.modules, "crosshair", None)  # find_spec() then reports it absent
    code, report = _verify(
        tmp_path, "--prefix", f"{SCANS}:good_prefix", "--max-len", "4", "--examples", "50"
    )
    assert code == 0
    assert report["skipped"] == ["crosshair diffbehavior: prefix"]
    assert any("crosshair-tool is not installed" in note for note in report["notes"])
    assert "crosshair-tool is not installed" in capsys.readouterr().out


@pytest.mark.crosshair
def test_crosshair_diffbehavior_checks_third_party_scans(tmp_path: Path) -> None:
    """SCAN-11: CrossHair diffbehavior of each target against the reference, over valid inputs,
    finds the mutant's difference and none in the correct scan (bounded by iterations)."""
    code, report = _verify(
        tmp_path,
        "--prefix", "spec.mutants:prefix_stops_at_retry",
        "--window", f"{SCANS}:good_window",
        "--crosshair-iterations", "30",
        "--max-len", "3",
        "--examples", "20",
    )
    assert code == 1
    checks = _checks(report)
    prefix = checks["crosshair diffbehavior: prefix"]
    window = checks["crosshair diffbehavior: window"]
    assert not prefix["passed"]
    assert "Given: (" in prefix["detail"] and "target_prefix : returns" in prefix["detail"], prefix["detail"]
    assert window["passed"], window["detail"]
    assert window["explored"] is not None and window["explored"] > 0
