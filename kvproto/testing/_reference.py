"""The reference tiers kvproto ships, as ``kvproto.tiers`` entry points (KIT-9).

``kvproto conform`` with no target runs the kit against each of these, on
these embedded defaults, with no set-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvproto._capabilities import Capabilities
from kvproto._keys import OffloadKey
from kvproto._memory_primary_tier import MemoryPrimaryTier
from kvproto._memory_tier import MemoryTier
from kvproto.testing._tier_spec import TierSpec

__all__ = ["MEMORY_HOOKS", "memory", "memory_async", "memory_primary", "memory_threaded"]


def _seed(tier: MemoryTier, key: OffloadKey, data: bytes) -> None:
    tier.seed(key, data)


def _read(tier: MemoryTier, key: OffloadKey) -> bytes | None:
    return tier.read_stored(key)


def _fail_next(tier: MemoryTier, n: int) -> None:
    tier.fail_next_jobs(n)


def _fail_keys(tier: MemoryTier, keys: Iterable[OffloadKey]) -> None:
    tier.fail_keys(keys)


def _corrupt(tier: MemoryTier, keys: Iterable[OffloadKey]) -> None:
    tier.corrupt_on_read(keys)


MEMORY_HOOKS: dict[str, Callable[..., Any]] = {
    "seed_block": _seed,
    "read_block": _read,
    "fail_next_jobs": _fail_next,
    "fail_keys": _fail_keys,
    "corrupt_on_read": _corrupt,
}
"""Backdoor hooks for MemoryTier and anything built on it."""


def _memory_spec(name: str, **options: Any) -> TierSpec:
    """MemoryTier called ``name`` built with ``options``, described as that call."""
    shown = "".join(f", {option}={value!r}" for option, value in options.items())
    return TierSpec(
        name,
        "secondary",
        lambda buffer: MemoryTier(buffer, name=name, **options),
        hooks=MEMORY_HOOKS,
        tier_class=MemoryTier,
        description=f"kvproto.MemoryTier(buffer{shown})",
    )


def memory() -> TierSpec:
    """MemoryTier with immediate jobs and lookups."""
    return _memory_spec("memory")


def memory_async() -> TierSpec:
    """MemoryTier with jobs and lookups that take two steps, and a capacity that evicts."""
    return _memory_spec("memory-async", job_latency_steps=2, lookup_latency_steps=2, capacity_blocks=48)


def memory_threaded() -> TierSpec:
    """MemoryTier whose jobs finish on worker threads a couple of milliseconds after their step."""
    return _memory_spec("memory-threaded", job_latency_steps=1, latency_s=0.002, lookup_latency_steps=1)


def memory_primary() -> TierSpec:
    """MemoryPrimaryTier, 32 slots of 64 bytes: the torch-free reference primary tier."""
    return TierSpec(
        "memory-primary",
        "primary",
        lambda: MemoryPrimaryTier(num_slots=32, block_bytes=64),
        tier_class=MemoryPrimaryTier,
        description="kvproto.MemoryPrimaryTier(num_slots=32, block_bytes=64)",
    )
