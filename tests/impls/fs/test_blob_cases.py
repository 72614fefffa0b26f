"""BlobTier's promises over the file backend (TIERKIT-2, TIERKIT-3): the reusable cases, run on FsTier.

The damaged-load / skipped-store race (both report orders), no REMOVED on a
transient read error (EIO), and at most 65,536 untaken events.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvproto import OffloadKey, envelope as env
from kvproto.testing import FaultyBackend, faulty_jobs
from kvproto.tierkit import BlobTier, BlobTierConfig

from tests.kvproto.tierkit.test_blob_cases import BLOCK, SLOTS, BlobBackendCases, BlobEnv

fs = pytest.importorskip("kvproto_fs", reason="kvproto-fs is not installed: pip install -e impls/fs (./dev does it)")


class TestFileBackend(BlobBackendCases):
    """The cases over :class:`kvproto_fs.FsTier` (its FileBackend wrapped in a FaultyBackend)."""

    @pytest.fixture
    def env(self, tmp_path: Path) -> BlobEnv:
        count = iter(range(10**6))

        def build(config: BlobTierConfig) -> tuple[BlobTier, FaultyBackend]:
            root = tmp_path / f"root-{next(count)}"
            root.mkdir()
            buffer = memoryview(bytearray(SLOTS * BLOCK)).cast("B", (SLOTS, BLOCK))
            tier = faulty_jobs(fs.FsTier)(
                buffer,
                fs.FsTierConfig(root=root, shared=config.shared, read_threads=2, write_threads=2),
                wrap=FaultyBackend,
            )
            assert isinstance(tier.backend, FaultyBackend)
            return tier, tier.backend

        def damage(tier: BlobTier, k: OffloadKey) -> None:
            assert isinstance(tier, fs.FsTier)
            fd = os.open(tier.path_of(k), os.O_RDWR)
            try:
                byte = os.pread(fd, 1, env.HEADER_BYTES)
                os.pwrite(fd, bytes([byte[0] ^ 0xFF]), env.HEADER_BYTES)
            finally:
                os.close(fd)

        def stored(tier: BlobTier, k: OffloadKey) -> bool:
            assert isinstance(tier, fs.FsTier)
            return bool(tier.path_of(k).exists())

        return BlobEnv(build, damage, stored)
