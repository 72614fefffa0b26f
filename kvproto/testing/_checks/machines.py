"""How the kit runs its state machines (:mod:`kvproto.testing.stateful`) as checks (KIT-7, KIT-8).

Each machine runs under the check's profile; a failure Hypothesis cannot
replay (a threaded tier's timing) still fails with its clause, and the
examples and steps run are recorded on the test item for the reports.
Every failure lists the steps that led to it, replayed or not, as recorded by
:mod:`kvproto.testing._harness.steps` (KIT-3).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from hypothesis import settings
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto.testing._harness.driver import searching
from kvproto.testing._harness.failures import ConformanceFailure, SearchHalted
from kvproto.testing._harness.settings import KitProfile, hypothesis_settings
from kvproto.testing._harness.steps import StepRecorder, explain_flaky, with_steps
from kvproto.testing.stateful import (
    DifferentialStateMachine,
    FullPrimaryStateMachine,
    PrimaryStateMachine,
    TierStateMachine,
)

if TYPE_CHECKING:
    import pytest

    from kvproto.testing._harness.base import KitBase

__all__ = ["run_explorer", "run_machine", "run_primary_machine", "run_recorded"]

_M = TypeVar("_M", bound=RuleBasedStateMachine)


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
    recorder = StepRecorder(base)
    machine = base.configure(
        recorder.traced_factory(tier_factory), capabilities=tests.capabilities, limits=tests.limits, tests=tests
    )
    untrace = recorder.trace_hooks(tests)
    try:
        run_recorded(machine, machine.runs, profile, request, recorder)
    finally:
        untrace()


def run_primary_machine(
    tests: KitBase, tier_factory: Callable[[], PrimaryTier], profile: KitProfile, request: pytest.FixtureRequest,
    *, full: bool = False,
) -> None:
    """Run the primary-tier machine under ``profile`` (see :func:`run_recorded`), ``primary_examples`` examples;
    ``full``: :class:`FullPrimaryStateMachine` (the tier filled first), half as many."""
    base = FullPrimaryStateMachine if full else PrimaryStateMachine
    recorder = StepRecorder(base)
    machine = base.configure(recorder.traced_factory(tier_factory), capabilities=tests.capabilities, limits=tests.limits)
    examples = max(2, profile.primary_examples // 2) if full else profile.primary_examples
    run_recorded(machine, machine.runs, profile, request, recorder, examples=examples)


def run_explorer(
    tests: KitBase, tier_factory: Callable[[memoryview], SecondaryTier], profile: KitProfile, request: pytest.FixtureRequest
) -> None:
    """Run the explorer (KIT-23) under ``profile``: for each row of the swarm plan (rows of up to
    ``explore_max_block_bytes`` bytes), an eighth of ``explore_examples`` examples (at least two: the
    first Hypothesis draws is its simplest) of up to ``machine_steps`` steps, each row as
    :func:`run_recorded` runs a machine. A failure names its row's operation kinds and block size."""
    from kvproto.testing._explore.machine import explorer_for, swarm_plan
    from kvproto.testing._explore.replay import REPLAY_NOTE, replay_test

    totals = [0, 0]
    per_row = max(2, -(-profile.explore_examples // 8))
    for kinds, size in swarm_plan(profile.explore_max_block_bytes):
        machine = explorer_for(tests, tier_factory, kinds=kinds, block_size=size)
        recorder = StepRecorder(machine)
        machine.tier_factory = staticmethod(recorder.traced_factory(tier_factory))
        untrace = recorder.trace_hooks(tests)
        try:
            run_recorded(machine, machine.runs, profile, request, recorder, examples=per_row, record=False)
        except ConformanceFailure as failure:
            failure.add_note(f"explorer run: operations {sorted(kinds)}, rows of {size} bytes")
            test = replay_test(getattr(failure, "__notes__", ()), kinds=kinds, block_size=size, why=str(failure))
            if test is not None:
                failure.add_note(f"{REPLAY_NOTE}: this test, pasted into the SecondaryTierTests subclass that runs "
                                 f"the tier, fails until the tier is fixed (KIT-23):\n{test}")
            raise
        finally:
            untrace()
            totals = [totals[0] + machine.runs[0], totals[1] + machine.runs[1]]
    stats = {"examples": totals[0], "steps": totals[1], "profile": profile.name}
    request.node.user_properties.append(("hypothesis", json.dumps(stats)))


def _recording(machine: type[_M], recorder: StepRecorder) -> type[_M]:
    """``machine``, telling ``recorder`` how each example ends (see StepRecorder.finish)."""

    def __init__(self: Any) -> None:
        self._kvproto_outer = recorder.start()
        machine.__init__(self)

    def teardown(self: Any) -> None:
        recorder.finish(self._kvproto_outer, lambda: machine.teardown(self))

    return type(machine.__name__, (machine,), {"__init__": __init__, "teardown": teardown})


def run_recorded(
    machine: type[RuleBasedStateMachine],
    runs: list[int],
    profile: KitProfile,
    request: pytest.FixtureRequest,
    recorder: StepRecorder | None = None,
    *,
    examples: int | None = None,
    record: bool = True,
) -> None:
    """Run ``machine`` under ``profile``; a failure Hypothesis could not replay still fails with
    its clause. ``runs`` (examples, steps), as the machine counts them,
    is recorded on the test item either way. With ``recorder`` (whose traced factory the
    machine builds its tiers with), every failure lists the steps that led to it, and a tier
    that is merely nondeterministic is reported as such, blaming no clause
    (:func:`~kvproto.testing._harness.steps.explain_flaky`). ``examples``: how many, where not the
    profile's ``machine_examples``; ``record``: False where the caller records the runs on the item."""
    if recorder is None:
        recorder = StepRecorder(machine)  # records how examples end, not the calls
    try:
        chosen = hypothesis_settings(profile)
        if examples is not None:
            chosen = settings(chosen, max_examples=examples)
        with searching():
            run_state_machine_as_test(_recording(machine, recorder), settings=chosen)
    except SearchHalted as halted:  # a hung call: neither shrunk nor replayed (KIT-27)
        failure = halted.failure
        log = recorder.log_of(failure) or recorder.current
        if isinstance(failure, ConformanceFailure):
            raise with_steps(failure, log, note=" (the search stopped at this example: a hung call is not replayed)") from failure
        if log is not None:
            failure.add_note(log.render())
        raise failure from None
    except Flaky as flaky:
        raise explain_flaky(flaky, recorder) from flaky
    except ConformanceFailure as failure:
        raise with_steps(failure, recorder.log_of(failure)) from failure
    except Exception as error:  # an error of the tier itself: its steps go in a note
        log = recorder.log_of(error)
        if log is not None:
            error.add_note(log.render())
        raise
    finally:
        if record:
            stats = {"examples": runs[0], "steps": runs[1], "profile": profile.name}
            request.node.user_properties.append(("hypothesis", json.dumps(stats)))
