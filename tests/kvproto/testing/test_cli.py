"""``kvproto conform`` options: --list, bad targets, reports, selected checks (KIT-9, KIT-11)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import kvproto

from tests.cli import kvproto_cli as main


def test_list_shows_installed_tiers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("memory", "memory-async", "cpu"):
        assert name in out


def test_unknown_target_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "no_such_tier_anywhere"]) == 2
    assert "neither pkg.module:factory nor an installed tier" in " ".join(capsys.readouterr().out.split())


def test_selected_checks_with_typecheck_and_reports(tmp_path: Path) -> None:
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    code = main([
        "conform", "tests.kvproto.testing.gallery:legacy_bool_lookup",
        "--check", "lookup_answers_a_lookup_result", "--check", "test_empty_tier_misses",
        "--json", str(report), "--junit", str(junit),
    ])
    assert code == 1
    data = json.loads(report.read_text())
    assert data["kit_version"] == kvproto.__version__
    (tier,) = data["tiers"]
    assert tier["kind"] == "secondary"
    assert tier["capabilities"]["partial_jobs"] is True
    assert [c["check"] for c in tier["checks"]] == [
        "test_lookup_answers_a_lookup_result",
        "test_empty_tier_misses",
    ]
    assert {c["violated_clause"] for c in tier["checks"]} == {"LR-1"}
    assert tier["typecheck"]["problems"] == ["lookup returns bool | None; the contract requires LookupResult"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "3"
    failure = suite.find("testcase[@name='test_empty_tier_misses']/failure")
    assert failure is not None and failure.get("type") == "LR-1"


def test_clause_runs_only_the_checks_of_that_clause(tmp_path: Path) -> None:
    from kvproto.testing import SecondaryTierTests, checks_of

    report = tmp_path / "r.json"
    code = main([
        "conform", "memory", "--no-typecheck", "--profile", "fast",
        "--clause", "TIER-26,lr-1", "--clause", "TIER-11", "--json", str(report),
    ])
    assert code == 0
    (tier,) = json.loads(report.read_text())["tiers"]
    wanted = {"TIER-26", "LR-1", "TIER-11"}
    expected = [name for name, info in checks_of(SecondaryTierTests).items() if info.clause in wanted]
    assert [c["check"] for c in tier["checks"]] == expected
    assert {c["clause"] for c in tier["checks"]} == wanted
    # With --check too: the checks named that verify a clause named.
    code = main([
        "conform", "memory", "--no-typecheck", "--clause", "TIER-11",
        "--check", "partial_job_reports_succeeded_keys", "--check", "empty_tier_misses", "--json", str(report),
    ])
    assert code == 0
    (tier,) = json.loads(report.read_text())["tiers"]
    assert [c["check"] for c in tier["checks"]] == ["test_partial_job_reports_succeeded_keys"]


def test_an_unknown_clause_is_a_usage_error_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conform", "memory", "--clause", "TIER-10,TIER-999"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("kvproto conform: no kit check verifies clause TIER-999; known: ")
    assert "TIER-10, TIER-11" in out and "KIT-1," in out
    # A clause no check of the tiers given verifies (TIER-25: a primary's) selects nothing: exit 2.
    assert main(["conform", "memory", "--clause", "TIER-25"]) == 2
    assert "no kit check of the tiers given verifies clause TIER-25" in " ".join(capsys.readouterr().out.split())


def broken_factory(buffer: memoryview) -> object:
    """A target whose factory cannot build a tier."""
    raise RuntimeError("no disk at /mnt/kv")


def test_a_factory_that_cannot_build_fails_the_run(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    target = "tests.kvproto.testing.test_cli:broken_factory"
    assert main(["conform", target, "--json", str(report)]) == 1
    (tier,) = json.loads(report.read_text())["tiers"]
    assert "no disk at /mnt/kv" in tier["error"]
    assert "no disk at /mnt/kv" in tier["typecheck"]["problems"][0]


def test_hypothesis_statistics_are_reported(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code = main([
        "conform", "memory", "--profile", "fast", "--no-typecheck",
        "--check", "state_machine_against_model", "--json", str(report),
    ])
    assert code == 0
    (check,) = json.loads(report.read_text())["tiers"][0]["checks"]
    assert check["outcome"] == "passed"
    assert check["hypothesis"]["examples"] >= 10
    assert check["hypothesis"]["profile"] == "fast"


def _ghost_distribution(monkeypatch: pytest.MonkeyPatch, root: Path, *, reference: bool) -> None:
    """An installed distribution (metadata on sys.path, as pip leaves it) registering tier ``ghost``
    from a module that is not installed; a reference distribution when ``reference``."""
    info = root / "kvproto_ghost-0.1.dist-info"
    info.mkdir(parents=True)
    keywords = "Keywords: kvproto-reference\n" if reference else ""
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kvproto-ghost\nVersion: 0.1\n{keywords}")
    (info / "entry_points.txt").write_text("[kvproto.tiers]\nghost = kvproto_ghost_dependency_xyz:factory\n")
    monkeypatch.syspath_prepend(str(root))


def test_no_target_skips_a_reference_tier_whose_dependency_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """KIT-9: a reference tier missing a dependency is skipped with the reason; the others still run."""
    _ghost_distribution(monkeypatch, tmp_path, reference=True)
    assert main(["conform", "--no-typecheck", "--check", "empty_tier_misses"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "skipping tier 'ghost'" in out and "kvproto_ghost_dependency_xyz" in out
    assert "memory" in out


def test_no_target_leaves_out_tiers_of_distributions_not_marked_reference(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _ghost_distribution(monkeypatch, tmp_path, reference=False)
    assert main(["conform", "--no-typecheck", "--check", "empty_tier_misses"]) == 0
    assert "ghost" not in capsys.readouterr().out


def test_a_named_tier_whose_dependency_is_missing_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _ghost_distribution(monkeypatch, tmp_path, reference=False)
    assert main(["conform", "ghost", "--no-typecheck"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "needs 'kvproto_ghost_dependency_xyz', which is not installed" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"kvproto {kvproto.__version__}"
