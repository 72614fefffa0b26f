"""The ``cpu`` entry point of the ``kvproto.tiers`` group: what ``kvproto conform cpu`` checks (KIT-9)."""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence

import torch

from kvproto import OffloadKey
from kvproto.testing import TierSpec
from kvproto.tierkit import HOST_PRIMARY_CAPABILITIES

from kvproto_cpu._config import CpuTierConfig
from kvproto_cpu._tier import CpuTier
from kvproto_cpu._transfer import CpuTransferHandler

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


_LAYERS = 2


class _DeviceCopy:
    """The kit's data plane over ``tier`` (the ``device_copy`` hook, a ``kvproto.testing.DeviceCopy``): a
    :class:`CpuTransferHandler` over a CPU cache of two layer tensors, a block's row being its layers' rows
    one after the other (CPU-11); the kit completes the tier's stores and loads itself."""

    def __init__(self, tier: CpuTier, device_blocks: int) -> None:
        width = tier.block_bytes // _LAYERS
        self._layers = [torch.zeros(device_blocks, width, dtype=torch.uint8) for _ in range(_LAYERS)]
        self._width = width
        self._handler = CpuTransferHandler(tier, self._layers, complete_tier=False)

    def write_block(self, block: int, data: bytes) -> None:
        for index, layer in enumerate(self._layers):
            piece = bytearray(data[index * self._width : (index + 1) * self._width])
            layer[block].copy_(torch.frombuffer(piece, dtype=torch.uint8))

    def read_block(self, block: int) -> bytes:
        return b"".join(layer[block].numpy().tobytes() for layer in self._layers)

    def store(self, keys: Sequence[OffloadKey], slots: Sequence[int], blocks: Sequence[int]) -> bool:
        return self._ended(self._handler.submit_store(keys, slots, blocks))

    def load(self, keys: Sequence[OffloadKey], slots: Sequence[int], blocks: Sequence[int]) -> bool:
        return self._ended(self._handler.submit_load(keys, slots, blocks))

    def _ended(self, job_id: int) -> bool:
        return any(outcome.job_id == job_id and outcome.success for outcome in self._handler.wait())

    def close(self) -> None:
        self._handler.shutdown()


def _device_copy(tier: CpuTier, device_blocks: int) -> _DeviceCopy:
    """A :class:`CpuTransferHandler` over a CPU cache of ``device_blocks`` blocks in two layers: the kit's hook of
    the data-plane check (TIER-10: a store or load copies exactly the blocks it is given, CPU-11, CPU-12)."""
    return _DeviceCopy(tier, device_blocks)


def conformance_spec() -> TierSpec:
    """CpuTier with 32 slots of 64 bytes, unpinned: small enough that the kit drives it into eviction; its
    pending deadline runs on a clock the kit can move (``advance_clock``, TIER-25); its data plane, a
    :class:`CpuTransferHandler` over a two-layer CPU cache (``device_copy``)."""
    return TierSpec(
        "cpu",
        "primary",
        _build,
        capabilities=HOST_PRIMARY_CAPABILITIES,
        hooks={"advance_clock": _advance_clock, "device_copy": _device_copy},
        tier_class=CpuTier,
        description="kvproto_cpu.CpuTier(CpuTierConfig(num_slots=32, block_bytes=64, pin_memory='off'), "
        "clock=<monotonic, moved by the kit's advance_clock>)",
    )
