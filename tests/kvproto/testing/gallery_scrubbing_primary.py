"""Gallery (KIT-13): held-out round 7, written from the public docs by someone who had not read the kit
and measured before anyone looked (the kit passed it then); it joined the gallery after.
Bug: ``reset_cache`` zeroes the rows of the blocks it held without looking at whether the reset was
refused: refused while a load holds a pin, it still scrubs the pinned row under that load and every
other row, while every block still answers HIT.

A host-memory primary tier that scrubs freed KV rows on reset (multi-tenant hosts).

Built on ``kvproto.tierkit.SlotTable`` (the state machine: slots, pins, LRU,
deadline and quarantine); this module adds the slot buffer and one feature:
``reset_cache`` zeroes the rows that held blocks, so that after an operator
resets the cache (a tenant switch, a model reload) no KV of the previous
tenant can be read back from host memory, by a bug in a secondary tier or a
debugging dump.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from kvproto.errors import ConfigurationError
from kvproto.tierkit import HOST_PRIMARY_CAPABILITIES, SlotTable

from tests.kvproto.testing.gallery_registry import Gallery

if TYPE_CHECKING:
    from kvproto.testing import TierSpec

__all__ = ["ScrubbingPrimary", "conformance_spec"]


class ScrubbingPrimary(SlotTable):
    """``num_slots`` rows of ``block_bytes`` bytes in one ``bytearray``; LRU; rows zeroed on reset."""

    def __init__(
        self,
        *,
        num_slots: int,
        block_bytes: int,
        pending_deadline_s: float | None = 30.0,
        scrub_on_reset: bool = True,
        name: str = "scrubbing-primary",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if type(block_bytes) is not int or block_bytes < 1:
            raise ConfigurationError(f"ScrubbingPrimary: block_bytes must be an int >= 1, got {block_bytes!r}")
        super().__init__(num_slots, name=name, policy="lru", pending_deadline_s=pending_deadline_s, clock=clock)
        self._block_bytes = block_bytes
        self._flat = memoryview(bytearray(num_slots * block_bytes))
        self._rows = self._flat.cast("B", (num_slots, block_bytes))
        self._zeros = bytes(block_bytes)
        self._scrub_on_reset = scrub_on_reset
        self.scrubbed_rows = 0
        self.capabilities = replace(HOST_PRIMARY_CAPABILITIES, lru=True)

    @property
    def buffer(self) -> memoryview:
        return self._rows

    @property
    def block_bytes(self) -> int:
        return self._block_bytes

    def slot_view(self, slot: int) -> memoryview:
        start = self.check_slot(slot) * self._block_bytes
        return self._flat[start : start + self._block_bytes]

    def reset_cache(self) -> bool:
        # The rows to scrub must be read before the reset: afterwards ready_slots is empty.
        rows = sorted(self.ready_slots.values()) if self._scrub_on_reset else []
        reset = super().reset_cache()
        for slot in rows:
            self._scrub(slot)
        return reset

    def _scrub(self, slot: int) -> None:
        start = slot * self._block_bytes
        self._flat[start : start + self._block_bytes] = self._zeros
        self.scrubbed_rows += 1


def _build() -> ScrubbingPrimary:
    return ScrubbingPrimary(num_slots=32, block_bytes=64)


def conformance_spec() -> TierSpec:
    from kvproto.testing import TierSpec

    return TierSpec("scrubbing-primary", "primary", _build, tier_class=ScrubbingPrimary)


SCRUBBING_GALLERY = Gallery()
"""This module's target (gallery_registry.py); gallery_index.py gathers it into ``GALLERY``."""


@SCRUBBING_GALLERY.fails("test_reset_cache_with_pins_held", "TIER-16", "a refused reset changes nothing")
def scrubs_rows_when_its_reset_is_refused() -> TierSpec:
    return conformance_spec()
