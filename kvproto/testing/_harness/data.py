"""Deterministic test data: keys the kit stores and the bytes each key holds."""

from __future__ import annotations

import hashlib

from kvproto._keys import OffloadKey, make_key
from kvproto._tier_spec import make_buffer  # defined below the kit (TierSpec.build); re-exported here
from kvproto.errors import InvalidArgumentError

__all__ = ["block_for", "differing_bytes", "key_pool", "make_buffer", "row", "same_bytes_pool", "sentinel_for",
           "tricky_keys"]


_TAG_BYTES = 32  # the key's own bytes at each end of a sparse block


def block_for(key: bytes, block_bytes: int, era: int = 0) -> bytes:
    """The bytes the kit stores under ``key``: a function of the key, so a load
    that returns another key's bytes is always detectable. One key in four holds a sparse block, as
    an engine's padding blocks are: zeros between 32 bytes of its own at each end, so a tier that
    compresses (or deduplicates) meets blocks that shrink; the others hold bytes that do not.
    ``era``: the same key stored again after a ``reset_cache`` (new weights: the same tokens, other
    KV bytes) holds other bytes in each era; era 0 is every check's but the one storing anew.
    The keys of :func:`same_bytes_pool` all hold one block (an engine's many all-padding blocks: what a
    deduplicating tier stores once)."""
    seed = _SAME_BYTES_SEED if key in _SAME_BYTES else key
    digest = hashlib.shake_256(b"kvproto-kit-block:" + seed + (b"" if not era else b"#era" + era.to_bytes(4, "big")))
    if digest.digest(1)[0] & 3 or block_bytes <= 4 * _TAG_BYTES:
        return digest.digest(block_bytes)
    tag = digest.digest(2 * _TAG_BYTES)
    return tag[:_TAG_BYTES] + bytes(block_bytes - 2 * _TAG_BYTES) + tag[_TAG_BYTES:]


def same_bytes_pool() -> tuple[OffloadKey, ...]:
    """64 distinct keys whose :func:`block_for` is one and the same block (per size and era): stored together
    they are the duplicates a content-addressed tier keeps once (TIER-29)."""
    return _SAME_BYTES_POOL


def sentinel_for(slot: int, block_bytes: int) -> bytes:
    """The filler of an idle primary slot, distinct per slot and from every block."""
    return hashlib.shake_256(b"kvproto-kit-sentinel:" + slot.to_bytes(8, "big")).digest(block_bytes)


def key_pool(tag: str, count: int, *, group: int = 0) -> list[OffloadKey]:
    """``count`` distinct keys whose hashes start with ``tag`` (one namespace per check)."""
    return [
        make_key(hashlib.blake2b(f"{tag}:{i}".encode(), digest_size=16).digest(), group)
        for i in range(count)
    ]


_SAME_BYTES_SEED = b"kvproto-kit-same-bytes"
_SAME_BYTES_POOL: tuple[OffloadKey, ...] = tuple(key_pool("same-bytes", 64))
_SAME_BYTES: frozenset[bytes] = frozenset(_SAME_BYTES_POOL)


def tricky_keys() -> list[OffloadKey]:
    """Keys that differ only in hash or only in group, and hashes a careless tier could
    confuse when it turns a key into a file name, a URL or a string."""
    hashes = [
        b"\x00",
        b"\x00\x00",
        b"/",
        b"..",
        b"a/b",
        b"%2F",
        b"A",
        b"a",
        b"ab",
        b"ab\x00",
        b"\xff" * 32,
        b"\xff" * 31 + b"\xfe",
        bytes(range(64)),
    ]
    keys: list[OffloadKey] = []
    for h in hashes:
        for group in (0, 1, 256, 2**32 - 1):
            keys.append(make_key(h, group))
    return keys


def row(buffer: memoryview, slot: int) -> memoryview:
    """Row ``slot`` of a 2-D primary buffer as a 1-D writable view."""
    if buffer.ndim != 2 or buffer.shape is None:
        raise InvalidArgumentError(f"the primary buffer must be 2-D (slots, block bytes), got ndim={buffer.ndim}")
    block_bytes = buffer.shape[1]
    return buffer.cast("B")[slot * block_bytes : (slot + 1) * block_bytes]


def differing_bytes(want: bytes, got: bytes) -> str:
    """Where ``got`` differs from ``want``, in words: the first wrong byte's offset and values, and
    how many bytes differ in all (the root cause of a TIER-10 failure, KIT-18)."""
    wrong = [i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b]
    if len(want) != len(got):
        return f"{len(got)} bytes where {len(want)} were stored"
    if not wrong:
        return "no byte differs"
    first = wrong[0]
    at = f"at offset {first} (0x{got[first]:02x} where 0x{want[first]:02x} was stored)"
    return f"one wrong byte, {at}" if len(wrong) == 1 else f"{len(wrong)} wrong bytes, the first {at}"
