"""A ``kvproto simulate`` run whose remote tier's server goes away for a while in the middle of it (issue 37,
issue 38): the run begins, the tier stores, the server is stopped for ``OUTAGE_S``, started again (empty)
where the tier looks for it, and the run ends. Shared by the obj tier's (moto) and the redis tier's tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUTAGE_S = 10.0
BEFORE_S = 4.0  # the run shows how it goes without an outage this long first
AFTER_S = 5.0  # a job lost this long after the server is back is not the outage's
ROOT = Path(__file__).parents[2]


@dataclass(frozen=True)
class OutageRun:
    """How the run ended, and when (seconds into it) the server was stopped and was back (``start()``
    returned: a restart that takes long on a loaded machine moves the end of the outage, not the verdict)."""

    code: int
    out: str
    err: str
    data: dict[str, Any]
    page: Path
    down_s: float
    up_s: float


def simulate_with_outage(
    folder: Path, options: Sequence[str], *, env: dict[str, str], storing: Callable[[], bool],
    stop: Callable[[], None], start: Callable[[], None], seconds: float = 28.0,
) -> OutageRun:
    """``kvproto simulate OPTIONS --seconds SECONDS --strict`` with its JSON and HTML report under ``folder``;
    once ``storing()`` (the tier has written to its server) and ``BEFORE_S`` into the run, ``stop()``, then
    ``OUTAGE_S`` later ``start()`` (the server back, empty, where the tier looks for it)."""
    report, page = folder / "report.json", folder / "report.html"
    args = [sys.executable, "-m", "kvproto", "simulate", *options, "--seconds", f"{seconds:g}", "--step-ms", "5",
            "--strict", "--json", str(report), "--report", str(page)]
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env,
                          "COLUMNS": "200"}, cwd=ROOT) as proc:
        try:
            assert proc.stdout is not None
            while not proc.stdout.readline().startswith("simulating "):  # printed as the run begins
                assert proc.poll() is None, "the run ended before it began"
            began = time.monotonic()
            while not storing() or time.monotonic() - began < BEFORE_S:
                assert proc.poll() is None, "the run ended before the outage"
                time.sleep(0.05)
            stop()
            down_s = time.monotonic() - began
            time.sleep(OUTAGE_S)  # its length is the point of the test, not a wait for a condition
            start()
            up_s = time.monotonic() - began
            out, err = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
    return OutageRun(proc.returncode, out, err, json.loads(report.read_text()), page, down_s, up_s)


def lost_over_time(data: dict[str, Any], tier: str) -> tuple[list[float], list[int]]:
    """The timeline's seconds and the jobs ``tier`` had lost by each point."""
    points = data["timeline"]["points"]
    return [p["seconds"] for p in points], [p["failed_jobs"].get(tier, 0) for p in points]


def assert_served_again(run: OutageRun, tier: str) -> None:
    """The verdict of a run whose remote ``tier`` lost its server mid-run (issue 38): 0 wrong bytes and no
    problem; the run not clean (exit 1 under ``--strict``) with ``tier`` named as failing; it lost no job
    before the outage and none later than ``AFTER_S`` past the server's return (``up_s``, however long the
    restart took); and it served blocks after its server came back."""
    data = run.data
    assert data["wrong_bytes"] == 0 and data["problems"] == [], data["problems"]
    assert run.code == 1 and any(w.startswith(f"failing tier {tier}: ") for w in data["warnings"]), data["warnings"]
    seconds, lost = lost_over_time(data, tier)
    first = next(i for i, n in enumerate(lost) if n > 0)
    assert seconds[first] > BEFORE_S / 2  # it worked before the server went away
    last = max(i for i in range(1, len(lost)) if lost[i] > lost[i - 1])
    assert seconds[last] <= run.up_s + AFTER_S, (seconds[last], run.down_s, run.up_s)  # the losses end with the outage
    served = [p["served"].get(tier, 0) for p in data["timeline"]["points"]]
    assert served[-1] > served[last], "the tier served no block after its server came back"
