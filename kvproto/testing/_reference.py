"""The reference tiers kvproto ships, as ``kvproto.tiers`` entry points (KIT-9).

``kvproto conform`` with no target runs the kit against each of these, on
these embedded defaults, with no set-up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kvproto._keys import OffloadKey
from kvproto._memory_primary_tier import MemoryPrimaryTier
from kvproto._memory_tier import MemoryTier
from kvproto._protocols import SecondaryTier
from kvproto.errors import ConfigurationError
from kvproto.testing._harness.tier_spec import TierSpec
from kvproto.testing.faults import LatencySecondary

__all__ = ["MEMORY_HOOKS", "memory", "memory_async", "memory_primary", "memory_threaded"]


def _memory_of(tier: object) -> MemoryTier:
    """The MemoryTier inside ``tier``, unwrapping fault and latency wrappers (their ``inner``)."""
    found = tier
    while not isinstance(found, MemoryTier):
        inner = getattr(found, "inner", None)
        if inner is None:
            raise ConfigurationError(f"the MemoryTier hooks were given {tier!r}, which holds no MemoryTier")
        found = inner
    return found


def _seed(tier: object, key: OffloadKey, data: bytes) -> None:
    _memory_of(tier).seed(key, data)


def _read(tier: object, key: OffloadKey) -> bytes | None:
    return _memory_of(tier).read_stored(key)


def _fail_next(tier: object, n: int) -> None:
    _memory_of(tier).fail_next_jobs(n)


def _fail_keys(tier: object, keys: Iterable[OffloadKey]) -> None:
    _memory_of(tier).fail_keys(keys)


def _corrupt(tier: object, keys: Iterable[OffloadKey]) -> None:
    _memory_of(tier).corrupt_on_read(keys)


MEMORY_HOOKS: dict[str, Callable[..., Any]] = {
    "seed_block": _seed,
    "read_block": _read,
    "fail_next_jobs": _fail_next,
    "fail_keys": _fail_keys,
    "corrupt_on_read": _corrupt,
}
"""Backdoor hooks for MemoryTier and anything built on it (a subclass, or wrappers with ``inner``)."""


def _memory_spec(
    name: str, build: Callable[[memoryview], SecondaryTier], description: str
) -> TierSpec:
    return TierSpec(name, "secondary", build, hooks=MEMORY_HOOKS, description=description)


def memory() -> TierSpec:
    """MemoryTier with immediate jobs and lookups (``capacity_blocks``: an option, e.g. ``kvproto simulate
    --secondary memory:capacity_blocks=1024``; unbounded by default)."""

    def build(buffer: memoryview, *, capacity_blocks: int | None = None) -> SecondaryTier:
        return MemoryTier(buffer, name="memory", capacity_blocks=capacity_blocks)

    return _memory_spec("memory", build, "kvproto.MemoryTier(buffer)")


def _latent_memory_spec(
    name: str, steps: int, *, latency_s: float = 0.0, capacity_blocks: int | None = None
) -> TierSpec:
    """A MemoryTier (``latency_s``, ``capacity_blocks`` passed on) behind a LatencySecondary whose jobs
    and lookups take ``steps`` steps."""
    knobs = {"latency_s": latency_s, "capacity_blocks": capacity_blocks}
    shown = ", ".join(f"{knob}={value!r}" for knob, value in knobs.items() if value)

    default_capacity, default_latency = capacity_blocks, latency_s

    def build(
        buffer: memoryview, *, capacity_blocks: int | None = default_capacity, latency_s: float = default_latency
    ) -> SecondaryTier:
        """The options (``kvproto simulate --secondary NAME:capacity_blocks=N,latency_s=S``) override the defaults."""
        inner = MemoryTier(buffer, name=name, latency_s=latency_s, capacity_blocks=capacity_blocks)
        return LatencySecondary(inner, job_steps=steps, lookup_steps=steps)

    latency = f"job_steps={steps}, lookup_steps={steps}"
    return _memory_spec(name, build, f"LatencySecondary(kvproto.MemoryTier(buffer, {shown}), {latency})")


def memory_async() -> TierSpec:
    """MemoryTier whose jobs and lookups take two steps, with a capacity that evicts."""
    return _latent_memory_spec("memory-async", 2, capacity_blocks=48)


def memory_threaded() -> TierSpec:
    """MemoryTier whose jobs finish on worker threads a couple of milliseconds after their step."""
    return _latent_memory_spec("memory-threaded", 1, latency_s=0.002)


def memory_primary() -> TierSpec:
    """MemoryPrimaryTier, 32 slots of 64 bytes: the torch-free reference primary tier (``num_slots`` and
    ``block_bytes``: options, e.g. ``kvproto simulate --primary memory-primary:num_slots=1024``)."""

    def build(*, num_slots: int = 32, block_bytes: int = 64) -> MemoryPrimaryTier:
        return MemoryPrimaryTier(num_slots=num_slots, block_bytes=block_bytes)

    return TierSpec(
        "memory-primary",
        "primary",
        build,
        tier_class=MemoryPrimaryTier,
        description="kvproto.MemoryPrimaryTier(num_slots=32, block_bytes=64)",
    )
