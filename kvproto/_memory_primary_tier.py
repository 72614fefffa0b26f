"""The torch-free reference primary tier: a :class:`~kvproto.tierkit.SlotTable` over one ``bytearray`` (MEM-10).

The state machine (block states, pins, eviction, deadline and quarantine,
events) is the slot table's, shared with the reference CPU tier
(``kvproto_cpu.CpuTier``); this module adds only the bytes data plane, so the
kit, the manager's tests and tier authors have a primary tier that needs
nothing but the standard library.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from kvproto.errors import ConfigurationError
from kvproto.tierkit._slots import HOST_PRIMARY_CAPABILITIES, BlockState, SlotTable

if TYPE_CHECKING:
    from kvproto._protocols import BatchLookup, PrimaryTier, ReadyKeys

__all__ = ["BlockState", "MemoryPrimaryTier"]


class MemoryPrimaryTier(SlotTable):
    """A primary tier over an in-memory slot buffer (satisfies :class:`kvproto.PrimaryTier`, TIER-1, MEM-10).

    ``MemoryPrimaryTier(num_slots=32, block_bytes=64)``. Keyword arguments:

    * ``num_slots``, ``block_bytes``: the buffer is ``num_slots`` rows of
      ``block_bytes`` bytes (ints >= 1).
    * ``pending_deadline_s``: ``None`` (the default) lets a write stay WRITING
      until it completes; a number > 0 fails a write still WRITING after that
      many seconds of ``clock``: it answers MISS and its slot is quarantined
      until its late completion (CPU-7, CPU-8).
    * ``name``: a non-empty str, used in events and logs.
    * ``clock``: monotonic seconds; tests inject a fake one.

    Bad values raise :class:`~kvproto.errors.ConfigurationError` naming the
    argument. Eviction is LRU. Everything but the buffer (lookups, stores,
    loads, events, lifecycle, ``stats``) is :class:`~kvproto.tierkit.SlotTable`'s,
    whose docstring tells the state machine. Not thread-safe.
    """

    def __init__(
        self,
        *,
        num_slots: int,
        block_bytes: int,
        pending_deadline_s: float | None = None,
        name: str = "memory-primary",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if type(block_bytes) is not int or block_bytes < 1:
            raise ConfigurationError(f"MemoryPrimaryTier: block_bytes must be an int >= 1, got {block_bytes!r}")
        super().__init__(num_slots, name=name, policy="lru", pending_deadline_s=pending_deadline_s, clock=clock)
        self._block_bytes = block_bytes
        try:
            data = bytearray(num_slots * block_bytes)
        except (MemoryError, OverflowError) as exc:
            raise ConfigurationError(
                f"MemoryPrimaryTier {name!r}: cannot allocate {num_slots} slots x {block_bytes} bytes "
                f"= {num_slots * block_bytes:,} bytes; lower num_slots or block_bytes"
            ) from exc
        self._flat = memoryview(data)
        self._buffer = self._flat.cast("B", (num_slots, block_bytes))
        self.capabilities = replace(HOST_PRIMARY_CAPABILITIES, lru=True)  # its policy is "lru" (CAP-6)

    @property
    def buffer(self) -> memoryview:
        """Writable, C-contiguous ``(num_slots, block_bytes)`` view of the slot buffer, format ``"B"``.

        The same memory on every access, never a copy (TIER-3, CPU-2); the view
        keeps the memory alive after the tier is gone.
        """
        return self._buffer

    @property
    def step_driven(self) -> bool:
        """True without a pending deadline (the only thing it times): ``kvproto simulate --trace`` may replay
        over it in virtual time (MGR-22)."""
        deadline = self.pending_deadline_s
        return deadline is None or deadline == float("inf")

    @property
    def block_bytes(self) -> int:
        """The size of one block, one slot row, in bytes."""
        return self._block_bytes

    def slot_view(self, slot: int) -> memoryview:
        """The 1-D writable row of ``slot`` (a 2-D memoryview cannot be indexed by row) (CPU-10)."""
        start = self.check_slot(slot) * self._block_bytes
        return self._flat[start : start + self._block_bytes]


if TYPE_CHECKING:

    def _conforms(tier: MemoryPrimaryTier) -> tuple[PrimaryTier, BatchLookup, ReadyKeys]:
        """Never called: mypy proves MemoryPrimaryTier satisfies these protocols (TIER-1, TIER-17, MGR-15)."""
        return tier, tier, tier
