"""The house reads top-down: no import runs back up from the contract to the tools built on it.

Checked by AST over the sources (every import, at any depth, type-only ones included):

* the contract's core (``kvproto/*.py`` but ``__main__``, its private packages such as
  ``kvproto/_tiering/``, ``kvproto.scan``, ``errors``, ``members``, ``envelope``) and
  ``kvproto.tierkit`` never import ``kvproto.testing`` (the kit, the fault wrappers, the simulator)
  nor ``kvproto._cli`` (the command line);
* the kit never imports the command line;
* a reference tier (``impls/*``) imports ``kvproto.testing`` only from its ``_conformance.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KVPROTO = ROOT / "kvproto"

TOOLS = ("kvproto.testing", "kvproto._cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, *, is_package: bool = False) -> set[str]:
    """Every module ``source`` (the text of ``module``) imports, relative imports resolved; for
    ``from X import name`` both ``X`` and ``X.name`` (``name`` may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join([*base_parts, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _reaches(imported: set[str], targets: tuple[str, ...]) -> list[str]:
    return sorted(m for m in imported if any(m == t or m.startswith(t + ".") for t in targets))


def _violations(paths: list[Path], targets: tuple[str, ...]) -> dict[str, list[str]]:
    bad: dict[str, list[str]] = {}
    for path in paths:
        module = _module_name(path)
        hits = _reaches(imported_modules(path.read_text(), module, is_package=path.name == "__init__.py"), targets)
        if hits:
            bad[str(path.relative_to(ROOT))] = hits
    return bad


def _core_files() -> list[Path]:
    tools = {KVPROTO / d for d in ("testing", "_cli", "_simulation", "_verification")}
    files = [p for p in KVPROTO.rglob("*.py") if not any(t in p.parents for t in tools)]
    return sorted(p for p in files if p != KVPROTO / "__main__.py")  # __main__ is the command line's door


def test_the_core_and_the_tierkit_never_import_the_kit_or_the_command_line() -> None:
    files = _core_files()
    assert KVPROTO / "scan.py" in files and KVPROTO / "__init__.py" in files
    assert any(p.parent == KVPROTO / "_tiering" for p in files)
    assert _violations(files, TOOLS) == {}


def test_the_tierkit_never_imports_the_kit_or_the_command_line() -> None:
    kit = KVPROTO / "tierkit"
    assert kit.is_dir()
    assert _violations(sorted(kit.rglob("*.py")), TOOLS) == {}


def test_the_kit_never_imports_the_command_line_nor_the_tools_beside_it() -> None:
    files = sorted((KVPROTO / "testing").rglob("*.py"))
    assert KVPROTO / "testing" / "_harness" / "driver.py" in files
    # kvproto.testing.scans is the public face of the scan verifier: the one import the kit makes of it.
    others = [p for p in files if p != KVPROTO / "testing" / "scans.py"]
    assert _violations(others, ("kvproto._cli", "kvproto._simulation", "kvproto._verification")) == {}
    assert _violations([KVPROTO / "testing" / "scans.py"], ("kvproto._cli", "kvproto._simulation")) == {}


def test_the_simulator_and_the_scan_verifier_never_import_the_command_line() -> None:
    """``kvproto simulate``'s engine (``kvproto._simulation``) may use the kit's public fault wrappers;
    ``kvproto verify``'s (``kvproto._verification``) needs nothing of the kit; neither imports the CLI."""
    simulation = sorted((KVPROTO / "_simulation").rglob("*.py"))
    verification = sorted((KVPROTO / "_verification").rglob("*.py"))
    assert simulation and verification
    assert _violations(simulation, ("kvproto._cli", "kvproto._verification")) == {}
    assert _violations(verification, ("kvproto._cli", "kvproto.testing", "kvproto._simulation")) == {}


def test_reference_tiers_import_the_kit_only_for_their_conformance_specs() -> None:
    files = sorted((ROOT / "impls").glob("*/src/*/**/*.py"))
    assert files, "no reference tier sources found"
    others = [p for p in files if p.name != "_conformance.py"]
    assert _violations(others, ("kvproto.testing",)) == {}


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        ("import kvproto.testing.faults", "kvproto._x", ["kvproto.testing.faults"]),
        ("from kvproto.testing import faults", "kvproto._x", ["kvproto.testing", "kvproto.testing.faults"]),
        ("def f():\n    from kvproto._cli import main", "kvproto.scan", ["kvproto._cli", "kvproto._cli.main"]),
        ("from ..testing import faults", "kvproto._tiering._manager", ["kvproto.testing", "kvproto.testing.faults"]),
        ("from . import _guard", "kvproto._tiering._manager", []),
        ("import kvproto.testingx", "kvproto._x", []),
    ],
)
def test_the_scan_sees_every_kind_of_import(source: str, module: str, expected: list[str]) -> None:
    assert _reaches(imported_modules(source, module), TOOLS) == expected


def test_nothing_below_the_tools_nor_an_engines_hosting_path_imports_the_kit() -> None:
    """Issue 36: hosting a tier in an engine, or importing a tier, needs no part of the kit.

    * ``kvproto/`` outside the kit (``kvproto/testing``), the command line (``kvproto/_cli``) and the
      simulator (``kvproto/_simulation``, which uses the kit's public fault wrappers) never imports
      ``kvproto.testing``: ``kvproto.hosting`` and the one resolver (``kvproto._tier_names``, with
      ``kvproto._tier_spec``) included;
    * an engine adapter (``adapters/*/src``) imports ``kvproto.testing`` only from its kit-facing
      modules: ``testing.py`` (its pytest suite base), ``_conformance.py`` (the specs it registers
      under ``kvproto.tiers``) and ``_targets.py`` (the ``kvproto conform ENGINE:MODULE:CLASS`` scheme,
      which returns the kit's specs); its hosting path (``_as_vllm.py``, ``_as_lmcache.py``) and
      every other module import :mod:`kvproto.hosting` instead;
    * a reference tier (``impls/*/src``) imports it only from its ``_conformance.py``.
    """
    tools = {KVPROTO / d for d in ("testing", "_cli", "_simulation")}
    below = sorted(p for p in KVPROTO.rglob("*.py") if not any(t in p.parents for t in tools))
    assert KVPROTO / "hosting.py" in below and KVPROTO / "_tier_names.py" in below
    assert _violations(below, ("kvproto.testing",)) == {}
    kit_facing = {"testing.py", "_conformance.py", "_targets.py"}
    adapters = sorted((ROOT / "adapters").glob("*/src/*/**/*.py"))
    hosting = [p for p in adapters if p.name in ("_as_vllm.py", "_as_lmcache.py")]
    assert len(hosting) == 2
    assert _violations([p for p in adapters if p.name not in kit_facing], ("kvproto.testing",)) == {}
    impls = sorted((ROOT / "impls").glob("*/src/*/**/*.py"))
    assert impls
    assert _violations([p for p in impls if p.name != "_conformance.py"], ("kvproto.testing",)) == {}
