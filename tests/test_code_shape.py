"""No function over 80 lines outside the tests, and no ``# noqa`` that silences nothing.

A long function is split into named helpers.

Counted by AST over the sources of ``kvproto/``, ``impls/``, ``adapters/``, ``examples/``,
``benchmarks/`` and ``spec/``: a ``def``'s (or ``async def``'s, a method's, a nested function's)
full span, from its ``def`` line to its last line, its docstring included.

:data:`ALLOWED` names the functions of ``kvproto/testing`` (the kit) and ``kvproto/_cli`` (the
command line) that are longer today; they are being restructured elsewhere, and the test fails
once one of them is split (or gone) so that the list only shrinks. Nothing else may be listed.

A ``# noqa: CODE`` names only rules ruff selects (``[tool.ruff.lint] select`` in pyproject.toml):
one naming another linter's rule (BLE001, S603, N802, ...) silences nothing and reads as if a
check ran. Checked over every Python file but ``kvproto/testing`` and ``kvproto/_cli`` (being
restructured elsewhere); ``ruff check --extend-select RUF100 .`` reports a noqa whose rule is
selected but does not fire there.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TREES = ("kvproto", "impls", "adapters", "examples", "benchmarks", "spec")
MAX_LINES = 80

#: ``path:name`` -> its length when listed: functions allowed over MAX_LINES. Empty: a long function
#: is split into named helpers; an entry, if ever needed, must be in the kit or the command line.
ALLOWED: dict[str, int] = {}


def long_functions(source: str, where: str, limit: int = MAX_LINES) -> dict[str, int]:
    """``where:name`` -> lines, for every function in ``source`` longer than ``limit`` lines."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found[f"{where}:{node.name}"] = lines
    return found


def _sources() -> list[Path]:
    files = [p for tree in TREES for p in (ROOT / tree).rglob("*.py")]
    return sorted(p for p in files if not {".venv", "build", "dist"} & set(p.relative_to(ROOT).parts))


def test_no_function_is_over_80_lines() -> None:
    files = _sources()
    assert ROOT / "kvproto" / "scan.py" in files and ROOT / "benchmarks" / "bench_fs.py" in files
    found: dict[str, int] = {}
    for path in files:
        found.update(long_functions(path.read_text(), path.relative_to(ROOT).as_posix()))
    over = {name: lines for name, lines in found.items() if name not in ALLOWED}
    assert over == {}, "split these into named helpers"
    short_now = sorted(set(ALLOWED) - set(found))
    assert short_now == [], "a function allowed to be long is now short (or gone): drop it from ALLOWED"


def test_the_allowlist_holds_only_the_kit_and_the_command_line() -> None:
    assert all(name.startswith(("kvproto/testing/", "kvproto/_cli/")) for name in ALLOWED)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def f():\n" + "    x = 1\n" * 79, {}),  # 80 lines: allowed
        ("def f():\n" + "    x = 1\n" * 80, {"m.py:f": 81}),
        ('def f():\n    """doc\n' + "\n" * 79 + '    """\n', {"m.py:f": 82}),  # the docstring counts
        ("class C:\n    async def g(self):\n" + "        x = 1\n" * 80, {"m.py:g": 81}),
        ("def f():\n    def inner():\n" + "        x = 1\n" * 80, {"m.py:f": 82, "m.py:inner": 81}),
    ],
)
def test_the_count_spans_the_whole_def(source: str, expected: dict[str, int]) -> None:
    assert long_functions(source, "m.py") == expected


NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.IGNORECASE)
NOT_YET: tuple[str, ...] = ()  # every tree is held to the rule now


def selected_rules() -> tuple[str, ...]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return tuple(config["tool"]["ruff"]["lint"]["select"])


def inert_noqa(source: str, where: str, selected: tuple[str, ...]) -> list[str]:
    """``where:line: comment`` for each noqa comment in ``source`` that is blanket or names a rule not selected."""
    found: list[str] = []
    comments = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    for token in comments:
        number = token.start[0]
        for match in NOQA.finditer(token.string):
            codes = match.group("codes")
            names = [c.strip().upper() for c in codes.split(",")] if codes else []
            # A selected prefix is followed by digits only (E402 for E, UP006 for UP, not B for BLE001).
            if not names or not all(re.fullmatch(f"({'|'.join(selected)})[0-9]+", n) for n in names):
                found.append(f"{where}:{number}: {match.group(0)}")
    return found


def test_every_noqa_names_a_rule_ruff_selects() -> None:
    selected = selected_rules()
    assert set(selected) >= {"E", "F", "B"}
    files = sorted(p for p in ROOT.rglob("*.py") if not {".venv", "build", "dist", ".git"} & set(p.relative_to(ROOT).parts))
    assert ROOT / "kvproto" / "_tiering" / "_guard.py" in files
    found = [
        line
        for path in files
        if not path.relative_to(ROOT).as_posix().startswith(NOT_YET)
        for line in inert_noqa(path.read_text(), path.relative_to(ROOT).as_posix(), selected)
    ]
    assert found == []


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("import x  # noqa: E402 (after importorskip)", 0),
        ("x = 1  # noqa: UP006, B010 - why", 0),
        ("except Exception:  # noqa: BLE001 - why", 1),
        ("except Exception:  # noqa: B001, S110", 1),
        ("x = 1  # noqa", 1),
        ("def do_GET(self):  # noqa: N802", 1),
        ("x = 'no comment here'", 0),
        ("x = '# noqa: BLE001 in a string'", 0),
    ],
)
def test_inert_noqa_sees_unselected_and_blanket_ones(line: str, expected: int) -> None:
    assert len(inert_noqa(line, "m.py", ("E", "W", "F", "I", "B", "UP"))) == expected


def test_the_kit_has_at_most_15_entries_at_its_top_level() -> None:
    """``kvproto/testing`` is its public face (``__init__``, ``plugin``, ``stateful``, ``strategies``,
    ``faults``, ``scans``), the reference tiers' specs its own entry points name (``_reference``), what
    builds test classes from specs (``_collection``, ``_hooks``) and a few private wings (``_harness``,
    ``_checks``, ``_faults``): a newcomer finds a clause's checks by file name, not among fifty siblings
    (issue 36)."""
    kit = ROOT / "kvproto" / "testing"
    entries = sorted(p.name for p in kit.iterdir() if p.name != "__pycache__")
    assert {"__init__.py", "plugin.py", "stateful.py", "strategies.py", "faults.py", "scans.py"} <= set(entries)
    assert len(entries) <= 15, entries
    wings = [p for p in kit.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert all((w / "__init__.py").is_file() and w.name.startswith("_") for w in wings), wings
