"""A TierSpec's ``block_bytes`` sets the rows of every primary buffer the kit gives its tier (KIT-9):
the default 64 bytes, or page-aligned rows for multiples of 4 KiB (a tier's O_DIRECT path)."""

from __future__ import annotations

import ctypes

from kvproto import MemoryTier, SecondaryTier
from kvproto._cli.targets import build_test_class
from kvproto.testing import TierSpec, make_buffer


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def test_a_multiple_of_4k_gives_page_aligned_rows() -> None:
    buffer = make_buffer(4, 8192)
    assert buffer.shape == (4, 8192) and not buffer.readonly
    rows = buffer.cast("B")
    for slot in range(4):
        assert _address(rows[slot * 8192 : (slot + 1) * 8192]) % 4096 == 0
    rows[8192:8200] = b"kvproto!"
    assert buffer.tobytes()[8192:8200] == b"kvproto!"  # row 1 of the 2-D buffer


def test_the_spec_sets_the_kit_geometry_and_its_own_build() -> None:
    seen: list[tuple[int, ...] | None] = []

    def factory(buffer: memoryview) -> SecondaryTier:
        seen.append(buffer.shape)
        return MemoryTier(buffer)

    wide = TierSpec("wide", "secondary", factory, block_bytes=4096)
    assert build_test_class(wide).block_bytes == 4096  # type: ignore[attr-defined]  # a SecondaryTierTests subclass
    tier = wide.build()
    assert isinstance(tier, MemoryTier)
    tier.shutdown()
    assert seen == [(32, 4096)]
    plain = TierSpec("plain", "secondary", factory)
    assert build_test_class(plain).block_bytes == 64  # type: ignore[attr-defined]  # as above
