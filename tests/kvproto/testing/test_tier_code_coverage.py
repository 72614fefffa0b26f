"""The tier's own code run by a conformance run (KIT-24): ``kvproto conform`` measures which lines
and branches of the tier's package its checks ran (coverage.py, in the process running the checks),
says the share in its verdict and its JSON, and names each function that never ran as not checked.

The tier here is a small package written for the test: a MemoryTier subclass (kvproto's code, not
the tier's) with a counter its stores run, a branch no check takes, a function nothing calls, and a
protocol whose ``...`` bodies count as no code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli import kvproto_cli as main

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = "kit_coverage_small_tier"
CHECKS = "store_writes_exact_bytes or hit_after_successful_store"

_TIER = '''
from typing import Protocol

from kvproto import MemoryTier


class Counted(Protocol):
    """A protocol: its members' ``...`` bodies are no code to run."""

    def count(self) -> int: ...


class SmallTier(MemoryTier):
    """A MemoryTier counting its stores; past a million it would call a function nothing reaches."""

    stores = 0

    def submit_store(self, job):
        self.stores += 1
        if self.stores > 1_000_000:
            unreachable_helper(self.stores)
        return super().submit_store(job)


def unreachable_helper(count):
    """No check can reach this: the kit never stores a million times."""
    return count * 2
'''

_SPEC = f'''
from kvproto.testing import MEMORY_HOOKS, TierSpec

from {PACKAGE}._tier import SmallTier


def conformance_spec():
    def build(buffer):
        return SmallTier(buffer, name="small")

    return TierSpec("small", "secondary", build, hooks=MEMORY_HOOKS, tier_class=SmallTier)
