"""One rule for the public surface (trio's test_exports): what ``__all__`` promises resolves, the
public modules are exactly the documented ones, nothing outside ``kvproto/`` reaches into a private
module, no distribution (nor a benchmark or a test but of what it tests) reaches into another
distribution's private module, and ``import kvproto`` stays light."""

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
    "kvproto.testing.explore",
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


#: Every distribution of this repository beside kvproto: its directory, and the packages it ships.
DISTRIBUTIONS: dict[str, frozenset[str]] = {
    str(src.parent.relative_to(ROOT)): frozenset(p.name for p in src.iterdir() if (p / "__init__.py").is_file())
    for src in sorted(ROOT.glob("*/*/src"))
    if src.parts[-3] in ("impls", "adapters", "examples")
}

#: Tests may look inside the distribution they test: ``tests/impls/NAME`` and ``tests/adapters/NAME``
#: white-box test ``kvproto_NAME``; the kit's own tests (``tests/kvproto/testing``) build their broken
#: tiers (galleries, mutation specs) from the reference tiers' parts. No other test, and no file of a
#: distribution, benchmark or example, reaches into another distribution's private module.
TESTS_LOOK_INSIDE: dict[str, frozenset[str]] = {
    **{f"tests/{kind}/{d.name}": frozenset({f"kvproto_{d.name}"})
       for kind in ("impls", "adapters") for d in sorted((ROOT / "tests" / kind).iterdir()) if d.is_dir()},
    "tests/kvproto/testing": frozenset({"kvproto_fs", "kvproto_obj"}),
}


def _distribution_packages() -> frozenset[str]:
    return frozenset(name for packages in DISTRIBUTIONS.values() for name in packages)


def _foreign_private_imports(source: str, own: frozenset[str]) -> list[str]:
    """The imports in ``source`` (any depth) of a private module or name of a distribution package not in ``own``."""
    packages = _distribution_packages() - own
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] in packages and any(part.startswith("_") for part in parts[1:]):
                found.append(name)
    return sorted(set(found))


def _own_packages(path: Path) -> frozenset[str]:
    """The distribution packages whose private modules ``path`` may import: its own distribution's, or
    for a test, those of the distribution it tests (TESTS_LOOK_INSIDE)."""
    rel = path.relative_to(ROOT).as_posix()
    for where, packages in {**DISTRIBUTIONS, **TESTS_LOOK_INSIDE}.items():
        if rel.startswith(where + "/"):
            return packages
    return frozenset()


def test_no_distribution_imports_another_distributions_private_module() -> None:
    """A distribution (impls/*, adapters/*, examples/*), a benchmark, the spec or a test imports only
    the public API of another distribution (kvproto_fs._io, kvproto_obj._listing, ... are its own)."""
    assert {"impls/fs", "impls/obj", "impls/cpu", "adapters/vllm", "adapters/lmcache"} <= DISTRIBUTIONS.keys()
    assert {"kvproto_fs", "kvproto_obj", "kvproto_cpu", "kvproto_vllm", "kvproto_lmcache"} <= _distribution_packages()
    assert TESTS_LOOK_INSIDE["tests/impls/obj"] == {"kvproto_obj"}
    skip = {".git", ".venv", "kvproto", "build", "dist"}
    files = [
        p for p in ROOT.rglob("*.py")
        if p.relative_to(ROOT).parts[0] not in skip and ".venv" not in p.parts and "build" not in p.parts
    ]
    assert any(p.parts[-2] == "benchmarks" for p in files)
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted(files)
        for name in _foreign_private_imports(path.read_text(), _own_packages(path))
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("source", "own", "expected"),
    [
        ("from kvproto_obj._listing import LIST_PAGE", frozenset(), ["kvproto_obj._listing", "kvproto_obj._listing.LIST_PAGE"]),
        ("def f():\n    import kvproto_fs._io", frozenset(), ["kvproto_fs._io"]),
        ("from kvproto_obj import _listing", frozenset(), ["kvproto_obj._listing"]),
        ("from kvproto_obj._listing import LIST_PAGE", frozenset({"kvproto_obj"}), []),
        ("from kvproto_obj import ObjTier, StoreOps", frozenset(), []),
    ],
)
def test_the_distribution_rule_sees_every_kind_of_import(source: str, own: frozenset[str], expected: list[str]) -> None:
    assert _foreign_private_imports(source, own) == expected


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


def test_importing_the_kit_package_imports_no_test_framework() -> None:
    """``import kvproto.testing`` loads its names on first use: no pytest, no Hypothesis until a check,
    a state machine or a strategy is asked for (its docstring says so)."""
    probe = "import sys, kvproto.testing; print(sorted(m for m in ('pytest', 'hypothesis') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_importing_a_reference_tier_or_an_adapter_loads_no_part_of_the_kit() -> None:
    """A tier's production modules never import the kit (issue 36): ``import kvproto_fs`` (and obj, redis, mooncake, cpu,
    the vLLM and LMCache adapters) loads no ``kvproto.testing`` module; their ``conformance_spec`` loads
    it on first use."""
    probe = (
        "import sys, kvproto_fs, kvproto_obj, kvproto_redis, kvproto_mooncake, kvproto_cpu, kvproto_vllm, kvproto_lmcache; "
        "print(sorted(m for m in sys.modules if m.startswith('kvproto.testing'))); "
        "kvproto_fs.conformance_spec; print('kvproto.testing' in sys.modules)"
    )
    env = os.environ | {"LMCACHE_TRACK_USAGE": "false"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env).stdout
    assert out.strip().splitlines()[-2:] == ["[]", "True"]


def test_the_contract_tests_run_without_torch() -> None:
    """tests/kvproto needs no torch: every module imports, and the contract, manager and tierkit tests pass,
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
    # Every module imported above; the simulator's and the CLI's runs (minutes of simulated serving, the
    # same code paths as the manager's) are left to the suite's own run.
    heavy = [f"--ignore={path.relative_to(ROOT)}" for path in (ROOT / "tests/kvproto").glob("test_*.py")
             if path.name.startswith(("test_cli", "test_simulat", "test_metrics_simulate", "test_exports"))]
    run = subprocess.run(
        [sys.executable, "-c", blocked, "tests/kvproto", "--ignore=tests/kvproto/testing", *heavy],
        cwd=ROOT, capture_output=True, text=True, check=False, env=env,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout
