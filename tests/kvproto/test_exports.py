"""One rule for the public surface (trio's test_exports): what ``__all__`` promises resolves, the
public modules are exactly the documented ones, nothing outside ``kvproto/`` reaches into a private
module, and ``import kvproto`` stays light."""

from __future__ import annotations

import ast
import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvproto

ROOT = Path(__file__).resolve().parents[2]

#: Every public module, and nothing else: errors, members, scan, hosting a tier by name, the kit and what the kit needs.
PUBLIC_MODULES = {
    "kvproto",
    "kvproto.envelope",
    "kvproto.errors",
    "kvproto.hosting",
    "kvproto.members",
    "kvproto.metrics",
    "kvproto.scan",
    "kvproto.testing",
    "kvproto.testing.faults",
    "kvproto.testing.plugin",
    "kvproto.testing.scans",
    "kvproto.testing.stateful",
    "kvproto.testing.strategies",
    "kvproto.tierkit",
}


def _all_modules() -> set[str]:
    found = {"kvproto"}
    for info in pkgutil.walk_packages(kvproto.__path__, "kvproto."):
        found.add(info.name)
    return found


def _is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split(".")[1:])


def test_public_modules_are_exactly_the_documented_ones() -> None:
    public = {m for m in _all_modules() if not _is_private(m)}
    assert public == PUBLIC_MODULES


@pytest.mark.parametrize("module", sorted(PUBLIC_MODULES))
def test_every_name_in_all_resolves(module: str) -> None:
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None)
    assert isinstance(names, list) and names, f"{module} has no __all__"
    assert len(names) == len(set(names)), f"{module}.__all__ repeats a name"
    missing = [n for n in names if not hasattr(mod, n)]
    assert missing == []


def test_the_top_level_exports_every_name_a_user_writes() -> None:
    for name in ("TieringManager", "TieringConfig", "TieringStats", "AsyncProbe", "MemoryTier", "MemoryPrimaryTier"):
        assert name in kvproto.__all__
    # Public values are re-exported from their private homes, never defined in a public module twice.
    for name in kvproto.__all__:
        value = getattr(kvproto, name)
        home = getattr(value, "__module__", None)
        if isinstance(home, str) and home.startswith("kvproto"):
            assert home == "kvproto" or _is_private(home) or home in PUBLIC_MODULES, (name, home)


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("kvproto") and _is_private(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            if node.module.split(".")[0] != "kvproto":
                continue
            if _is_private(node.module):
                found.append(node.module)
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_") and a.name != "__version__"]
    return [f"{path.relative_to(ROOT)}: {name}" for name in found]


def test_no_file_outside_kvproto_imports_a_private_module() -> None:
    skip = {".git", ".venv", "kvproto", "build", "dist"}
    files = [
        p for p in ROOT.rglob("*.py")
        if p.relative_to(ROOT).parts[0] not in skip and ".venv" not in p.parts and "build" not in p.parts
    ]
    assert len(files) > 50, "the walk found far fewer files: the layout changed?"
    offenders = [line for path in sorted(files) for line in _private_imports(path)]
    assert offenders == []


def test_import_kvproto_stays_light() -> None:
    """The contract imports no test framework, no torch, no pydantic, no CLI (rich) and not the kit."""
    heavy = ("torch", "pytest", "hypothesis", "mypy", "pydantic", "rich", "kvproto.testing", "kvproto._cli")
    probe = f"import sys, kvproto; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_importing_the_kit_does_not_import_the_cli_engine() -> None:
    probe = "import sys, kvproto.testing; print(sorted(m for m in sys.modules if m.startswith('kvproto._cli')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_contract_tests_run_without_torch() -> None:
    """tests/kvproto needs no torch: every module imports, and the contract and manager tests pass,
    with torch made unimportable (only tests/impls/cpu needs it)."""
    blocked = (
        "import sys; sys.modules['torch'] = None; import pytest; "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-x', *sys.argv[1:]]))"
    )
    collect = subprocess.run(
        [sys.executable, "-c", blocked, "--collect-only", "tests/kvproto"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    # This run is about torch, not about how deep the properties search (the suite's own run of the
    # same tests does that, under the ci profile in CI): Hypothesis' smoke profile, CI's larger
    # example counts off. Every test still runs, torch-free.
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"HYPOTHESIS_PROFILE": "smoke"}
    run = subprocess.run(
        [sys.executable, "-c", blocked, "tests/kvproto", "--ignore=tests/kvproto/testing",
         "--ignore=tests/kvproto/test_exports.py"],
        cwd=ROOT, capture_output=True, text=True, check=False, env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
