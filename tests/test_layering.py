"""The house reads top-down: no import runs back up from the contract to the tools built on it.

Checked by AST over the sources (every import, at any depth, type-only ones included):

* the contract's core (``kvproto/*.py`` but ``__main__``, its private packages such as
  ``kvproto/_tiering/``, ``kvproto.scan``, ``errors``, ``members``, ``envelope``) and
  ``kvproto.tierkit`` never import ``kvproto.testing`` (the kit, the fault wrappers, the simulator)
  nor ``kvproto._cli`` (the command line);
* the kit never imports the command line;
* a reference tier (``impls/*``) imports ``kvproto.testing`` only from its ``_conformance.py``;
* the import picture of kvproto's units has no cycle and every arrow points down or sideways across
  these floors (:data:`FLOORS`), lowest first:

  0. base: ``kvproto.errors``, ``kvproto.members`` and ``kvproto._results`` (the LookupResult the
     members name);
  1. core: every other top-level private module or package (``kvproto/_x.py``, ``kvproto/_x/``)
     and the public ``kvproto.scan`` and ``kvproto.envelope``: the key-batch rules
     (``_key_batches``), the scans' decisions (``_decisions``) and the batched scans over a ready
     view (``_ready_scans``) sit here, below both of their users;
  2. the tiers: the tiering manager (``kvproto._tiering``), ``kvproto.tierkit``, what is built on it
     (``kvproto._memory_primary_tier``) and ``kvproto.metrics`` (over the manager and tiers);
  3. the facade: ``kvproto/__init__.py``, which re-exports from floors 0-2;
  4. the kit, ``kvproto.testing``, and the scan verifier behind ``kvproto verify``,
     ``kvproto._verification`` (whose public face is the kit's ``kvproto.testing.scans``);
  5. the simulator behind ``kvproto simulate``, ``kvproto._simulation`` (it drives the kit's public
     fault wrappers);
  6. the command line: ``kvproto._cli`` and ``kvproto/__main__.py``.

  A unit is a top-level module or package of ``kvproto`` (all its files, its ``__init__`` included:
  importing ``kvproto.tierkit._slots`` runs ``kvproto/tierkit/__init__.py``). ``from kvproto import
  members`` is an arrow to the submodule ``kvproto.members``, not to the facade; ``from kvproto
  import LookupResult`` (a name the facade re-exports) is an arrow to the facade. That Python runs
  ``kvproto/__init__.py`` before any ``kvproto.x`` is package initialisation, not an arrow: no
  module below the facade names it, which this test checks, so the facade adds no cycle.
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
            base = _from_base(node, package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _from_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module ``from X import ...`` names, in ``package``."""
    if not node.level:
        return node.module or ""
    base_parts = package.split(".")
    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
    return ".".join([*base_parts, *([node.module] if node.module else [])])


# -- the import picture of kvproto's units ---------------------------------------------------------

FACADE = "kvproto"

#: The floors, lowest first (the module docstring says why each unit sits where it does); a unit not
#: named here is core (floor 1), so a new module may import only the base and the core until it is
#: placed.
FLOORS: dict[str, int] = {
    "kvproto.errors": 0,
    "kvproto.members": 0,
    "kvproto._results": 0,
    "kvproto._tiering": 2,
    "kvproto.tierkit": 2,
    "kvproto._memory_primary_tier": 2,
    "kvproto.metrics": 2,
    FACADE: 3,
    "kvproto.testing": 4,
    "kvproto._verification": 4,
    "kvproto._simulation": 5,
    "kvproto._cli": 6,
    "kvproto.__main__": 6,
}
CORE_FLOOR = 1


def _is_unit(name: str, root: Path = KVPROTO) -> bool:
    return (root / f"{name}.py").is_file() or (root / name / "__init__.py").is_file()


def _unit_of_file(path: Path, root: Path = KVPROTO) -> str:
    first = path.relative_to(root).parts[0]
    if first == "__init__.py":
        return FACADE
    return f"kvproto.{first.removesuffix('.py')}"


