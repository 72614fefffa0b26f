"""The reference CPU primary tier: kvproto's :class:`~kvproto.tierkit.SlotTable` over one host buffer (CPU-2..CPU-10).

The state machine (ABSENT / WRITING / READY / PINNED, counted pins, LRU or ARC
eviction, deadline and quarantine, events) is the slot table's; this module
adds the slot buffer (an anonymous mmap, optionally pinned, seen as a torch
tensor and a memoryview) and the configuration. The data plane is
:class:`kvproto_cpu.CpuTransferHandler`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from kvproto.tierkit import BlockState, SlotStats, SlotTable

from kvproto_cpu._buffer import allocate_slot_buffer
from kvproto_cpu._config import CpuTierConfig

__all__ = ["BlockState", "CpuTier", "CpuTierStats"]

#: The CPU tier's counters: the slot table's (kept under its old name).
CpuTierStats = SlotStats


class CpuTier(SlotTable):
    """The CPU primary tier (satisfies :class:`kvproto.PrimaryTier`, CPU-2..CPU-10).

    ``CpuTier(CpuTierConfig(num_slots=1024, block_bytes=2 << 20))``. ``clock``
    (seconds, monotonic) drives the pending-write deadline; tests inject a
    fake one. ``name`` appears in events.

    Everything but the buffer (lookups, stores, loads, eviction in
    ``config.policy`` order, events, lifecycle, ``stats``) is
    :class:`~kvproto.tierkit.SlotTable`'s, whose docstring tells the state
    machine; a write still WRITING after ``config.pending_deadline_s`` is
    failed and its slot quarantined until its late completion (CPU-7, CPU-8).

    The tier is not thread-safe: call it from one thread (the scheduler's).
    The data plane (:class:`CpuTransferHandler`) touches only the buffer from
    its worker, and drives completions from ``poll`` on the caller's thread.
    """

    def __init__(
        self,
        config: CpuTierConfig,
        *,
        name: str = "cpu",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            config.slot_count,
            name=name,
            policy=config.policy,
            pending_deadline_s=config.pending_deadline_s,
            clock=clock,
        )
        self._config = config
        self._block_bytes = config.block_bytes
        slots = allocate_slot_buffer(self, self.num_slots, self._block_bytes, config.pin_memory)
        self._tensor = slots.tensor
        self._buffer = slots.view
        self._rows = slots.view.cast("B")
        self._pinned = slots.pinned

    @property
    def buffer(self) -> memoryview:
        """Writable ``(num_slots, block_bytes)`` view of the slot buffer, format ``"B"``, no copy (TIER-3, CPU-2)."""
        return self._buffer

    @property
    def tensor(self) -> torch.Tensor:
        """The slot buffer as a uint8 tensor ``[num_slots, block_bytes]``, sharing ``buffer``'s memory (CPU-2)."""
        return self._tensor

    @property
    def pinned(self) -> bool:
        """Whether the slot buffer is pinned (page-locked) for CUDA copies (CPU-2)."""
        return self._pinned

    @property
    def config(self) -> CpuTierConfig:
        """The configuration the tier was built with (CPU-1)."""
        return self._config

    @property
    def block_bytes(self) -> int:
        """The size of one block, one slot row, in bytes (CPU-1)."""
        return self._block_bytes

    def slot_view(self, slot: int) -> memoryview:
        """The 1-D writable row of ``slot``, sharing the buffer's memory (CPU-2, CPU-10)."""
        row = self.check_slot(slot)
        return self._rows[row * self._block_bytes : (row + 1) * self._block_bytes]
