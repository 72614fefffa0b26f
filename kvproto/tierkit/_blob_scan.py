"""The restart scan of :class:`~kvproto.tierkit.BlobTier`: rebuild the private index from the backend's listing.

Runs on the engine's housekeeping thread. Each listed blob's header is read
(the header only) and checked: a blob of this namespace, at the name its key
gives, one envelope long, is indexed; a damaged one is deleted; another
namespace's is left alone (a configuration mismatch, logged).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from kvproto import envelope as env
from kvproto._keys import OffloadKey
from kvproto.tierkit._blob_ops import SUFFIX, BlobOps

__all__ = ["restart_scan"]

_log = logging.getLogger("kvproto.tierkit")

_BATCH = 256


def restart_scan(
    ops: BlobOps,
    add: Callable[[list[tuple[OffloadKey, int]]], bool],
    stop: threading.Event,
    *,
    tier_name: str,
    count: Callable[[str, int], None],
) -> None:
    """List the namespace and hand the keys of valid blobs to ``add`` in batches (it returns False to
    stop: a reset made the scan stale). Returns early once ``stop`` is set (shutdown)."""
    backend = ops.backend
    head = memoryview(bytearray(env.HEADER_BYTES))
    batch: list[tuple[OffloadKey, int]] = []
    for name, _size in backend.list_blobs(ops.namespace_hex):
        if stop.is_set():
            return
        if not name.endswith(SUFFIX):
            continue
        tick = ops.tick()  # before the read: a deletion after it wins
        key = _check(ops, name, head, tier_name=tier_name, count=count)
        if key is not None:
            batch.append((key, tick))
        if len(batch) >= _BATCH:
            if not add(batch):
                return
            batch = []
    if batch:
        add(batch)


def _check(
    ops: BlobOps, name: str, head: memoryview, *, tier_name: str, count: Callable[[str, int], None]
) -> OffloadKey | None:
    try:
        got = ops.backend.read_into(name, (head,))
    except Exception:
        return None  # vanished or unreadable now: a lookup will find out
    try:
        header = env.decode_header(head[: min(got, env.HEADER_BYTES)])
        if header.namespace != ops.namespace:
            _log.warning("BlobTier %r: %s belongs to namespace %s; leaving it", tier_name, name,
                         header.namespace.hex())
            return None
        if ops.name_of(header.key) != name or header.payload_len != ops.block_bytes or got != ops.blob_bytes:
            raise env.EnvelopeError("length", "misplaced or wrongly sized blob")
        return OffloadKey(header.key)
    except env.EnvelopeError as exc:
        _log.warning("BlobTier %r: %s is damaged (%s); deleting it", tier_name, name, exc)
        try:
            ops.backend.delete(name)
        except Exception:
            return None
        count("damaged_removed", 1)
        return None
