"""The kit's checks reach pytest through a plugin object, never through a generated test module
that imports back into the command line (KIT-10)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.cli import kvproto_cli as main

ROOT = Path(__file__).resolve().parents[3]


def test_no_source_holds_module_text_importing_the_command_line() -> None:
    """No string in kvproto's sources is Python text importing ``kvproto._cli`` (a template of a
    generated module): the kit and the command line hand pytest plugin objects instead."""
    found: list[str] = []
    for path in sorted((ROOT / "kvproto").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "from kvproto._cli" in node.value or "import kvproto._cli" in node.value:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []


def test_conform_imports_no_test_module(tmp_path: Path) -> None:
    before = set(sys.modules)
    code = main(["conform", "memory", "--check", "empty_tier_misses", "--repeat", "2", "--no-typecheck"])
    assert code == 0
    added = set(sys.modules) - before
    assert not [m for m in added if m.startswith("test_") or "kvproto_kit" in m or "kvproto-kit" in m]
    assert "kvproto_kit" not in sys.modules
