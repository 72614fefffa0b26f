"""``kvproto conform ... --json`` in this process, read back: the engine adapters' kit tests share it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.cli import kvproto_cli

__all__ = ["conform_report"]


def conform_report(path: Path, *argv: str) -> tuple[int, dict[str, dict[str, Any]]]:
    """Exit code and checks by name of ``kvproto conform ARGV --no-typecheck --profile fast``; the
    one tier's report must have no error (the kit ran)."""
    code = kvproto_cli(["conform", *argv, "--no-typecheck", "--profile", "fast", "--json", str(path)])
    (tier,) = json.loads(path.read_text())["tiers"]
    assert tier["error"] is None, tier["error"]
    return code, {c["check"]: c for c in tier["checks"]}
