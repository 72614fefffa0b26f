"""Offload keys: a block hash followed by a 4-byte big-endian group index (KEY-1..KEY-3)."""

from __future__ import annotations

from typing import NewType

from kvproto.errors import InvalidKeyError

__all__ = ["GROUP_BYTES", "MAX_GROUP", "OffloadKey", "make_key", "split_key"]

OffloadKey = NewType("OffloadKey", bytes)
"""A block key: ``block_hash + group.to_bytes(4, "big")`` (KEY-1)."""

GROUP_BYTES = 4
MAX_GROUP = 2**32 - 1


def make_key(block_hash: bytes, group: int) -> OffloadKey:
    """Build the key of ``block_hash`` in KV-cache group ``group`` (KEY-1, KEY-2).

    Raises :class:`~kvproto.errors.InvalidKeyError` if ``block_hash`` is not
    non-empty ``bytes`` or ``group`` is not an ``int`` in ``0..2**32-1``.
    """
    if not isinstance(block_hash, bytes):
        raise InvalidKeyError(
            f"block_hash must be bytes, got {type(block_hash).__name__}: {block_hash!r}"
        )
    if len(block_hash) == 0:
        raise InvalidKeyError("block_hash must not be empty")
    if isinstance(group, bool) or not isinstance(group, int):
        raise InvalidKeyError(f"group must be an int, got {type(group).__name__}: {group!r}")
    if not 0 <= group <= MAX_GROUP:
        raise InvalidKeyError(f"group must be in 0..{MAX_GROUP}, got {group}")
    return OffloadKey(block_hash + group.to_bytes(GROUP_BYTES, "big"))


def split_key(key: bytes) -> tuple[bytes, int]:
    """Split a key into ``(block_hash, group)``; the inverse of :func:`make_key` (KEY-3).

    Raises :class:`~kvproto.errors.InvalidKeyError` if ``key`` is not bytes
    or is shorter than 5 bytes (one hash byte plus the group index).
    """
    if not isinstance(key, bytes):
        raise InvalidKeyError(f"key must be bytes, got {type(key).__name__}: {key!r}")
    if len(key) <= GROUP_BYTES:
        raise InvalidKeyError(
            f"key must be at least {GROUP_BYTES + 1} bytes (hash + 4-byte group), "
            f"got {len(key)}: {key!r}"
        )
    return key[:-GROUP_BYTES], int.from_bytes(key[-GROUP_BYTES:], "big")
