"""``kvproto conform vllm:MODULE:CLASS [--option KEY=VALUE ...]``: the kit on any vLLM 0.33 tier class,
built as vLLM's tier factory builds it (kvproto_vllm._targets), and the pytest base class for vLLM
tier authors (kvproto_vllm.testing.VllmTierTests).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvproto_vllm.testing import VllmTierTests
from tests.adapters.kit_reports import conform_report
from tests.adapters.vllm import vllm_support
from tests.adapters.vllm.test_kit_finds_vllm_defects import DEFECTS, NO_RESET_CHECKS
from tests.cli import kvproto_cli

ROOT = Path(__file__).resolve().parents[3]
FS = "vllm:vllm.v1.kv_offload.tiering.fs.manager:FileSystemTierManager"
BUFFERED = "vllm:tests.adapters.vllm.vllm_tiers:BufferedFileSystemTier"
COPYING = "vllm:tests.adapters.vllm.vllm_tiers:CopyingDictTier"
STOPS = "vllm:tests.adapters.vllm.vllm_tiers:StopsAtFirstMissingKey"
WHOLE = "vllm:tests.adapters.vllm.vllm_tiers:FailsWholeOnAMissingKey"
FORGETS = "vllm:tests.adapters.vllm.vllm_tiers:ForgetsAFailedPromotion"
CPU = "vllm:vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager"
#: What vllm-fs passes vLLM's FileSystemTierManager besides the root (kvproto_vllm._conformance).
FS_OPTIONS = ["--option", "n_read_threads=2", "--option", "n_write_threads=2", "--option", "enable_kv_events=true"]
#: The same tiers, by registered name and by class.
SAME = {FS: "vllm-fs-direct", BUFFERED: "vllm-fs", CPU: "vllm-cpu"}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, dict[str, dict[str, Any]]]]:
    out = tmp_path_factory.mktemp("conform-any")
    # vLLM's fs tier picks O_DIRECT here and every store fails (EINVAL), so a whole run stops at the
    # preflight (KIT-17) as vllm-fs-direct's does: the class's run selects the defect checks (no preflight).
    selected = [arg for check in DEFECTS[SAME[FS]] for arg in ("--check", check)]
    return {
        FS: conform_report(out / "fs.json", FS, *FS_OPTIONS, *selected),
        BUFFERED: conform_report(out / "buffered.json", BUFFERED, *FS_OPTIONS),
        CPU: conform_report(out / "cpu.json", CPU),
        # No kit.* option: a correct plugin class conforms as it is (issue 40: TIER-18 and CAP-4 blamed it).
        COPYING: conform_report(out / "copying.json", COPYING),
        STOPS: conform_report(out / "stops.json", STOPS),
        WHOLE: conform_report(out / "whole.json", WHOLE),
        FORGETS: conform_report(out / "forgets.json", FORGETS),
    }


@pytest.mark.parametrize("target", sorted(SAME))
def test_a_vllm_class_reports_the_findings_of_its_registered_name(
    reports: dict[str, tuple[int, dict[str, dict[str, Any]]]], target: str
) -> None:
    """Each defect the registered name is known for (test_kit_finds_vllm_defects.DEFECTS) is found,
    naming the same clause, when the class is named instead; the expected failures are the same."""
    code, checks = reports[target]
    assert code == 1
    for check, (clause, words) in DEFECTS[SAME[target]].items():
        # Where every store fails (FS), a check whose set-up is a store says "set-up failed" on TIER-10: an error.
        assert checks[check]["outcome"] in ({"failed", "error"} if target == FS else {"failed"}), checks[check]
        assert checks[check]["violated_clause"] == clause and words in checks[check]["reason"], checks[check]
    xfailed = {name for name, c in checks.items() if c["outcome"] == "xfailed"}
    assert xfailed == (set(NO_RESET_CHECKS) if target == BUFFERED else set())


@pytest.mark.parametrize("target", [COPYING, STOPS, WHOLE, FORGETS])
def test_a_correct_vllm_tier_written_outside_kvproto_conforms(
    reports: dict[str, tuple[int, dict[str, dict[str, Any]]]], target: str
) -> None:
    """With no option (issue 40): neither TIER-18 (every ability known), nor CAP-4 (a partial load is
    vLLM's interface), nor TIER-10 for a load that stops at, or fails whole on, its first missing key,
    nor for a tier forgetting a key whose promotion failed (the bridge never promotes a key it is still
    storing, as vLLM's manager never does: VLLM-9) blames it."""
    code, checks = reports[target]
    failed = {name: c["reason"] for name, c in checks.items() if c["outcome"] == "failed"}
    assert failed == {} and code == 0
    assert {name for name, c in checks.items() if c["outcome"] == "xfailed"} == set(NO_RESET_CHECKS)


class TestCopyingDictTierInTheAuthorsSuite(VllmTierTests):
    """What a vLLM tier author writes in their own suite: every kit check, as pytest tests."""

    vllm_tier = "tests.adapters.vllm.vllm_tiers:CopyingDictTier"
    vllm_options = {"kit.partial_jobs": True}
    kit_profile = "fast"


def test_the_base_class_gives_an_fs_subclass_the_fs_hooks_and_a_fresh_root() -> None:
    class TestBuffered(VllmTierTests):
        vllm_tier = "tests.adapters.vllm.vllm_tiers:BufferedFileSystemTier"

    assert TestBuffered.has_hook(TestBuffered(), "reopen") and TestBuffered.has_hook(TestBuffered(), "seed_block")
    assert set(TestBuffered.expected_failures) == set(NO_RESET_CHECKS)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["memory", "--option", "n=1"], "memory: unknown option 'n'; its factory takes: capacity_blocks"),
        (["memory", "--option", "capacity_blocks=xx"], "memory: option capacity_blocks='xx' is not a whole number"),
        (["trtllm:a.b:C"], "no installed distribution handles trtllm: targets"),
        ([FS, "--option", "kit.async_lookup=yes"], "expected a JSON bool, got 'yes'"),  # not JSON: a string
        ([FS, "--option", "kit.async_lookup=\"true\""], "expected a JSON bool, got 'true'"),  # a JSON string
        ([FS, "--option", "kit.max_retry_steps=true"], "expected a JSON int, got True"),  # JSON
        ([FS, "--option", "novalue"], "expected KEY=VALUE"),
        ([FS, "--option", "=3"], "expected KEY=VALUE"),
        ([FS, "--option", "kit.speed=1"], "not a capability"),
        (["vllm:vllm.v1.kv_offload.base:OffloadKey"], "has no class"),
        (["vllm:vllm.v1.kv_offload.base:Medium"], "neither a vLLM SecondaryTierManager nor a CPUOffloadingManager"),
        (["vllm:tests.adapters.vllm.no_such_module:X"], "No module named"),
    ],
)
def test_bad_targets_and_options_are_usage_errors_in_one_line(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert kvproto_cli(["conform", *argv, "--no-typecheck"]) == 2
    out = capsys.readouterr().out
    assert words in out and len(out.strip().splitlines()) == 1, out


needs_no_deps_vllm = pytest.mark.skipif(
    vllm_support.real_connector_imports(),
    reason="vLLM's full dependency set is installed here: nothing is missing to name",
)


def _plain_cli(*argv: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The installed ``kvproto`` script, in a fresh process without the test stand-ins."""
    script = Path(sys.executable).with_name("kvproto")
    return subprocess.run(
        [str(script), *argv], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "400", **(env or {})},
    )


def test_vllm_example_names_a_missing_vllm_dependency_and_the_supported_installation(tmp_path: Path) -> None:
    """vLLM's base modules need msgspec. Where it cannot be imported (here a package first on the
    path that raises as an absent one does: this environment has msgspec), ``kvproto conform
    vllm-example``, run as a user runs it from their own directory, names it and the remedy."""
    shadow = tmp_path / "shadow" / "msgspec"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'msgspec'\", name='msgspec')\n")
    got = _plain_cli("conform", "vllm-example", "--no-typecheck", cwd=tmp_path,
                     env={"PYTHONPATH": str(shadow.parent)})
    assert got.returncode == 2, got.stdout + got.stderr
    (line,) = got.stdout.strip().splitlines()
    assert "tier 'vllm-example'" in line and "needs 'msgspec', which is not installed" in line, line
    assert "vLLM installed without its dependencies?" in line and "pip install 'kvproto-vllm[vllm]'" in line, line


@needs_no_deps_vllm
@pytest.mark.parametrize("target", ["vllm-fs", "vllm-cpu", FS])
def test_without_vllms_dependencies_the_error_names_what_is_missing_and_how_to_install(target: str) -> None:
    got = _plain_cli("conform", target, "--no-typecheck")
    assert got.returncode == 2, got.stdout + got.stderr
    assert "is not installed (vLLM installed without its dependencies?)" in got.stdout, got.stdout
    assert "pip install 'kvproto-vllm[vllm]'" in got.stdout, got.stdout


@needs_no_deps_vllm
def test_the_example_tier_runs_from_the_plain_cli_where_its_modules_import() -> None:
    """vllm-example needs only vLLM's tiering base modules: the plain CLI runs the kit on it (and
    finds its defect: it copies no bytes)."""
    got = _plain_cli("conform", "vllm-example", "--no-typecheck", "--profile", "fast",
                     "--check", "load_copies_stored_bytes_into_requested_slots")
    assert got.returncode == 1, got.stdout + got.stderr
    assert "was never written" in got.stdout