def unit_arrows(source: str, module: str, *, is_package: bool = False, root: Path = KVPROTO) -> set[str]:
    """The kvproto units ``source`` (the text of ``module``) imports: ``kvproto.x`` for any import of
    ``kvproto.x`` or below it; for ``from kvproto import name``, ``kvproto.name`` where ``name`` is a
    unit, else the facade ``kvproto`` (``name`` is one of its re-exports)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            bases = [alias.name.split(".") for alias in node.names]
            found.update(FACADE if len(b) == 1 else f"kvproto.{b[1]}" for b in bases if b[0] == "kvproto")
        elif isinstance(node, ast.ImportFrom):
            parts = _from_base(node, package).split(".")
            if parts[0] != "kvproto":
                continue
            if len(parts) > 1:
                found.add(f"kvproto.{parts[1]}")
            else:
                found.update(f"kvproto.{a.name}" if _is_unit(a.name, root) else FACADE for a in node.names)
    return found


def unit_graph(root: Path = KVPROTO) -> dict[str, dict[str, list[str]]]:
    """unit -> {unit it imports: the files (relative to the repository) whose imports make the arrow}."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(root.rglob("*.py")):
        unit = _unit_of_file(path, root)
        arrows = graph.setdefault(unit, {})
        module = _module_name(path)
        for target in unit_arrows(path.read_text(), module, is_package=path.name == "__init__.py", root=root):
            if target != unit:
                arrows.setdefault(target, []).append(str(path.relative_to(ROOT)))
    return graph


def find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str]:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``[]`` where it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return []


def floor_of(unit: str) -> int:
    return FLOORS.get(unit, CORE_FLOOR)


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


def test_the_units_form_no_cycle() -> None:
    """No cycle between kvproto's units, the facade, the kit and the command line included."""
    graph = unit_graph()
    for unit in ("kvproto", "kvproto._tiering", "kvproto.tierkit", "kvproto.scan", "kvproto._key_batches",
                 "kvproto._ready_scans", "kvproto._decisions", "kvproto.testing", "kvproto._cli"):
        assert unit in graph, unit
    assert graph["kvproto.tierkit"].keys() >= {"kvproto._ready_scans", "kvproto._key_batches"}
    assert graph["kvproto._tiering"].keys() >= {"kvproto._ready_scans", "kvproto._key_batches"}
    assert find_cycle(graph) == []


def test_every_arrow_points_down_or_sideways() -> None:
    """Each import arrow goes to a unit on the same floor or a lower one (FLOORS)."""
    graph = unit_graph()
    assert set(FLOORS) <= set(graph), "a unit named in FLOORS no longer exists"
    upward = {
        f"{unit} (floor {floor_of(unit)}) -> {target} (floor {floor_of(target)})": files
        for unit, arrows in graph.items()
        for target, files in arrows.items()
        if floor_of(target) > floor_of(unit)
    }
    assert upward == {}


def test_nothing_below_the_facade_imports_it() -> None:
    """The facade re-exports; a module under it naming it (``from kvproto import TieringManager``)
    would be a cycle through it: only the kit and the command line import it."""
    importers = {unit for unit, arrows in unit_graph().items() if FACADE in arrows}
    assert {floor_of(u) for u in importers} <= {FLOORS["kvproto.testing"], FLOORS["kvproto._cli"]}


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("from kvproto import members as lr", "kvproto._tiering._manager", False, {"kvproto.members"}),
        ("from kvproto import LookupResult", "kvproto.testing._x", False, {"kvproto"}),
        ("import kvproto", "kvproto._cli._x", False, {"kvproto"}),
        ("import kvproto.members as lr", "kvproto.tierkit._slots", False, {"kvproto.members"}),
        ("from kvproto.tierkit._slot_checks import check_config", "kvproto._x", False, {"kvproto.tierkit"}),
        ("from . import _guard", "kvproto._tiering._manager", False, {"kvproto._tiering"}),
        ("from .. import scan", "kvproto._tiering._manager", False, {"kvproto.scan"}),
        ("from ._manager import X", "kvproto._tiering", True, {"kvproto._tiering"}),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvproto.testing import faults",
            "kvproto._x", False, {"kvproto.testing"},
        ),
        ("def f():\n    import kvproto._cli.main", "kvproto.scan", False, {"kvproto._cli"}),
        ("import numpy\nfrom os import path", "kvproto.scan", False, set()),
    ],
)
def test_unit_arrows_sees_every_kind_of_import(source: str, module: str, is_package: bool, expected: set[str]) -> None:
    assert unit_arrows(source, module, is_package=is_package) == expected


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b": []}, "b": {"c": []}, "c": {"a": []}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b": []}, "b": {}, "c": {"a": [], "b": []}}) == []


