"""The ``cpu`` entry point of the ``kvproto.tiers`` group: what ``kvproto conform cpu`` checks (KIT-9)."""

from __future__ import annotations

import time
import weakref

from kvproto.testing import TierSpec
from kvproto.tierkit import HOST_PRIMARY_CAPABILITIES

from kvproto_cpu._config import CpuTierConfig
from kvproto_cpu._tier import CpuTier

__all__ = ["conformance_spec"]


class _KitClock:
    """The monotonic clock, moved forward on demand: the kit's tier measures its pending deadline on it."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead


_CLOCKS: weakref.WeakKeyDictionary[CpuTier, _KitClock] = weakref.WeakKeyDictionary()


def _build() -> CpuTier:
    clock = _KitClock()
    tier = CpuTier(CpuTierConfig(num_slots=32, block_bytes=64, pin_memory="off"), clock=clock)
    _CLOCKS[tier] = clock
    return tier


def _advance_clock(tier: CpuTier, seconds: float) -> None:
    """Move the clock ``tier`` measures its pending deadline on (CPU-7, CPU-8) forward by ``seconds``: the kit's
    hook of TIER-25 (a late write's slot stays quarantined until its completion)."""
    _CLOCKS[tier].ahead += seconds


def conformance_spec() -> TierSpec:
    """CpuTier with 32 slots of 64 bytes, unpinned: small enough that the kit drives it into eviction; its
    pending deadline runs on a clock the kit can move (``advance_clock``, TIER-25)."""
    return TierSpec(
        "cpu",
        "primary",
        _build,
        capabilities=HOST_PRIMARY_CAPABILITIES,
        hooks={"advance_clock": _advance_clock},
        tier_class=CpuTier,
        description="kvproto_cpu.CpuTier(CpuTierConfig(num_slots=32, block_bytes=64, pin_memory='off'), "
        "clock=<monotonic, moved by the kit's advance_clock>)",
    )
