"""A tier call that hangs gives a verdict, not a hung kit (KIT-27, issue 40 "no hang"): the first hang
of a tier's ``shutdown`` is waited out in full (``shutdown_timeout_s``), a state machine that meets one
stops its search at that example (no shrinking, no replay: each would wait out the bound again and leave
one more thread hung), and each later check meeting the same tier class's hang waits ``HUNG_AGAIN_S``.
Through the command line (``kvproto conform --json``, in this process), as a tier author reaches it."""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvproto.testing import MEMORY_HOOKS, TierSpec
from kvproto.testing._harness.driver import HUNG_AGAIN_S

from tests.cli import kvproto_cli
from tests.kvproto.testing.gallery import _QUICK, ShutdownDeadlocksAfterReset

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
