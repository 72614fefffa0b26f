"""The ``cpu`` entry point of the ``kvproto.tiers`` group: what ``kvproto conform cpu`` checks (KIT-9)."""

from __future__ import annotations

from kvproto.testing import TierSpec
from kvproto.tierkit import HOST_PRIMARY_CAPABILITIES

from kvproto_cpu._config import CpuTierConfig
from kvproto_cpu._tier import CpuTier

__all__ = ["conformance_spec"]


def _build() -> CpuTier:
    return CpuTier(CpuTierConfig(num_slots=32, block_bytes=64, pin_memory="off"))


def conformance_spec() -> TierSpec:
    """CpuTier with 32 slots of 64 bytes, unpinned: small enough that the kit drives it into eviction."""
    return TierSpec(
        "cpu",
        "primary",
        _build,
        capabilities=HOST_PRIMARY_CAPABILITIES,
        tier_class=CpuTier,
        description="kvproto_cpu.CpuTier(CpuTierConfig(num_slots=32, block_bytes=64, pin_memory='off'))",
    )
