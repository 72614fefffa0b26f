"""Helpers for the filesystem tier's tests: a buffer, keys with known bytes, and blocking job runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvproto_fs import FsTier, FsTierConfig
from tests.impls._tier_runner import Runner, make_buffer, shut_down_after


def open_tier(root: Path, buffer: memoryview | None = None, **options: object) -> tuple[FsTier, Runner[FsTier]]:
    buf = make_buffer() if buffer is None else buffer
    tier = FsTier(buf, FsTierConfig(root=root, **options))
    assert tier.wait_ready(10)
    return tier, Runner(tier, buf)


@contextmanager
def opened_tier(root: Path, buffer: memoryview | None = None, **options: object) -> Iterator[tuple[FsTier, Runner[FsTier]]]:
    """:func:`open_tier` for a ``with`` block; the tier is shut down when the block ends, whatever happens."""
    with shut_down_after(open_tier(root, buffer, **options)) as opened:
        yield opened


def temp_files(tier: FsTier) -> list[Path]:
    return sorted(tier.tmp_dir.glob("*.tmp"))
