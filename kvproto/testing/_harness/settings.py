"""Kit profiles and per-tier limits (KIT-7)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvproto._field_rules import check_fields, count, non_negative

if TYPE_CHECKING:
    from hypothesis import settings

__all__ = ["PROFILES", "KitLimits", "KitProfile", "hypothesis_settings", "profile_named"]


@dataclass(frozen=True, slots=True)
class KitProfile:
    """How hard the Hypothesis-driven checks search.

    ``fast`` is for smoke runs (the kit's own gallery), ``default`` keeps the
    whole kit against MemoryTier under a minute on two cores, ``thorough``
    (``kvproto conform --thorough``) searches ten times longer and shrinks a
    failing example to a minimal one (``shrink``). Without shrinking, a failure
    is reported with the (longer) sequence of operations that found it: a
    broken tier that loses jobs costs the kit a timeout per shrink attempt.
    """

    name: str
    machine_examples: int
    machine_steps: int
    race_rounds: int
    shrink: bool = False


PROFILES: dict[str, KitProfile] = {
    "fast": KitProfile("fast", machine_examples=15, machine_steps=20, race_rounds=8),
    "default": KitProfile("default", machine_examples=60, machine_steps=40, race_rounds=32),
    "thorough": KitProfile("thorough", machine_examples=600, machine_steps=80, race_rounds=256, shrink=True),
}

ENV_PROFILE = "KVPROTO_KIT_PROFILE"


def profile_named(name: str | None) -> KitProfile:
    """The profile called ``name``; ``None`` means ``$KVPROTO_KIT_PROFILE`` or ``default``."""
    from kvproto.errors import ConfigurationError

    chosen = name or os.environ.get(ENV_PROFILE) or "default"
    try:
        return PROFILES[chosen]
    except KeyError:
        raise ConfigurationError(
            f"unknown kit profile {chosen!r}; known: {', '.join(PROFILES)}"
        ) from None


@dataclass(frozen=True, slots=True)
class KitLimits:
    """How long the kit waits before it calls something a contract break.

    * ``max_job_steps`` / ``job_timeout_s``: a job not reported after this many
      end-of-step hooks AND this much wall time is lost (TIER-11). Both bounds
      must pass, so a threaded tier is not failed for a slow disk.
    * ``lookup_budget_s``: a lookup (or ``on_step_end``) slower than this may
      have blocked (TIER-4, TIER-13). A slow lookup is confirmed by asking the
      same key ``confirm_repeats`` more times: it blocked if the median of those
      is over budget too (a scheduling hiccup is not repeated). A slow
      ``on_step_end`` counts only if its thread gave up the CPU during the call
      (a voluntary context switch: it waited, where the OS tells); more than
      ``slow_calls_forgiven`` such steps in one check, making up two thirds of
      at least 12 steps, fail it. So a loaded
      machine does not fail a tier, and a lookup or hook waiting 10 ms for I/O
      does.

    A RETRY is bounded in steps only: while waiting for one, the kit runs
    end-of-step hooks at least ``retry_step_interval_s`` (10 ms) apart (a fast
    scheduler's step; a tier may count hooks closer than that as one, and
    rely on no more), then gives background work
    up to ``job_timeout_s`` to finish without a hook; a lookup still answering
    RETRY after ``max_retry_steps`` hooks and that wait breaks TIER-18,
    however fast the steps were.

    Counts are ints >= 1 (``slow_calls_forgiven`` >= 0), times finite numbers >= 0: any other value
    raises :class:`~kvproto.errors.ConfigurationError` naming the limit.
    """

    max_job_steps: int = count(64)
    job_timeout_s: float = non_negative(2.0)
    lookup_budget_s: float = non_negative(0.008)
    slow_calls_forgiven: int = count(2, low=0)
    confirm_repeats: int = count(5)
    retry_step_interval_s: float = non_negative(0.01)

    def __post_init__(self) -> None:
        check_fields(self, "KitLimits: ")


def hypothesis_settings(profile: KitProfile) -> settings:
    """Hypothesis settings for the kit's state machines under ``profile``."""
    import hypothesis.core
    from hypothesis import HealthCheck, Phase, settings as make_settings

    # A seed given (kvproto conform --seed) wins over derandomizing, which would ignore it (KIT-18).
    seeded = hypothesis.core.global_force_seed is not None
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if profile.shrink:
        phases.append(Phase.shrink)
    return make_settings(
        max_examples=profile.machine_examples,
        stateful_step_count=profile.machine_steps,
        deadline=None,
        derandomize=not profile.shrink and not seeded,
        database=None,
        phases=phases,
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
