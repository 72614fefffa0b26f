"""LMCache's ``ObjectKey`` as a kvproto ``OffloadKey`` (``lmcache/v1/distributed/api.py``).

An ``ObjectKey`` is a chunk hash plus the model, the KV rank, the object group and a cache salt;
every field takes part in its identity (two salts never share a block). A kvproto key is a block
hash followed by the 4-byte big-endian group index. The translation: a 16-byte BLAKE2b digest over
the model, rank, salt and chunk hash (length-prefixed, so no two keys collide by concatenation),
then ``object_group_id``. It is deterministic across processes: tiers shared between LMCache
instances see the same keys.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvproto import OffloadKey, make_key

__all__ = ["to_offload_key"]


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def to_offload_key(key: Any) -> OffloadKey:
    """The kvproto key of LMCache's ``key`` (an ``ObjectKey``)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (key.model_name.encode(), str(key.kv_rank).encode(), key.cache_salt.encode(), bytes(key.chunk_hash)):
        digest.update(_field(part))
    return make_key(digest.digest(), int(key.object_group_id))
