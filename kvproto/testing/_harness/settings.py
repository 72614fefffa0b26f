"""Kit profiles and per-tier limits (KIT-7); :class:`KitLimits` lives with :class:`~kvproto._tier_spec.TierSpec`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvproto._tier_spec import KitLimits  # defined with TierSpec, below the kit; re-exported here

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
    ``explore_examples`` and ``explore_max_block_bytes`` bound the explorer (KIT-23): each of its
    examples builds up to three instances, with rows of up to that many bytes. ``primary_examples``:
    the primary machine's examples (a primary's operations are memory operations, a tenth of a
    millisecond each: five times the secondary machine's examples cost ~2 s more).
    """

    name: str
    machine_examples: int
    machine_steps: int
    race_rounds: int
    shrink: bool = False
    explore_examples: int = 48
    explore_max_block_bytes: int = 1 << 20
    primary_examples: int = 300


PROFILES: dict[str, KitProfile] = {
    "fast": KitProfile("fast", machine_examples=15, machine_steps=20, race_rounds=8, explore_examples=16,
                       explore_max_block_bytes=65_560, primary_examples=75),
    "default": KitProfile("default", machine_examples=60, machine_steps=40, race_rounds=32),
    "thorough": KitProfile("thorough", machine_examples=600, machine_steps=80, race_rounds=256, shrink=True,
                           explore_examples=400, explore_max_block_bytes=4 << 20, primary_examples=3000),
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
