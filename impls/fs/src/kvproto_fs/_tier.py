"""``FsTier``: the reference filesystem secondary tier (FS-1..FS-12) = :class:`kvproto.tierkit.BlobTier` + :class:`FileBackend`.

On disk, one file per block, ``<root>/<namespace>/<aa>/<bb>/<digest>.kvb``
(``digest`` = SHA-256 of the key in hex, ``aa``/``bb`` its first two byte
pairs), holding a :mod:`kvproto.envelope` (4 KiB header + payload). Temp files
live in ``<root>/<namespace>/tmp/``; ``<root>/<namespace>/manifest.json`` is
the layout manifest the namespace is the hash of. Jobs, verdicts, events,
budget, shutdown and reset are the engine's (TIERKIT-1..TIERKIT-4).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from kvproto import BatchLookup, OffloadKey, SecondaryTier, envelope as env
from kvproto.errors import ConfigurationError
from kvproto.tierkit import BlobBackend, BlobTier, BlobTierConfig, BlobTierStats, slot_buffer_shape

from kvproto_fs._backend import TMP_SUFFIX, FileBackend
from kvproto_fs._config import FsTierConfig
from kvproto_fs._io import DirectIO, FileOps, link_refused, probe_direct

__all__ = ["FsTier", "FsTierStats"]


@dataclass
class FsTierStats(BlobTierStats):
    """The engine's counters plus the file backend's (read them from the scheduler's thread)."""

    swept_temps: int = 0
    link_fallbacks: int = 0


class FsTier(BlobTier):
    """A secondary tier keeping one verified file per block under a root directory (FS-1..FS-12).

    ``buffer`` is the primary tier's slot buffer (a writable, C-contiguous
    2-D ``memoryview`` of format ``"B"``, one row per slot); its row length
    is the block size. ``ops`` replaces the system calls (disk full, I/O
    errors, crashes); ``wrap`` wraps the file backend below the tier
    (tracing, metrics, or the kit's :class:`kvproto.testing.FaultyBackend`,
    TIERKIT-8). The tier has no fault knob: the kit fails jobs through a
    :func:`kvproto.testing.faulty_jobs` class of it (KIT-5).
    """

    file_backend: ClassVar[type[FileBackend]] = FileBackend
    """The class of :attr:`files` (a subclass may change how blocks become files)."""

    def __init__(
        self,
        buffer: memoryview,
        config: FsTierConfig,
        *,
        name: str = "fs",
        ops: FileOps | None = None,
        wrap: Callable[[BlobBackend], BlobBackend] | None = None,
    ) -> None:
        if not isinstance(config, FsTierConfig):
            raise ConfigurationError(f"FsTier {name!r}: config must be an FsTierConfig, got {type(config).__name__}")
        _, block_bytes = slot_buffer_shape(f"FsTier {name!r}", buffer)  # before the manifest: its layout
        self.config = config
        self.root = config.root
        manifest = env.namespace_manifest(block_bytes, config.layout)
        namespace = env.namespace_id(manifest).hex()
        self.ns_dir = config.root / namespace
        self.tmp_dir = self.ns_dir / "tmp"
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            _write_manifest(self.ns_dir, manifest)
        except OSError as exc:
            raise ConfigurationError(f"FsTier {name!r}: cannot write under root {str(config.root)!r}: {exc}") from exc
        if config.o_direct == "on":
            refused = probe_direct(str(self.tmp_dir), ops)
            if refused is not None:
                raise ConfigurationError(
                    f"FsTier {name!r}: o_direct='on' but the filesystem of root {str(config.root)!r} "
                    f"refuses O_DIRECT: {refused}"
                )
        stats = FsTierStats()
        self._direct = DirectIO(config.o_direct)
        self.files = self.file_backend(
            config.root, durability=config.durability, direct=self._direct, temp_grace_s=config.temp_grace_s,
            ops=ops, name=name, count=lambda counter, n: self._count(counter, n),
        )
        engine = BlobTierConfig(
            shared=config.shared, layout=config.layout, max_bytes=config.max_bytes,
            read_threads=config.read_threads, write_threads=config.write_threads,
            probe_deadline_steps=config.probe_deadline_steps, probe_min_interval_s=config.probe_min_interval_s,
            recent_keys=config.recent_keys, hold_hits_steps=config.hold_hits_steps,
            hold_hits_max=config.hold_hits_max,
        )
        super().__init__(self.files, buffer, engine, name=name, stats=stats, wrap=wrap)
        self.stats: FsTierStats = stats

    # -- operator surface --------------------------------------------------------------------

    def path_of(self, key: OffloadKey) -> Path:
        """The file that holds ``key``'s block."""
        return self.root / self.name_of(key)

    @property
    def direct_io_counts(self) -> tuple[int, int]:
        """(I/Os done with O_DIRECT, I/Os done buffered), files opened for blocks."""
        return self._direct.direct_ios, self._direct.buffered_ios


def _conforms(tier: FsTier) -> tuple[SecondaryTier, BatchLookup]:
    """Never called: mypy proves here that FsTier satisfies SecondaryTier structurally and offers lookup_many
    (BatchLookup)."""
    return tier, tier


def _write_manifest(ns_dir: Path, manifest: dict[str, object]) -> None:
    """``<ns>/manifest.json`` once (create-if-absent), at construction: an unwritable root fails here (FS-1)."""
    path = ns_dir / "manifest.json"
    if path.exists():
        return
    tmp = ns_dir / "tmp" / f"manifest-{os.getpid()}-{uuid.uuid4().hex[:8]}{TMP_SUFFIX}"
    tmp.write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError as exc:
        if not link_refused(exc):
            raise
        os.replace(tmp, path)
        return
    tmp.unlink()
