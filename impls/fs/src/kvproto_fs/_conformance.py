"""The ``fs`` entry point of the ``kvproto.tiers`` group: what ``kvproto conform fs`` checks (KIT-9)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kvproto import OffloadKey, envelope as env
from kvproto.errors import ConfigurationError
from kvproto.testing import FaultyBackend, TierSpec

from kvproto_fs._config import FsTierConfig
from kvproto_fs._tier import FsTier

__all__ = ["FS_HOOKS", "conformance_spec", "fresh_root", "fs_spec"]

KIT_BLOCKS_BUDGET = 48
"""The kit's tier keeps at most this many blocks (a budget that the state machines drive into eviction)."""

_parent: Path | None = None


def fresh_root() -> Path:
    """A new empty directory under one per-process temporary folder, removed at exit."""
    global _parent
    if _parent is None:
        _parent = Path(tempfile.mkdtemp(prefix="kvproto-fs-kit-"))
        atexit.register(shutil.rmtree, _parent, True)
    return Path(tempfile.mkdtemp(dir=_parent))


def _reopen(tier: FsTier, buffer: memoryview) -> FsTier:
    return FsTier(buffer, tier.config, name=tier.name, wrap=FaultyBackend)


def _reopen_other_layout(tier: FsTier, buffer: memoryview) -> FsTier:
    """A new instance over the same root for another model layout (another namespace, TIER-22)."""
    layout = {**tier.config.layout, "kvproto-kit": "another layout"}
    return FsTier(buffer, tier.config.model_copy(update={"layout": layout}), name=tier.name, wrap=FaultyBackend)


def _read_block(tier: FsTier, key: OffloadKey) -> bytes | None:
    try:
        data = tier.path_of(key).read_bytes()
    except FileNotFoundError:
        return None
    return data[env.HEADER_BYTES:]


def _seed_block(tier: FsTier, key: OffloadKey, data: bytes) -> None:
    path = tier.path_of(key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(env.encode(key, data, tier.namespace))
    tier.vouch_for([key])  # the scan would find it; the kit wants it at once


def _faulty(tier: FsTier) -> FaultyBackend:
    backend = tier.backend
    if not isinstance(backend, FaultyBackend):
        raise ConfigurationError(f"FsTier {tier.name!r}: the kit's fault hooks need FsTier(..., wrap=FaultyBackend)")
    return backend


def _fail_next_jobs(tier: FsTier, n: int) -> None:
    _faulty(tier).fail_next_jobs(n)


def _fail_keys(tier: FsTier, keys: Iterable[OffloadKey]) -> None:
    _faulty(tier).fail_keys(keys)


def _corrupt_on_read(tier: FsTier, keys: Iterable[OffloadKey]) -> None:
    """Flip one payload byte of each stored file: the checksum must catch it."""
    for key in keys:
        path = tier.path_of(key)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            byte = os.pread(fd, 1, env.HEADER_BYTES)
            os.pwrite(fd, bytes([byte[0] ^ 0xFF]), env.HEADER_BYTES)
        finally:
            os.close(fd)


FS_HOOKS: dict[str, Callable[..., Any]] = {
    "reopen": _reopen,
    "reopen_other_layout": _reopen_other_layout,
    "read_block": _read_block,
    "seed_block": _seed_block,
    "fail_next_jobs": _fail_next_jobs,
    "fail_keys": _fail_keys,
    "corrupt_on_read": _corrupt_on_read,
}
"""The kit's backdoor hooks for FsTier (KIT-5); the fault hooks arm the FaultyBackend the tier was built over."""


def fs_spec(name: str = "fs", *, shared: bool = True, eviction: bool = True) -> TierSpec:
    """FsTier over a fresh directory per tier: shared mode with a byte budget enables every kit check."""
    file_bytes = env.HEADER_BYTES + 64  # the kit's blocks are 64 bytes

    def build(
        buffer: memoryview,
        *,
        root: str | None = None,
        capacity_bytes: int | None = None,
        capacity_blocks: int | None = None,
        read_threads: int = 2,
        write_threads: int = 2,
    ) -> FsTier:
        """The kit's tier; the options (``kvproto simulate --secondary fs:root=DIR,capacity_bytes=200GiB``)
        set its root directory, its byte budget (``max_bytes``; or ``capacity_blocks`` whole blocks)
        and its I/O threads. Without them: a fresh temporary directory and the kit's 48-block budget."""
        if capacity_bytes is not None and capacity_blocks is not None:
            raise ConfigurationError("fs: give capacity_bytes or capacity_blocks, not both")
        budget = KIT_BLOCKS_BUDGET * file_bytes if eviction else None
        if capacity_bytes is not None:
            budget = capacity_bytes
        elif capacity_blocks is not None:
            budget = capacity_blocks * (env.HEADER_BYTES + buffer.shape[1] if buffer.shape else file_bytes)
        config = FsTierConfig(
            root=fresh_root() if root is None else Path(root), shared=shared, max_bytes=budget,
            read_threads=read_threads, write_threads=write_threads,
        )
        return FsTier(buffer, config, name=name, wrap=FaultyBackend)

    return TierSpec(
        name,
        "secondary",
        build,
        hooks=FS_HOOKS,
        tier_class=FsTier,
        description=(
            f"kvproto_fs.FsTier(buffer, FsTierConfig(root=<fresh temporary directory>, shared={shared}, "
            f"max_bytes={f'{KIT_BLOCKS_BUDGET} blocks' if eviction else None}), wrap=FaultyBackend)"
        ),
    )


def conformance_spec() -> TierSpec:
    """``kvproto conform fs``: shared mode with a 48-block budget (persistence, sharing, eviction,
    asynchronous lookups and partial jobs all declared, so every check runs)."""
    return fs_spec()
