"""Shared helpers for the CPU tier tests: a fake clock, key makers, store and load through a handler."""

from __future__ import annotations

import torch

from kvproto_cpu import BlockState, CpuTier, CpuTierConfig, CpuTransferHandler, TransferOutcome
from tests.kvproto.tierkit._slots_support import REQ, FakeClock, key, keys

__all__ = ["REQ", "STREAMING_NOT_BUILT", "FakeClock", "key", "keys", "load", "make_tier", "store", "store_wipe_load"]

#: Why a streaming-kernel test skips (CPU-13): setup.py left the optional extension out of this install.
STREAMING_NOT_BUILT = "kvproto_cpu._streamcopy is not built here (no C compiler, no SSE2, or a free-threaded CPython)"

def make_tier(
    num_slots: int = 4,
    block_bytes: int = 16,
    *,
    policy: str = "lru",
    deadline: float = 10.0,
    clock: FakeClock | None = None,
) -> tuple[CpuTier, FakeClock]:
    clock = clock or FakeClock()
    config = CpuTierConfig(
        num_slots=num_slots,
        block_bytes=block_bytes,
        policy=policy,
        pin_memory="off",
        pending_deadline_s=deadline,
    )
    return CpuTier(config, clock=clock), clock


def store(tier: CpuTier, handler: CpuTransferHandler, ids: list[int], blocks: list[int]) -> None:
    """Reserve keys ``ids``, copy device ``blocks`` into them and wait; every job must succeed."""
    out = tier.prepare_store(keys(*ids), REQ)
    assert out is not None and len(out.keys_to_store) == len(ids)
    handler.submit_store(out.keys_to_store, out.slots, blocks)
    outcomes = handler.wait()
    assert outcomes and all(o.success for o in outcomes)


def load(
    tier: CpuTier, handler: CpuTransferHandler, ids: list[int], targets: list[int]
) -> list[TransferOutcome]:
    """Pin keys ``ids`` (``prepare_load``), copy them into device blocks ``targets``, wait."""
    slots = tier.prepare_load(keys(*ids), REQ)
    handler.submit_load(keys(*ids), slots, targets)
    return handler.wait()


def store_wipe_load(
    tier: CpuTier, handler: CpuTransferHandler, cache: list[torch.Tensor], blocks: list[int], shift: int
) -> tuple[list[torch.Tensor], list[int], list[int], list[TransferOutcome]]:
    """Store device ``blocks`` as keys 0..n-1 (each must end READY), zero the device ``cache``, then load
    the keys into the blocks ``shift`` further on (modulo the cache's blocks).

    Returns the cache as it was before the wipe, the target blocks, the key ids and the load's outcomes.
    """
    original = [layer.clone() for layer in cache]
    ids = list(range(len(blocks)))
    store(tier, handler, ids, blocks)
    assert all(tier.state(k) is BlockState.READY for k in keys(*ids))
    for layer in cache:
        layer.zero_()
    num_blocks = cache[0].shape[0]
    targets = [(b + shift) % num_blocks for b in blocks]
    return original, targets, ids, load(tier, handler, ids, targets)
