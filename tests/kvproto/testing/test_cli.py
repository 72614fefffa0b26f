"""``kvproto conform`` options: --list, bad targets, reports, selected checks (KIT-9, KIT-11)."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import kvproto
from kvproto.cli import main
from kvproto.testing import _targets
from kvproto.testing._targets import installed_tiers


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


def test_import_kvproto_does_not_import_the_kit_or_its_dependencies() -> None:
    probe = "import sys, kvproto; print(sorted(m for m in ('pytest', 'hypothesis', 'mypy', 'kvproto.testing') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


_INSTALLED = installed_tiers()  # read before any test patches it


def _ghost_and_memory() -> list[EntryPoint]:
    """The real ``memory`` entry point beside one whose module is not installed."""
    memory = [ep for ep in _INSTALLED if ep.name == "memory"]
    ghost = EntryPoint("ghost", "kvproto_ghost_dependency_xyz:factory", "kvproto.tiers")
    return [ghost, *memory]


def test_no_target_skips_a_reference_tier_whose_dependency_is_missing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """KIT-9: without torch, `kvproto conform` still checks the other reference tiers, and says why."""
    monkeypatch.setattr(_targets, "reference_tiers", _ghost_and_memory)
    monkeypatch.setattr(_targets, "installed_tiers", _ghost_and_memory)
    assert main(["conform", "--no-typecheck", "--check", "empty_tier_misses"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "skipping tier 'ghost'" in out and "kvproto_ghost_dependency_xyz" in out
    assert "memory" in out


def test_a_named_tier_whose_dependency_is_missing_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_targets, "installed_tiers", _ghost_and_memory)
    assert main(["conform", "ghost", "--no-typecheck"]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "needs 'kvproto_ghost_dependency_xyz', which is not installed" in out
