"""A TierSpec's ``block_bytes`` sets the rows of every primary buffer the kit gives its tier (KIT-9):
the default 64 bytes, or page-aligned rows for multiples of 4 KiB (a tier's O_DIRECT path)."""

from __future__ import annotations

import ctypes

from kvproto import MemoryTier, SecondaryTier
from kvproto.testing import MEMORY_HOOKS, TierSpec, make_buffer

from tests.cli import kvproto_cli


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


SEEN: list[tuple[int, ...] | None] = []
"""The shapes of the primary buffers the kit handed to the factories below."""


def _recording_factory(buffer: memoryview) -> SecondaryTier:
    SEEN.append(buffer.shape)
    return MemoryTier(buffer)


def wide() -> TierSpec:
    return TierSpec("wide", "secondary", _recording_factory, hooks=MEMORY_HOOKS, block_bytes=4096)


def plain() -> TierSpec:
    return TierSpec("plain", "secondary", _recording_factory, hooks=MEMORY_HOOKS)


def test_the_spec_sets_the_kit_geometry_and_its_own_build() -> None:
    """Through the command line, as a tier author runs the kit: every buffer of a check has the spec's rows."""
    tier = wide().build()
    assert isinstance(tier, MemoryTier)
    tier.shutdown()
    assert SEEN == [(32, 4096)]
    for name, row in (("wide", 4096), ("plain", 64)):
        SEEN.clear()
        check = ["--check", "touch_of_unknown_keys_is_a_no_op"]
        code = kvproto_cli(["conform", f"{__name__}:{name}", "--no-typecheck", "--profile", "fast", *check])
        assert code == 0
        assert SEEN and {shape[1] for shape in SEEN if shape is not None} == {row}, (name, SEEN)
