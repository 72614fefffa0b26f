"""The primary tiers built on SlotTable, as the shared tests build them: one factory per flavor.

Flavors: ``memory`` (``kvproto.MemoryPrimaryTier``, LRU) and, where torch
imports, ``cpu-lru`` and ``cpu-arc`` (``kvproto_cpu.CpuTier`` with that policy).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import pytest

from kvproto import LookupResult, MemoryPrimaryTier, OffloadKey, ReqContext, make_key
from kvproto.tierkit import SlotTable

if TYPE_CHECKING:
    from kvproto_cpu import CpuTier

__all__ = [
    "CPU_ARC",
    "CPU_LRU",
    "FLAVORS",
    "HAS_TORCH",
    "LRU_FLAVORS",
    "MEMORY",
    "REQ",
    "FakeClock",
    "Flavor",
    "Tier",
    "answers",
    "key",
    "keys",
    "stored",
]

REQ = ReqContext("req-0")

Tier: TypeAlias = "MemoryPrimaryTier | CpuTier"

HAS_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("kvproto_cpu") is not None


class FakeClock:
    """A monotonic clock the test moves by hand; counts how often it is read."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True)
class Flavor:
    """How to build one primary tier over SlotTable: ``flavor.make(num_slots, block_bytes, deadline=...)``."""

    id: str
    default_name: str
    policy: str

    def make(
        self, num_slots: int = 4, block_bytes: int = 8, *, deadline: float | None = None
    ) -> tuple[Tier, FakeClock]:
        """The tier and its fake clock; ``deadline=None``: no pending deadline."""
        clock = FakeClock()
        if self.id == "memory":
            tier: Tier = MemoryPrimaryTier(
                num_slots=num_slots, block_bytes=block_bytes, pending_deadline_s=deadline, clock=clock
            )
            return tier, clock
        from kvproto_cpu import CpuTier, CpuTierConfig

        config = CpuTierConfig(
            num_slots=num_slots,
            block_bytes=block_bytes,
            policy="arc" if self.policy == "arc" else "lru",
            pin_memory="off",
            pending_deadline_s=float("inf") if deadline is None else deadline,
        )
        return CpuTier(config, clock=clock), clock


_NO_TORCH = pytest.mark.skipif(not HAS_TORCH, reason="CpuTier needs torch and kvproto-cpu")
MEMORY = Flavor("memory", "memory-primary", "lru")
CPU_LRU = Flavor("cpu-lru", "cpu", "lru")
CPU_ARC = Flavor("cpu-arc", "cpu", "arc")
FLAVORS = [
    pytest.param(MEMORY, id="memory"),
    pytest.param(CPU_LRU, id="cpu-lru", marks=_NO_TORCH),
    pytest.param(CPU_ARC, id="cpu-arc", marks=_NO_TORCH),
]
LRU_FLAVORS = FLAVORS[:2]


def key(i: int, group: int = 0) -> OffloadKey:
    return make_key(i.to_bytes(8, "big"), group)


def keys(*ids: int) -> list[OffloadKey]:
    return [key(i) for i in ids]


def stored(tier: SlotTable, *ids: int) -> tuple[int, ...]:
    """Store keys ``ids`` (each must be new) and return their slots."""
    out = tier.prepare_store(keys(*ids), REQ)
    assert out is not None and out.keys_to_store == tuple(keys(*ids))
    tier.complete_store(out.keys_to_store, True)
    return out.slots


def answers(tier: SlotTable, ids: Iterable[int]) -> list[LookupResult]:
    return [tier.lookup(key(i), REQ) for i in ids]
