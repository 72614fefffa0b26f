"""The CrossHair checks of the scans: ``crosshair check`` of the reference scans' contracts and
``crosshair diffbehavior`` of ``kvproto.scan`` against the reference (SCAN-1..SCAN-10), each
bounded by iterations, never by wall time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict, Unpack

from kvproto._verification._check_results import Check, CheckResult

__all__ = [
    "CROSSHAIR_ITERATIONS",
    "CROSSHAIR_TARGETS",
    "REFERENCE",
    "crosshair_available",
    "crosshair_check",
    "crosshair_diff",
    "crosshair_diff_check",
]

#: ``--max_uninteresting_iterations`` of every CrossHair run: a bound on work, not time.
CROSSHAIR_ITERATIONS = 100
#: Safety net only: a CrossHair run that takes longer than this has hung.
_CROSSHAIR_HANG_S = 1200

_PLUGIN = Path(__file__).resolve().with_name("_crosshair_stats.py")
REFERENCE = "kvproto._verification._reference"
#: The module of the CrossHair entry points (``kvproto_prefix``, ``reference_window``...).
CROSSHAIR_TARGETS = "kvproto._verification._crosshair_targets"
_STATS = re.compile(r"kvproto-crosshair-stats paths=(\d+) exhausted=(\d+)")


def crosshair_available() -> bool:
    """Whether CrossHair (``crosshair-tool``, the ``kvproto[verify]`` extra) is installed here."""
    import importlib.util

    return importlib.util.find_spec("crosshair") is not None


def _crosshair(
    args: Sequence[str], iterations: int, env: Mapping[str, str] | None = None
) -> tuple[int, str, str, float]:
    command = [
        sys.executable,
        "-m",
        "crosshair",
        *args,
        "--max_uninteresting_iterations",
        str(iterations),
        # A path that runs this long (CPU seconds) is stuck, not slow; without
        # this, CrossHair would time paths out at `iterations` seconds.
        "--per_path_timeout",
        "60",
        "--extra_plugin",
        str(_PLUGIN),
    ]
    # CrossHair imports its targets by name: whatever this process can import, it can too
    # (kvproto from a wheel or a checkout, a third party's scans, the repo's spec/ mutants).
    # ``env`` adds variables for the entry points (the third-party scan under test).
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            command,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=_CROSSHAIR_HANG_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return -1, str(exc.stdout or ""), f"hung for {_CROSSHAIR_HANG_S} s", time.perf_counter() - start
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start


def _paths(stderr: str) -> int | None:
    found = _STATS.findall(stderr)
    return int(found[-1][0]) if found else None


def crosshair_check(
    targets: Sequence[str], *, name: str, clauses: str, iterations: int = CROSSHAIR_ITERATIONS
) -> CheckResult:
    """``crosshair check`` of the PEP 316 contracts of ``targets``; passes if no counterexample."""
    rc, out, err, seconds = _crosshair(["check", "--analysis_kind", "PEP316", *targets], iterations)
    problems = [line for line in out.splitlines() if ": error:" in line]
    passed = rc == 0 and not problems
    detail = "\n".join(problems) or ("" if passed else (err.strip()[-2000:] or f"exit status {rc}"))
    return CheckResult(name, clauses, _paths(err), "paths", passed, seconds, detail)


class DiffOptions(TypedDict, total=False):
    """The options of one ``crosshair diffbehavior`` run.

    ``iterations`` bounds CrossHair's work (default :data:`CROSSHAIR_ITERATIONS`);
    ``env`` adds environment variables to the CrossHair process.
    """

    iterations: int
    env: Mapping[str, str] | None


def crosshair_diff(fn1: str, fn2: str, *, name: str, clauses: str, **options: Unpack[DiffOptions]) -> CheckResult:
    """``crosshair diffbehavior fn1 fn2``; passes if it finds no difference.

    ``detail`` holds CrossHair's report of the differences it found.
    """
    iterations = options.get("iterations", CROSSHAIR_ITERATIONS)
    rc, out, err, seconds = _crosshair(["diffbehavior", fn1, fn2], iterations, options.get("env"))
    passed = rc == 0 and "No differences found" in out
    detail = out.strip() if rc == 1 else ("" if passed else (err.strip()[-2000:] or f"exit status {rc}"))
    return CheckResult(name, clauses, _paths(err), "paths", passed, seconds, detail)


def crosshair_diff_check(name: str, fn1: str, fn2: str, *, clauses: str, **options: Unpack[DiffOptions]) -> Check:
    """The :class:`Check` that runs :func:`crosshair_diff` of ``fn1`` and ``fn2`` under ``name``."""
    return Check(name, "crosshair", lambda: crosshair_diff(fn1, fn2, name=name, clauses=clauses, **options))
