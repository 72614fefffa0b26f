"""The state machines used directly, as the tutorial shows (KIT-8)."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from kvproto import MemoryTier
from kvproto.testing import ConformanceFailure, DifferentialStateMachine, TierStateMachine
from kvproto.testing.faults import LatencySecondary

from tests.kvproto.testing.gallery import HitAfterFailedStore, LostWrite

_QUICK = settings(
    max_examples=25,
    stateful_step_count=20,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    report_multiple_bugs=False,
)


def test_model_machine_passes_memory_tier() -> None:
    run_state_machine_as_test(TierStateMachine.configure(MemoryTier), settings=_QUICK)


def test_differential_machine_passes_an_evicting_memory_tier() -> None:
    machine = DifferentialStateMachine.configure(
        lambda b: LatencySecondary(MemoryTier(b, capacity_blocks=3), job_steps=1)
    )
    run_state_machine_as_test(machine, settings=_QUICK)


def test_model_machine_finds_a_lost_write() -> None:
    with pytest.raises(ConformanceFailure) as caught:
        run_state_machine_as_test(TierStateMachine.configure(LostWrite), settings=_QUICK)
    assert caught.value.clause == "TIER-10"
    assert "lost write" in caught.value.detail


def test_differential_machine_finds_what_memory_tier_does_not_hold() -> None:
    # Without fault injection HitAfterFailedStore behaves; with MemoryTier's hooks it would not.
    run_state_machine_as_test(DifferentialStateMachine.configure(HitAfterFailedStore), settings=_QUICK)
    with pytest.raises(ConformanceFailure):
        run_state_machine_as_test(DifferentialStateMachine.configure(LostWrite), settings=_QUICK)
