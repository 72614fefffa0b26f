"""The kit never blames a correct tier (issue #9, section 2): each case once blamed a tier for
something the kit or a hook did; each test fails on the code before its fix (KIT-2, KIT-5)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvproto import MemoryTier, OffloadKey, SecondaryTier, TransferJob
from kvproto.testing import (
    ConformanceFailure,
    KitLimits,
    SecondaryDriver,
    SecondaryTierTests,
    TierStateMachine,
    key_pool,
    make_buffer,
)
from kvproto.testing.faults import FaultySecondary

_LIMITS = KitLimits(max_job_steps=4, job_timeout_s=0.05)


def _driver(tier: FaultySecondary[MemoryTier], buffer: memoryview) -> SecondaryDriver:
    return SecondaryDriver(tier, buffer, tier.capabilities, _LIMITS)


def _faulty() -> tuple[FaultySecondary[MemoryTier], memoryview]:
    buffer = make_buffer(32, 64)
    return FaultySecondary(MemoryTier(buffer), buffer=buffer), buffer


def test_one_bad_result_never_hides_the_others() -> None:
    """collect() records every result of a batch before it raises: the good one is not later
    blamed as never reported (TIER-11)."""
    tier, buffer = _faulty()
    kit = _driver(tier, buffer)
    keys = key_pool("blame-batch", 2)
    tier.report_twice(1)
    kit.submit_store(keys[:1], [0])
    kit.collect()
    second = kit.submit_store(keys[1:], [1])
    with pytest.raises(ConformanceFailure) as caught:
        kit.collect()
    assert caught.value.clause == "TIER-11" and "twice" in caught.value.detail
    assert second.job_id in kit.results
    assert kit.pending() == []
    kit.shutdown()


def test_a_wrong_load_never_names_a_slot_the_kit_filled() -> None:
    """The TIER-10 diagnosis names a slot holding the key's bytes only where the tier put them."""
    tier, buffer = _faulty()
    kit = _driver(tier, buffer)
    key = key_pool("blame-slot", 1)[0]
    kit.store([key], [0])  # the kit itself fills slot 0 with the key's bytes
    tier.corrupt_on_read([key], detect=False)
    with pytest.raises(ConformanceFailure) as caught:
        kit.load([key], [5])
    assert caught.value.clause == "TIER-10"
    assert "instead" not in caught.value.detail, caught.value.detail
    kit.shutdown()


class _Kit(SecondaryTierTests):
    """The kit's checks, called directly on a driver."""


def test_retry_check_accepts_a_failed_store() -> None:
    """A store the tier reports failed is not expected to answer HIT (it once read 'MISS after its
    store succeeded')."""
    tier, buffer = _faulty()
    tier.fail_next_jobs(1)
    kit = _driver(tier, buffer)
    _Kit().test_retry_resolves_within_declared_steps(kit)
    kit.shutdown()


class _LoggedFaulty(FaultySecondary[MemoryTier]):
    """Logs every arming of fail_next_jobs and every job submitted."""

    def __init__(self, buffer: memoryview, log: list[str]) -> None:
        super().__init__(MemoryTier(buffer), buffer=buffer)
        self.log = log
        log.append("new machine")

    def fail_next_jobs(self, n: int) -> None:
        self.log.append("arm")
        super().fail_next_jobs(n)

    def submit_store(self, job: TransferJob) -> None:
        self.log.append("job")
        super().submit_store(job)

    def submit_load(self, job: TransferJob) -> None:
        self.log.append("job")
        super().submit_load(job)


def test_the_machine_arms_one_failure_at_a_time() -> None:
    """The state machine expects one failure per arming, so it never arms again before a job was
    submitted (with a hook that adds, two armings would fail two jobs)."""
    log: list[str] = []

    class Hooked(SecondaryTierTests):
        def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
            assert isinstance(tier, _LoggedFaulty)
            tier.fail_next_jobs(n)

    machine = TierStateMachine.configure(lambda buffer: _LoggedFaulty(buffer, log), tests=Hooked())
    quick = settings(
        max_examples=40, stateful_step_count=30, deadline=None, database=None, derandomize=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
    )
    run_state_machine_as_test(machine, settings=quick)
    assert "arm" in log
    assert all(not (a == b == "arm") for a, b in itertools.pairwise(log)), "armed twice with no job in between"


class _OverEager(SecondaryTierTests):
    """A fail_next_jobs hook with too much effect: asked for n jobs, it fails n + 1."""

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        assert isinstance(tier, FaultySecondary)
        tier.fail_next_jobs(n + 1 if n else 0)


class _Lazy(SecondaryTierTests):
    """A fail_next_jobs hook with no effect."""

    def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
        pass


@pytest.mark.parametrize(("tests", "words"), [(_OverEager(), "too much"), (_Lazy(), "too little")])
def test_kit5_catches_a_hook_with_too_much_or_too_little_effect(tests: SecondaryTierTests, words: str) -> None:
    tier, buffer = _faulty()
    kit = _driver(tier, buffer)
    with pytest.raises(ConformanceFailure) as caught:
        tests.test_fail_next_jobs_hook_fails_exactly_n_jobs(kit)
    assert caught.value.clause == "KIT-5" and words in caught.value.detail
    kit.shutdown()


def test_a_hook_failing_two_jobs_is_kit5_not_the_tiers_fault() -> None:
    """The store after the injected failure fails only because of the hook: KIT-5, not TIER-10."""
    tier, buffer = _faulty()
    kit = _driver(tier, buffer)
    with pytest.raises(ConformanceFailure) as caught:
        _OverEager().test_no_hit_after_failed_store(kit)
    assert caught.value.clause == "KIT-5"
    kit.shutdown()


def test_the_reference_hooks_pass_the_hook_check() -> None:
    class Honest(SecondaryTierTests):
        def fail_next_jobs(self, tier: SecondaryTier, n: int) -> None:
            assert isinstance(tier, FaultySecondary)
            tier.fail_next_jobs(n)

        def fail_keys(self, tier: SecondaryTier, keys: Iterable[OffloadKey]) -> None:
            assert isinstance(tier, FaultySecondary)
            tier.fail_keys(keys)

    tier, buffer = _faulty()
    kit = _driver(tier, buffer)
    Honest().test_fail_next_jobs_hook_fails_exactly_n_jobs(kit)
    kit.shutdown()
