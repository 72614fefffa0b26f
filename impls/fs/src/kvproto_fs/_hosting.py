"""``fs`` as an engine hosts it (``kvproto.hosting.build_secondary_tier("fs", buffer, options)``): a plain
:class:`FsTier`, configured by the engine configuration's options, never the kit's fixture.

The ``fs`` entry point's conformance spec builds the tier the kit checks: a fault-injecting class
over fault-injecting file operations, in shared mode, with a budget of 48 blocks of the kit's 64-byte
rows (about 195 KiB, so that the kit's state machines reach eviction). Hosted in an engine, that
budget holds two or three blocks of a real KV chunk, and every store beyond them evicts one that a
lookup was about to ask for (issue 37: 2 of 64 keys found right after their store task completed).
So the spec names this function as its ``hosting_factory`` (KIT-9): the options are
:class:`FsTierConfig`'s fields (FS-1); without a ``root``, the blocks go to a fresh temporary
directory, removed once the tier is gone (collected, or at exit: a process that ends by ``os._exit``,
as pytest-xdist's workers and forked children do, runs no exit handlers), and a warning says where.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any, Literal

from kvproto import envelope as env
from kvproto.errors import ConfigurationError

from kvproto_fs._config import FsTierConfig
from kvproto_fs._tier import FsTier

__all__ = ["hosted_fs_tier"]

log = logging.getLogger("kvproto_fs")


def hosted_fs_tier(
    buffer: memoryview,
    *,
    root: Path | None = None,
    capacity_bytes: int | None = None,
    capacity_blocks: int | None = None,
    shared: bool = False,
    read_threads: int = 4,
    write_threads: int = 4,
    durability: Literal["none", "data", "full"] = "none",
    o_direct: Literal["auto", "on", "off"] = "auto",
    **config: Any,
) -> FsTier:
    """``FsTier(buffer, FsTierConfig(...))``, the options named here or any other of
    :class:`FsTierConfig`'s fields (FS-1); text values are converted by these annotations (KIT-9).

    ``root`` defaults to a fresh temporary directory (removed at exit, with a warning saying where).
    The byte budget (``max_bytes``) is ``capacity_bytes``, or ``capacity_blocks`` whole blocks of
    ``buffer``'s rows (each with its envelope header): the capacity contract ``kvproto simulate``
    sizes a tier by. None of them: nothing is evicted. Bad options raise
    :class:`~kvproto.errors.ConfigurationError` naming each.
    """
    given = {"capacity_bytes": capacity_bytes, "capacity_blocks": capacity_blocks, "max_bytes": config.get("max_bytes")}
    budgets = [name for name, value in given.items() if value is not None]
    if len(budgets) > 1:
        raise ConfigurationError(f"fs: give one byte budget, not {' and '.join(budgets)}")
    if capacity_blocks is not None:
        config["max_bytes"] = capacity_blocks * (env.HEADER_BYTES + (buffer.shape[1] if buffer.shape else buffer.nbytes))
    elif capacity_bytes is not None:
        config["max_bytes"] = capacity_bytes
    temporary = root is None
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="kvproto-fs-hosted-"))
        log.warning("kvproto fs tier: no root given; blocks are kept in %s, removed once the tier is gone", root)
    try:
        tier = FsTier(buffer, FsTierConfig(root=root, shared=shared, read_threads=read_threads,
                                           write_threads=write_threads, durability=durability, o_direct=o_direct,
                                           **config))
    except BaseException:
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
        raise
    if temporary:
        weakref.finalize(tier, shutil.rmtree, root, True)  # once collected, or at exit (whichever comes first)
    return tier
