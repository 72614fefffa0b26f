"""``conform-coverage``: what measuring the tier's own code (KIT-24) costs a ``kvproto conform`` run.

Ours: ``kvproto conform fs --no-typecheck`` (the default profile; coverage.py measuring
``kvproto_fs`` in the process running the checks). Baseline: the same command with
``--no-coverage``. Each run is a fresh process (as a user runs it), its wall time measured from
start to exit. ``repeats`` rounds in ABBA order (the next round starts with the baseline); each
side's figure is its best round (the uncontended speed: this runs on shared, loaded machines).
Ratio = ours / baseline seconds; target <= 1.5 (a measured run may cost half again, not more).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks._result import BenchResult

__all__ = ["run"]

TIER = "fs"


def _conform_seconds(*extra: str, profile: str) -> float:
    """Wall seconds of one ``kvproto conform TIER`` in a fresh process; raises if it does not conform."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "kvproto", "conform", TIER, "--no-typecheck", "--profile", profile, *extra],
        capture_output=True, text=True, check=False, env={**os.environ, "LMCACHE_TRACK_USAGE": "false"},
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"kvproto conform {TIER} {' '.join(extra)} exited {done.returncode}:\n{done.stdout[-4000:]}")
    return seconds


def run(quick: bool = False) -> BenchResult:
    """Best-of-``repeats`` wall time with and without coverage, ABBA order; their ratio."""
    repeats = 1 if quick else 3
    profile = "fast" if quick else "default"
    figures: dict[str, float] = {}
    for rep in range(repeats):
        sides = [("raw", ("--no-coverage",)), ("ours", ())]
        for side, extra in sides if rep % 2 == 0 else reversed(sides):
            figures[f"{side}_s_{rep}"] = _conform_seconds(*extra, profile=profile)
    ours = min(figures[f"ours_s_{rep}"] for rep in range(repeats))
    raw = min(figures[f"raw_s_{rep}"] for rep in range(repeats))
    figures.update(ours_s=ours, raw_s=raw)
    return BenchResult(
        name="conform-coverage",
        ratio=ours / raw,
        target=1.5,
        lower_is_better=True,
        summary=f"kvproto conform {TIER} ({profile}): {ours:.1f} s measuring the tier's code, {raw:.1f} s without",
        figures=figures,
    )
