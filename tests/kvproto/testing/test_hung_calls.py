"""A tier call that hangs gives a verdict, not a hung kit (KIT-27, issue 40 "no hang"): the first hang
of a tier's ``shutdown`` is waited out in full (``shutdown_timeout_s``), a state machine that meets one
stops its search at that example (no shrinking, no replay: each would wait out the bound again and leave
one more thread hung), and each later check meeting the same tier class's hang waits ``HUNG_AGAIN_S``.
Through the command line (``kvproto conform --json``, in this process), as a tier author reaches it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvproto import MemoryTier
from kvproto.testing import MEMORY_HOOKS, TierSpec

from tests.cli import kvproto_cli
from tests.kvproto.testing.gallery import _QUICK, ShutdownDeadlocksAfterReset

ROOT = Path(__file__).parents[3]

HUNG_AGAIN_S = 2.0
"""KIT-27's wait for a tier class whose shutdown already hung (``HUNG_AGAIN_S`` of the kit's driver)."""

FIRST_S = 3.0
"""The spec's shutdown bound: above HUNG_AGAIN_S, so the two waits are told apart in the reasons."""


class HangsAfterResetAgain(ShutdownDeadlocksAfterReset):
    """The gallery's tier whose shutdown waits forever once ``reset_cache`` ran, as a class of its own (the
    kit remembers hung shutdowns per class, for the process)."""


def hangs_after_reset() -> TierSpec:
    return TierSpec("hangs-after-reset", "secondary", HangsAfterResetAgain, hooks=MEMORY_HOOKS,
                    limits=replace(_QUICK, shutdown_timeout_s=FIRST_S))


def _checks(*names: str) -> dict[str, dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        argv = ["conform", f"{__name__}:hangs_after_reset", "--no-typecheck", "--no-coverage", "--profile", "fast",
                "--json", str(out)]
        for name in names:
            argv += ["--check", name]
        assert kvproto_cli(argv) == 1
        (tier,) = json.loads(out.read_text())["tiers"]
    return {c["check"]: c for c in tier["checks"] if c["outcome"] != "deselected"}


def test_a_hung_shutdown_ends_the_search_and_later_checks_wait_less() -> None:
    checks = _checks("reset_cache_forgets_blocks", "state_machine_against_model", "differential_against_memory_tier")
    first = checks["test_reset_cache_forgets_blocks"]
    assert first["violated_clause"] == "TIER-16", first["reason"][:300]
    assert f"did not return within {FIRST_S:g} s" in first["reason"]
    for name in ("test_state_machine_against_model", "test_differential_against_memory_tier"):
        machine = checks[name]
        assert machine["outcome"] == "failed" and machine["violated_clause"] == "TIER-16", machine["reason"][:300]
        assert f"did not return within {HUNG_AGAIN_S:g} s" in machine["reason"], machine["reason"][:300]
        assert "the search stopped at this example" in machine["reason"], machine["reason"][:300]


class ScanThreadNeverEnds(MemoryTier):
    """Bug: ``reset_cache`` starts a scan on a thread of its own (not a daemon) that never ends, and
    ``shutdown`` joins it: once the kit gave its verdict, the interpreter's exit would wait for that
    thread forever."""

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="scan-thread-never-ends")
        self._scan: threading.Thread | None = None

    def reset_cache(self) -> bool:
        self._scan = threading.Thread(target=threading.Event().wait, name="scan-never-ends")  # the bug
        self._scan.start()
        return super().reset_cache()

    def shutdown(self) -> None:
        if self._scan is not None:
            self._scan.join()
        super().shutdown()


def scan_thread_never_ends() -> TierSpec:
    return TierSpec("scan-thread-never-ends", "secondary", ScanThreadNeverEnds, hooks=MEMORY_HOOKS,
                    limits=replace(_QUICK, shutdown_timeout_s=1.0))


def test_the_command_ends_after_its_verdict_though_the_tiers_thread_never_does(tmp_path: Path) -> None:
    """``python -m kvproto conform`` (the console script's path) exits with the verdict's code, saying
    whose threads it did not wait for; before KIT-27's exit it never ended (the subprocess timeout)."""
    out = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "kvproto", "conform", f"{__name__}:scan_thread_never_ends", "--no-typecheck",
         "--no-coverage", "--check", "reset_cache_forgets_blocks", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert run.returncode == 1, run.stdout[-2000:] + run.stderr[-2000:]
    assert f"{__name__}.ScanThreadNeverEnds" in run.stderr and "not waiting for its threads" in run.stderr
    (tier,) = json.loads(out.read_text())["tiers"]
    (check,) = [c for c in tier["checks"] if c["outcome"] != "deselected"]
    assert check["violated_clause"] == "TIER-16", check["reason"][:300]
