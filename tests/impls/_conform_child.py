"""``kvproto conform`` on a remote reference tier in a process of its own, as an operator runs it (REDIS-11, MC-10)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["conform_remote_tier_in_a_child"]

ROOT = Path(__file__).resolve().parents[2]


def conform_remote_tier_in_a_child(target: str, report: Path, *, env: Mapping[str, str] | None = None,
                                   options: Sequence[str] = ()) -> tuple[dict[str, str], dict[str, str]]:
    """``python -m kvproto conform TARGET --profile fast [OPTIONS] --json REPORT`` from the repository root, this
    process's environment plus ``env`` and its ``sys.path`` as PYTHONPATH. Asserts it exits 0, that its one tier
    declares what a tier over shared remote storage does (persistence, sharing, asynchronous lookups, partial
    jobs; no eviction, no held HITs), and that every check it did not skip passed; returns each check's outcome
    and each skipped check's reason."""
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    done = subprocess.run([sys.executable, "-m", "kvproto", "conform", target, "--profile", "fast", *options, "--json",
                           str(report)], cwd=ROOT, env=child_env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (tier,) = json.loads(report.read_text())["tiers"]
    caps = tier["capabilities"]
    assert all(caps[c] is True for c in ("persistence", "sharing", "async_lookup", "partial_jobs"))
    assert caps["eviction"] is False and caps["holds_hits"] is False
    outcomes = {c["check"]: c["outcome"] for c in tier["checks"]}
    skipped = {c["check"]: c["reason"] for c in tier["checks"] if c["outcome"] == "skipped"}
    assert {o for name, o in outcomes.items() if name not in skipped} == {"passed"}, outcomes
    return outcomes, skipped
