"""spec/CONTRACT.md stays true to the code: every clause cited exists, every test it names exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "spec" / "CONTRACT.md"
_PREFIXES = "LR|KEY|SCAN|TIER|TIERKIT|MGR|AP|MEM|CPU|KIT|CAP|ENV|FS|OBJ|REDIS|MC|VLLM|SGL"
CLAUSE = re.compile(rf"\b(?:{_PREFIXES})-\d+\b")
DEFINED = re.compile(rf"^- \*\*((?:{_PREFIXES})-\d+)\*\*", re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`]+)`")


def _defined_clauses() -> list[str]:
    return DEFINED.findall(CONTRACT.read_text())


def _test_names(path: Path) -> set[str]:
    """Functions, classes, methods and assigned names (``test_x = Machine.TestCase``) in ``path``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _cited_tests() -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """What the document names: ``tests/x.py::test_a`` pairs, bare ``test_b`` names, ``test_x.py`` files.

    Sections cite bare names relative to a file named earlier, sometimes in
    an earlier clause, so a bare name is checked against every test module.
    """
    pairs: list[tuple[str, str]] = []
    names: list[str] = []
    files: list[str] = []
    for span in CODE_SPAN.findall(CONTRACT.read_text()):
        path_part, _, test_part = span.partition("::")
        if path_part.startswith("tests/") and path_part.endswith(".py"):
            if test_part:
                pairs.append((path_part, re.split(r"[\[.:]", test_part)[0]))
            else:
                files.append(path_part)
        elif re.fullmatch(r"\w+\.py", span):
            files.append(span)
        elif re.fullmatch(r"test_\w+(\[[^\]]*\])?", span):
            names.append(span.split("[")[0])
    return pairs, names, files


def test_clause_ids_are_unique() -> None:
    defined = _defined_clauses()
    duplicates = sorted({c for c in defined if defined.count(c) > 1})
    assert defined, "no clause definitions found: the '- **ID**' format changed?"
    assert duplicates == []


def test_every_clause_cited_in_code_is_defined() -> None:
    defined = set(_defined_clauses())
    missing: dict[str, list[str]] = {}
    for folder in ("kvproto", "impls", "adapters", "spec", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for clause in set(CLAUSE.findall(path.read_text())):
                if clause not in defined:
                    missing.setdefault(clause, []).append(str(path.relative_to(ROOT)))
    assert missing == {}


def test_every_test_the_contract_names_exists() -> None:
    pairs, names, files = _cited_tests()
    assert len(pairs) + len(names) > 50, "the document names far fewer tests: parsing broke?"
    # Tests live in tests/; the kit's checks in kvproto/testing/.
    modules = sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "kvproto" / "testing").rglob("*.py"))
    by_module = {str(m.relative_to(ROOT)): _test_names(m) for m in modules}
    everywhere = set().union(*by_module.values())
    absent = [f"{path}::{name}" for path, name in pairs if name not in by_module.get(path, set())]
    absent += sorted({name for name in names if name not in everywhere})
    module_names = {m.name for m in modules} | set(by_module)
    absent += sorted({f for f in files if f not in module_names})
    assert absent == []