def test_nothing_below_the_tools_nor_an_engines_hosting_path_imports_the_kit() -> None:
    """Issue 36: hosting a tier in an engine, or importing a tier, needs no part of the kit.

    * ``kvproto/`` outside the kit (``kvproto/testing``), the command line (``kvproto/_cli``) and the
      simulator (``kvproto/_simulation``, which uses the kit's public fault wrappers) never imports
      ``kvproto.testing``: ``kvproto.hosting`` and the one resolver (``kvproto._tier_names``, with
      ``kvproto._tier_spec``) included;
    * an engine adapter (``adapters/*/src``) imports ``kvproto.testing`` only from its kit-facing
      modules: ``testing.py`` (its pytest suite base), ``_conformance.py`` (the specs it registers
      under ``kvproto.tiers``) and ``_targets.py`` (the ``kvproto conform ENGINE:MODULE:CLASS`` scheme,
      which returns the kit's specs); its hosting path (``_as_vllm.py``, ``_as_lmcache.py``, ``_as_sglang.py``) and
      every other module import :mod:`kvproto.hosting` instead;
    * a reference tier (``impls/*/src``) imports it only from its ``_conformance.py``.
    """
    tools = {KVPROTO / d for d in ("testing", "_cli", "_simulation")}
    below = sorted(p for p in KVPROTO.rglob("*.py") if not any(t in p.parents for t in tools))
    assert KVPROTO / "hosting.py" in below and KVPROTO / "_tier_names.py" in below
    assert _violations(below, ("kvproto.testing",)) == {}
    kit_facing = {"testing.py", "_conformance.py", "_targets.py"}
    adapters = sorted((ROOT / "adapters").glob("*/src/*/**/*.py"))
    hosting = [p for p in adapters if p.name in ("_as_vllm.py", "_as_lmcache.py", "_as_sglang.py")]
    assert len(hosting) == 3
    assert _violations([p for p in adapters if p.name not in kit_facing], ("kvproto.testing",)) == {}
    impls = sorted((ROOT / "impls").glob("*/src/*/**/*.py"))
    assert impls
    assert _violations([p for p in impls if p.name != "_conformance.py"], ("kvproto.testing",)) == {}


def _kit_part(module: str) -> str | None:
    """The part of the kit ``module`` belongs to: a top-level module (``plugin``, ``stateful``...), a
    wing (``_harness``, ``_faults``, ``_checks``) or a role inside the checks wing
    (``_checks.secondary``, ``_checks.primary``); None outside the kit."""
    parts = module.split(".")
    if parts[:2] != ["kvproto", "testing"] or len(parts) < 3:
        return None
    if parts[2] == "_checks" and len(parts) > 3 and parts[3] in ("secondary", "primary"):
        return f"_checks.{parts[3]}"
    return parts[2]


def test_the_kits_wings_form_no_cycle() -> None:
    """Inside the kit, one way down too: ``_harness`` (what every check runs on) imports no check, the
    checks import the harness and the fault wings, and what assembles checks into test classes
    (``_collection``, ``_hooks``, ``plugin``) sits above them (issue 36)."""
    graph: dict[str, dict[str, list[str]]] = {}
    kit = KVPROTO / "testing"
    # The package's __init__ is its public face: it names every part lazily (and for mypy), not an arrow.
    for path in sorted(p for p in kit.rglob("*.py") if p != kit / "__init__.py"):
        module = _module_name(path)
        part = _kit_part(module)
        assert part is not None
        arrows = graph.setdefault(part, {})
        for target in imported_modules(path.read_text(), module, is_package=path.name == "__init__.py"):
            other = _kit_part(target)
            if other is not None and other != part:
                arrows.setdefault(other, []).append(str(path.relative_to(ROOT)))
    assert {"_harness", "_faults", "_checks", "_checks.secondary", "_checks.primary", "_collection"} <= set(graph)
    assert not {"_checks", "_checks.secondary", "_checks.primary", "_collection"} & set(graph["_harness"])
    assert find_cycle(graph) == []
