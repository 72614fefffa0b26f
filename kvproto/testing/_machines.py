"""How the kit runs its state machines (:mod:`kvproto.testing.stateful`) as checks (KIT-7, KIT-8).

Each machine runs under the check's profile; a failure Hypothesis cannot
replay (a threaded tier's timing) still fails with its clause, and the
examples and steps run are recorded on the test item for the reports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto.testing._failures import ConformanceFailure
from kvproto.testing._settings import KitProfile, hypothesis_settings
from kvproto.testing.stateful import DifferentialStateMachine, PrimaryStateMachine, TierStateMachine

if TYPE_CHECKING:
    import pytest

    from kvproto.testing._base import KitBase

__all__ = ["flaky_failure", "run_machine", "run_primary_machine", "run_recorded"]


def flaky_failure(flaky: Flaky) -> ConformanceFailure:
    """A ConformanceFailure for a failure Hypothesis could not reproduce on replay.

    With a threaded tier the same operations may end differently from run to
    run; the first failure seen is still a contract break, so it is reported
    with its clause, marked as timing-dependent.
    """
    seen: list[BaseException] = [flaky]
    while seen:
        error = seen.pop()
        if isinstance(error, ConformanceFailure):
            return ConformanceFailure(
                error.clause, f"{error.detail} (timing-dependent: it did not reproduce on replay)"
            )
        if isinstance(error, BaseExceptionGroup):
            seen.extend(error.exceptions)
        for linked in (error.__cause__, error.__context__):
            if linked is not None:
                seen.append(linked)
    return ConformanceFailure(
        "TIER-10",
        f"the tier behaved differently when Hypothesis replayed the same operations ({flaky!r}): "
        "its answers depend on timing in a way the contract does not allow",
    )


def run_machine(
    tests: KitBase,
    tier_factory: Callable[[memoryview], SecondaryTier],
    profile: KitProfile,
    request: pytest.FixtureRequest,
    *,
    differential: bool,
) -> None:
    """Run one secondary-tier machine under ``profile`` (see :func:`run_recorded`)."""
    base = DifferentialStateMachine if differential else TierStateMachine
    machine = base.configure(
        tier_factory, capabilities=tests.capabilities, limits=tests.limits, tests=tests
    )
    run_recorded(machine, machine.runs, profile, request)


def run_primary_machine(
    tests: KitBase, tier_factory: Callable[[], PrimaryTier], profile: KitProfile, request: pytest.FixtureRequest
) -> None:
    """Run the primary-tier machine under ``profile`` (see :func:`run_recorded`)."""
    machine = PrimaryStateMachine.configure(tier_factory, capabilities=tests.capabilities, limits=tests.limits)
    run_recorded(machine, machine.runs, profile, request)


def run_recorded(
    machine: type[RuleBasedStateMachine], runs: list[int], profile: KitProfile, request: pytest.FixtureRequest
) -> None:
    """Run ``machine`` under ``profile``; a failure Hypothesis could not replay still fails with
    its clause (:func:`flaky_failure`). ``runs`` (examples, steps), as the machine counts them,
    is recorded on the test item either way."""
    try:
        run_state_machine_as_test(machine, settings=hypothesis_settings(profile))
    except Flaky as flaky:
        raise flaky_failure(flaky) from flaky
    finally:
        stats = {"examples": runs[0], "steps": runs[1], "profile": profile.name}
        request.node.user_properties.append(("hypothesis", json.dumps(stats)))
