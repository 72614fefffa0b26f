"""What a tier declares about its own background work and job bound, held to what the kit sees:
``wait_idle`` once ``shutdown()`` returned (KIT-19, TIER-16), and ``job_time_bound_s`` as the manager
reads it (MGR-17)."""

from __future__ import annotations

from dataclasses import replace

from kvproto import MemoryTier
from kvproto._cli.runner import run_kit
from kvproto.testing import TierSpec
from kvproto.testing._reference import memory


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
    return replace(memory(), name=cls.__name__, factory=cls, tier_class=cls)


def _one(spec: TierSpec, check: str) -> tuple[str, str | None, str]:
    report = run_kit(spec, checks=[check], profile="fast")
    (found,) = [o for o in report.outcomes if o.check == check]
    return found.outcome, found.violated, found.reason


def test_a_tier_still_busy_by_its_own_account_after_shutdown_fails_tier_16() -> None:
    check = "test_hit_after_successful_store"
    assert _one(_spec(_IdleAnswer), check)[:2] == ("passed", None)
    outcome, violated, reason = _one(_spec(_StillBusy), check)
    assert (outcome, violated) == ("failed", "TIER-16")
    assert "wait_idle" in reason and "answered False" in reason


def test_a_job_bound_the_manager_refuses_fails_mgr_17() -> None:
    check = "test_capabilities_are_consistent"
    assert _one(_spec(_GoodBound), check)[:2] == ("passed", None)
    outcome, violated, reason = _one(_spec(_ZeroBound), check)
    assert (outcome, violated) == ("failed", "MGR-17")
    assert "job_time_bound_s" in reason
