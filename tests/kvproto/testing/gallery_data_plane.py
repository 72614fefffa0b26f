"""Gallery (KIT-13): a primary tier's data plane, the copies between an engine's device KV cache and the
tier's slots, driven through the ``device_copy`` hook (TIER-10, TIER-8).

Held-out rounds 7 and 8 each planted a regression in kvproto-cpu's ``CpuTransferHandler`` that the kit
never ran (its spec built only the tier); round 8's split a job's copies into runs by the slots alone,
so a run continued over device blocks that were not consecutive and copied other blocks' KV into the
tier. Here the same class, written for the gallery over ``MemoryPrimaryTier``: a plain-Python data
plane over one flat device buffer that copies each run of consecutive slots as one slice.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvproto import MemoryPrimaryTier, OffloadKey
from kvproto.testing import DeviceCopy, TierSpec

from tests.kvproto.testing.gallery_registry import Gallery

__all__ = ["DATA_PLANE_GALLERY", "RunCopies", "copies_runs_split_by_slots_alone"]

_SLOTS = 32
_BLOCK_BYTES = 96


class RunCopies:
    """A device cache of ``device_blocks`` blocks in one ``bytearray``; a job's copies go in runs, each one
    slice. ``by_slots_alone``: the bug, a run continues while the slots are consecutive, whatever the
    device blocks are."""

    def __init__(self, tier: MemoryPrimaryTier, device_blocks: int, *, by_slots_alone: bool) -> None:
        self._tier = tier
        self._device = memoryview(bytearray(device_blocks * _BLOCK_BYTES))
        self._by_slots_alone = by_slots_alone

    def _runs(self, slots: Sequence[int], blocks: Sequence[int]) -> list[tuple[int, int, int]]:
        """``(first slot, first device block, length)`` of each run of the job."""
        runs: list[tuple[int, int, int]] = []
        for slot, block in zip(slots, blocks, strict=True):
            if runs:
                first_slot, first_block, length = runs[-1]
                next_slot = slot == first_slot + length
                if next_slot and (self._by_slots_alone or block == first_block + length):
                    runs[-1] = (first_slot, first_block, length + 1)
                    continue
            runs.append((slot, block, 1))
        return runs

    def _rows(self, first: int, length: int) -> memoryview:
        return self._tier.buffer.cast("B")[first * _BLOCK_BYTES : (first + length) * _BLOCK_BYTES]

    def write_block(self, block: int, data: bytes) -> None:
        self._device[block * _BLOCK_BYTES : (block + 1) * _BLOCK_BYTES] = data

    def read_block(self, block: int) -> bytes:
        return bytes(self._device[block * _BLOCK_BYTES : (block + 1) * _BLOCK_BYTES])

    def store(self, keys: Sequence[OffloadKey], slots: Sequence[int], blocks: Sequence[int]) -> bool:
        for slot, block, length in self._runs(slots, blocks):
            self._rows(slot, length)[:] = self._device[block * _BLOCK_BYTES : (block + length) * _BLOCK_BYTES]
        return True

    def load(self, keys: Sequence[OffloadKey], slots: Sequence[int], blocks: Sequence[int]) -> bool:
        for slot, block, length in self._runs(slots, blocks):
            self._device[block * _BLOCK_BYTES : (block + length) * _BLOCK_BYTES] = self._rows(slot, length)
        return True

    def close(self) -> None:
        """Nothing runs beside the caller."""


def _spec(by_slots_alone: bool) -> TierSpec:
    def device_copy(tier: MemoryPrimaryTier, device_blocks: int) -> DeviceCopy:
        return RunCopies(tier, device_blocks, by_slots_alone=by_slots_alone)

    return TierSpec(
        "run-copies", "primary", lambda: MemoryPrimaryTier(num_slots=_SLOTS, block_bytes=_BLOCK_BYTES),
        hooks={"device_copy": device_copy},
    )


def conformance_spec() -> TierSpec:
    """The honest twin: runs split where the slots or the device blocks stop being consecutive."""
    return _spec(False)


DATA_PLANE_GALLERY = Gallery()
"""This module's target (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``."""


@DATA_PLANE_GALLERY.fails("test_blocks_copied_through_the_data_plane_keep_their_bytes", "TIER-8",
                          "the data plane copied another block")
def copies_runs_split_by_slots_alone() -> TierSpec:
    return _spec(True)
