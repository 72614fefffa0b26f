"""How :class:`~kvproto.tierkit.BlobTier` finds its blobs: the restart scan and the existence checks.

The restart scan runs on the engine's housekeeping thread: it rebuilds the
private index from the backend's listing. Each listed blob's header is read
(the header only) and checked: a blob of this namespace, at the name its key
gives, one envelope long, is indexed; a damaged one is deleted; another
namespace's is left alone (a configuration mismatch, logged).

The existence checks (shared mode) run on the probe's worker, one chunk of
keys at a time, front first (AP-9): :func:`check_exists` degrades per key,
never per chunk (TIERKIT-5).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from kvproto import envelope as env
from kvproto._keys import OffloadKey
from kvproto.tierkit._blob_ops import SUFFIX, BlobOps

__all__ = ["PROBE_CHUNK_KEYS", "Sizes", "check_exists", "names_of", "restart_scan"]

_log = logging.getLogger("kvproto.tierkit")

_BATCH = 256

#: Keys per existence check: a prompt's leading keys answer while its tail is still being checked
#: (4,096 keys on a shared filesystem under 2 ms steps get their leading hits, TIERKIT-5).
PROBE_CHUNK_KEYS = 64

# After a chunk's batch call raised, its keys are checked one by one; this many failing in a row
# means the storage is failing, not a key: the rest of the chunk is MISS without more calls.
_FAILURES_IN_A_ROW = 3


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


Sizes = Callable[[Sequence[str]], Sequence[int | None]]


def names_of(ops: BlobOps, keys: Sequence[OffloadKey]) -> list[str]:
    """The blob names of the keys of ``keys`` that can be named (a batch's names for TIERKIT-7)."""
    names: list[str] = []
    for key in keys:
        try:
            names.append(ops.name_of(key))
        except Exception:
            continue  # check_exists counts and logs it when its chunk comes
    return names


def check_exists(
    ops: BlobOps, keys: Sequence[OffloadKey], *, tier_name: str, count: Callable[[str, int], None],
    names: dict[OffloadKey, str] | None = None,
    sizes: Sizes | None = None,
) -> list[OffloadKey]:
    """The keys of ``keys`` whose blob is one envelope long (the probe's check, off the scheduler; TIERKIT-5).

    Degrades per key, never per batch: a key that cannot be named (not
    bytes) is MISS alone; if the backend's batch call raises, the keys are
    asked one by one, so a key whose check fails is MISS alone, until
    ``_FAILURES_IN_A_ROW`` fail in a row (the storage itself is failing:
    the rest is MISS, without more calls). Each failure is counted as a
    ``probe_errors``. ``names``, if given, gets each key's blob name (for the caller's next step).
    ``sizes``: the chunk's batch call (a batch's
    :meth:`~kvproto.tierkit.ExistenceBatches.batch_sizes`, TIERKIT-7),
    else the backend's ``sizes``; one by one always asks ``sizes``.
    """
    named: list[tuple[OffloadKey, str]] = []
    for key in keys:
        try:
            named.append((key, ops.name_of(key)))
        except Exception as exc:  # a malformed key (e.g. not bytes) fails alone
            count("probe_errors", 1)
            _log.warning("BlobTier %r: key %r cannot be checked (MISS): %s", tier_name, key, exc)
    want = ops.blob_bytes
    try:
        found = (ops.backend.sizes if sizes is None else sizes)([name for _, name in named])
    except Exception as exc:
        count("probe_errors", 1)
        _log.warning("BlobTier %r: an existence check of %d keys failed; checking them one by one: %s",
                     tier_name, len(named), exc)
        return _one_by_one(ops, named, tier_name=tier_name, count=count)
    if names is not None:
        names.update(named)
    return [key for (key, _), size in zip(named, found, strict=True) if size == want]


def _one_by_one(
    ops: BlobOps, named: list[tuple[OffloadKey, str]], *, tier_name: str, count: Callable[[str, int], None]
) -> list[OffloadKey]:
    found: list[OffloadKey] = []
    failures = 0
    for i, (key, name) in enumerate(named):
        try:
            (size,) = ops.backend.sizes([name])
        except Exception as exc:
            count("probe_errors", 1)
            failures += 1
            if failures >= _FAILURES_IN_A_ROW:
                _log.warning("BlobTier %r: %d existence checks failed in a row; %d keys answer MISS for now: %s",
                             tier_name, failures, len(named) - i - 1, exc)
                return found
            continue
        failures = 0
        if size == ops.blob_bytes:
            found.append(key)
    return found