'''


@pytest.fixture(scope="module")
def small_tier_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The folder holding the package ``kit_coverage_small_tier`` (``_tier.py``, ``_spec.py``), importable."""
    root = tmp_path_factory.mktemp("small-tier")
    package = root / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_tier.py").write_text(textwrap.dedent(_TIER))
    (package / "_spec.py").write_text(textwrap.dedent(_SPEC))
    sys.path.insert(0, str(root))
    try:
        yield root
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def small_tier(small_tier_root: Path) -> str:
    """The small tier's target."""
    return f"{PACKAGE}._spec:conformance_spec"


@pytest.fixture(scope="module")
def measured_run(small_tier: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """One ``kvproto conform`` of the small tier (two checks): its exit code, JSON report and JUnit file."""
    folder = tmp_path_factory.mktemp("report")
    report, junit = folder / "report.json", folder / "report.xml"
    code = main(["conform", small_tier, "-k", CHECKS, "--profile", "fast", "--no-typecheck",
                 "--json", str(report), "--junit", str(junit)])
    return code, json.loads(report.read_text()), junit


def _coverage(data: dict[str, Any]) -> dict[str, Any]:
    (tier,) = data["tiers"]
    found: dict[str, Any] = tier["coverage"]
    return found


def test_a_function_no_check_reaches_is_named_not_checked(measured_run: tuple[int, dict[str, Any], Path]) -> None:
    code, data, _ = measured_run
    assert code == 0  # what ran is reported beside the verdict, never as a failure
    ran = _coverage(data)
    assert ran["packages"] == [PACKAGE]
    assert ran["left_out"] == [f"{PACKAGE}._spec"]  # the conformance spec is the kit's scaffolding
    assert ran["not_checked"] == [f"{PACKAGE}._tier.unreachable_helper"]
    assert ran["not_measured"] is None


def test_the_share_of_lines_and_branches_run_is_below_all(measured_run: tuple[int, dict[str, Any], Path]) -> None:
    _, data, _ = measured_run
    ran = _coverage(data)
    # submit_store's four statements ran but the call it never makes; unreachable_helper's one never ran.
    assert (ran["lines_run"], ran["lines"]) == (3, 5)
    assert ran["share"] == round(3 / 5, 4) < 1  # the verdict still conforms (test above): a figure, not a check
    assert (ran["branches_run"], ran["branches"]) == (1, 2)  # the stores > 1,000,000 branch never taken
    assert ran["branch_share"] == 0.5
    assert ran["modules"] == {f"{PACKAGE}._tier": {"lines": 5, "lines_run": 3, "branches": 2, "branches_run": 1}}
    assert "forked children" in ran["not_measured_ever"]


def test_the_verdict_says_the_share_and_names_what_never_ran(
    small_tier: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["conform", small_tier, "-k", "store_writes_exact_bytes", "--profile", "fast", "--no-typecheck"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"tier code run (KIT-24), in {PACKAGE} (left out: {PACKAGE}._spec): " in out
    assert "not checked (no check ran them), 1 functions: kit_coverage_small_tier._tier.unreachable_helper" in out
    assert "1 not checked" in out  # the summary's "code run" column


def test_junit_carries_the_coverage_figures(measured_run: tuple[int, dict[str, Any], Path]) -> None:
    _, data, junit = measured_run
    (suite,) = ET.parse(junit).getroot()
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert json.loads(props["coverage"] or "null") == _coverage(data)


def test_no_coverage_measures_nothing(small_tier: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code = main(["conform", small_tier, "-k", "store_writes_exact_bytes", "--profile", "fast", "--no-typecheck",
                 "--no-coverage", "--json", str(report)])
    assert code == 0
    assert _coverage(json.loads(report.read_text())) is None


def test_cover_names_the_code_to_measure(small_tier: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    code = main(["conform", small_tier, "-k", "store_writes_exact_bytes", "--profile", "fast", "--no-typecheck",
                 "--cover", f"{PACKAGE}._tier", "--json", str(report)])
    assert code == 0
    ran = _coverage(json.loads(report.read_text()))
    assert (ran["packages"], ran["left_out"]) == ([f"{PACKAGE}._tier"], [])
    assert ran["not_checked"] == [f"{PACKAGE}._tier.unreachable_helper"]


def test_without_coverage_py_the_report_says_it_was_not_measured(small_tier: str, small_tier_root: Path,
                                                                 tmp_path: Path) -> None:
    """coverage.py is not importable (as where only pytest, Hypothesis and mypy are installed): the run
    still conforms, and its figures say why there are none, never 100%."""
    report = tmp_path / "report.json"
    hidden = (
        "import sys; sys.modules['coverage'] = None\n"  # import coverage raises ImportError
        "from kvproto._cli import main\n"
        f"raise SystemExit(main(['conform', {small_tier!r}, '-k', 'store_writes_exact_bytes', '--profile', 'fast',"
        f" '--no-typecheck', '--json', {str(report)!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(small_tier_root), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", hidden], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = _coverage(json.loads(report.read_text()))
    assert ran["not_measured"] == "coverage.py is not installed (pip install 'kvproto[kit]')"
    assert (ran["share"], ran["lines"], ran["not_checked"]) == (None, 0, [])
    assert "not measured: coverage.py is not installed" in done.stdout


def test_the_pytest_plugin_measures_the_package_it_is_given(small_tier: str, small_tier_root: Path, tmp_path: Path) -> None:
    """``pytest --kvproto-tier TARGET --kvproto-cover PACKAGE``: the terminal summary says the share
    and names what never ran, as ``kvproto conform`` does."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(small_tier_root), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--kvproto-tier", small_tier,
         "--kvproto-profile", "fast", "--kvproto-cover", PACKAGE, "-k", "store_writes_exact_bytes"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"tier code run (KIT-24), in {PACKAGE}: " in done.stdout
    # Measured as named: the spec's module is the package's too, and its factory ran.
    assert f"not checked (no check ran them), 1 functions: {PACKAGE}._tier.unreachable_helper" in done.stdout


def _measured(tmp_path: Path, target: str, *args: str) -> dict[str, Any]:
    """The ``coverage`` of one ``kvproto conform TARGET`` running one check (lookup_does_not_block)."""
    report = tmp_path / "report.json"
    code = main(["conform", target, *args, "-k", "lookup_does_not_block", "--profile", "fast", "--no-typecheck",
                 "--json", str(report)])
    assert code == 0
    return _coverage(json.loads(report.read_text()))


@pytest.mark.parametrize(
    ("target", "packages", "left_out"),
    [
        ("memory", ["kvproto._memory_tier"], []),
        ("memory-async", ["kvproto._memory_tier"], []),  # a LatencySecondary (the kit's) over a MemoryTier
        ("memory-primary", ["kvproto._memory_primary_tier"], []),
        ("fs", ["kvproto_fs"], ["kvproto_fs._conformance"]),  # its spec's factory and hooks live there
    ],
)
def test_the_tiers_code_is_its_classs_package_not_kvprotos_nor_the_kits(
    tmp_path: Path, target: str, packages: list[str], left_out: list[str]
) -> None:
    """kvproto's in-memory tiers: their class's own module, through the kit's wrappers; a reference
    distribution: its package, its conformance spec left out."""
    ran = _measured(tmp_path, target)
    assert (ran["packages"], ran["left_out"]) == (packages, left_out)
    assert 0 < ran["lines_run"] < ran["lines"]


def test_an_engine_plugin_inside_the_engines_package_is_its_module(tmp_path: Path) -> None:
    """``lmcache:MODULE:CLASS`` with MODULE one of LMCache's own: that module alone, not all of
    LMCache's adapters."""
    pytest.importorskip("lmcache", reason="LMCache 0.5.6 is not installed (./dev installs it)")
    module = "lmcache.v1.distributed.l2_adapters.mock_l2_adapter"
    ran = _measured(tmp_path, f"lmcache:{module}:MockL2Adapter", "--option", "max_size_gb=1",
                    "--option", "mock_bandwidth_gb=100")
    assert (ran["packages"], ran["left_out"]) == ([module], [])
    assert all(name.startswith(f"{module}.") for name in ran["not_checked"])
