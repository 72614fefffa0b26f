"""The ``kvproto`` command line as a user reaches it: through its console-script entry point."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

__all__ = ["conform_report", "kvproto_cli", "tier_checks"]


def kvproto_cli(argv: Sequence[str]) -> int:
    """Run ``kvproto ARGV...`` in this process: the ``main`` of the module the installed ``kvproto`` script
    runs (the script itself, ``console``, exits the process with that code); its exit code."""
    (script,) = entry_points(group="console_scripts", name="kvproto")
    main: Callable[[Sequence[str]], int] = import_module(script.module).main
    return main(list(argv))


def conform_report(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """Run ``kvproto conform ARGS... --no-typecheck --json`` in this process, its report written under
    ``tmp_path``: the exit code and the JSON report."""
    report = tmp_path / "report.json"
    code = kvproto_cli(["conform", *args, "--no-typecheck", "--json", str(report)])
    data: dict[str, Any] = json.loads(report.read_text())
    return code, data


def tier_checks(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The check verdicts of a ``conform_report`` of one tier."""
    (tier,) = data["tiers"]
    checks: list[dict[str, Any]] = tier["checks"]
    return checks
