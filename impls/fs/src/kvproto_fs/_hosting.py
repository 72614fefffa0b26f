"""``fs`` as an engine hosts it (``kvproto.hosting.build_secondary_tier("fs", buffer, options)``): a plain
:class:`FsTier`, configured by the engine configuration's options, never the kit's fixture.

The ``fs`` entry point's conformance spec builds the tier the kit checks: a fault-injecting class
over fault-injecting file operations, in shared mode, with a budget of 48 blocks of the kit's 64-byte
rows (about 195 KiB, so that the kit's state machines reach eviction). Hosted in an engine, that
budget holds two or three blocks of a real KV chunk, and every store beyond them evicts one that a
lookup was about to ask for (issue 37: 2 of 64 keys found right after their store task completed).
So the spec names this function as its ``hosting_factory`` (KIT-9): the options are
:class:`FsTierConfig`'s fields (FS-1); without a ``root``, the blocks go to a fresh temporary
directory, removed when the process exits, and a warning says where.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from pathlib import Path

from kvproto_fs._config import FsTierConfig
from kvproto_fs._tier import FsTier

__all__ = ["hosted_fs_tier"]

log = logging.getLogger("kvproto_fs")


def hosted_fs_tier(buffer: memoryview, **options: object) -> FsTier:
    """``FsTier(buffer, FsTierConfig(**options))``; ``root`` defaults to a fresh temporary directory
    (removed at exit). Bad options raise :class:`~kvproto.errors.ConfigurationError` naming each (FS-1)."""
    if options.get("root") is None:
        root = Path(tempfile.mkdtemp(prefix="kvproto-fs-hosted-"))
        atexit.register(shutil.rmtree, root, True)
        log.warning("kvproto fs tier: no root given; blocks are kept in %s, removed when this process exits", root)
        options = {**options, "root": root}
    return FsTier(buffer, FsTierConfig(**options))
