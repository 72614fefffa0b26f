"""What a tier declares about its own background work and job bound, held to what the kit sees:
``wait_idle`` once ``shutdown()`` returned (KIT-19, TIER-16), and ``job_time_bound_s`` as the manager
reads it (MGR-17)."""

from __future__ import annotations

import json
from pathlib import Path

from kvproto import MemoryTier
from kvproto.testing import MEMORY_HOOKS, TierSpec

from tests.cli import kvproto_cli as main

_HERE = "tests.kvproto.testing.test_declarations_after_shutdown"


class _IdleAnswer(MemoryTier):
    """A MemoryTier that says whether its background work is back: ``answer_after_shutdown`` once shut down."""

    answer_after_shutdown: object = True

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="idle-answer")
        self._down = False

    def shutdown(self) -> None:
        super().shutdown()
        self._down = True

    def wait_idle(self, timeout: float = 10.0) -> object:
        return self.answer_after_shutdown if self._down else True


class _StillBusy(_IdleAnswer):
    """Its own account after shutdown: work still running (as a tier whose shutdown returns before its
    background deletion or start-up scan ended would answer)."""

    answer_after_shutdown = False


class _BoundOf(MemoryTier):
    bound: object = None

    def __init__(self, buffer: memoryview) -> None:
        super().__init__(buffer, name="bound")

    @property
    def job_time_bound_s(self) -> object:
        return self.bound


class _ZeroBound(_BoundOf):
    bound = 0.0


class _GoodBound(_BoundOf):
    bound = 30.0


def _spec(cls: type[MemoryTier]) -> TierSpec:
    return TierSpec(cls.__name__, "secondary", cls, hooks=MEMORY_HOOKS, tier_class=cls)


def idle_answer() -> TierSpec:
    return _spec(_IdleAnswer)


def still_busy() -> TierSpec:
    return _spec(_StillBusy)


def zero_bound() -> TierSpec:
    return _spec(_ZeroBound)


def good_bound() -> TierSpec:
    return _spec(_GoodBound)


def _one(target: str, check: str, tmp_path: Path) -> tuple[str, str | None, str]:
    report = tmp_path / f"{target}.json"
    main(["conform", f"{_HERE}:{target}", "--profile", "fast", "--no-typecheck", "--no-coverage", "-k", check,
          "--json", str(report)])
    (checks,) = [t["checks"] for t in json.loads(report.read_text())["tiers"]]
    (found,) = [c for c in checks if c["check"] == f"test_{check}"]
    return found["outcome"], found["violated_clause"], found["reason"]


def test_a_tier_still_busy_by_its_own_account_after_shutdown_fails_tier_16(tmp_path: Path) -> None:
    check = "hit_after_successful_store"
    assert _one("idle_answer", check, tmp_path)[:2] == ("passed", None)
    outcome, violated, reason = _one("still_busy", check, tmp_path)
    assert (outcome, violated) == ("failed", "TIER-16")
    assert "wait_idle" in reason and "answered False" in reason


def test_a_job_bound_the_manager_refuses_fails_mgr_17(tmp_path: Path) -> None:
    check = "capabilities_are_consistent"
    assert _one("good_bound", check, tmp_path)[:2] == ("passed", None)
    outcome, violated, reason = _one("zero_bound", check, tmp_path)
    assert (outcome, violated) == ("failed", "MGR-17")
    assert "job_time_bound_s" in reason
