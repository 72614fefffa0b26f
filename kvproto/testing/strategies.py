"""Hypothesis strategies for tier authors: keys, blocks and job sequences.

Use them in your own ``@given`` tests, beside the kit's checks::

    from hypothesis import given
    from kvproto.testing import strategies as kvst

    @given(kvst.sibling_keys())
    def test_my_tier_keeps_siblings_apart(pair): ...

    @given(kvst.job_sequences())
    def test_my_tier_survives_any_jobs(ops): ...

Keys are offload keys as :func:`kvproto.make_key` builds them: hash bytes
followed by a 4-byte big-endian group index (KEY-1). :func:`keys` mixes random
keys with the kit's tricky ones (keys that differ only in hash or only in
group, hashes that look like paths or escapes); :func:`sibling_keys` draws
pairs that differ in exactly one part. :func:`job_sequences` draws what a
scheduler does to a secondary tier: :class:`StoreOp`, :class:`LoadOp`,
:class:`LookupOp` and :class:`StepOp`, over a small pool of keys so that
operations meet on the same blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import strategies as st

from kvproto._keys import MAX_GROUP, OffloadKey, make_key
from kvproto.testing._harness.data import tricky_keys

__all__ = [
    "JobOp",
    "LoadOp",
    "LookupOp",
    "StepOp",
    "StoreOp",
    "block_hashes",
    "blocks",
    "groups",
    "job_sequences",
    "key_lists",
    "keys",
    "sibling_keys",
]

#: Group indices a careless tier gets wrong: zero, one, a byte boundary, the largest.
_EDGE_GROUPS = (0, 1, 255, 256, 2**16, MAX_GROUP)


def block_hashes(*, min_size: int = 1, max_size: int = 32) -> st.SearchStrategy[bytes]:
    """Block hashes: non-empty bytes (KEY-2), any value, including NUL, ``/`` and ``..``."""
    return st.binary(min_size=max(min_size, 1), max_size=max_size)


def groups() -> st.SearchStrategy[int]:
    """KV-cache group indices, ``0..2**32-1`` (KEY-1), edge values often."""
    return st.one_of(st.sampled_from(_EDGE_GROUPS), st.integers(min_value=0, max_value=MAX_GROUP))


def keys(*, tricky: bool = True) -> st.SearchStrategy[OffloadKey]:
    """Offload keys: ``make_key(hash, group)`` for random hashes and groups and, unless
    ``tricky=False``, the kit's tricky keys (:func:`kvproto.testing.tricky_keys`)."""
    built = st.builds(make_key, block_hashes(), groups())
    if not tricky:
        return built
    return st.one_of(st.sampled_from(tricky_keys()), built)


def _siblings(
    hashes: tuple[bytes, bytes], groups_: tuple[int, int], same_hash: bool
) -> tuple[OffloadKey, OffloadKey]:
    if same_hash:
        return make_key(hashes[0], groups_[0]), make_key(hashes[0], groups_[1])
    return make_key(hashes[0], groups_[0]), make_key(hashes[1], groups_[0])


def sibling_keys() -> st.SearchStrategy[tuple[OffloadKey, OffloadKey]]:
    """Two different keys that differ only in hash or only in group: a tier that keys its
    storage by the hash alone, or by a lossy rendering of the key, confuses them."""
    hash_pairs = st.tuples(block_hashes(), block_hashes()).filter(lambda pair: pair[0] != pair[1])
    group_pairs = st.tuples(groups(), groups()).filter(lambda pair: pair[0] != pair[1])
    return st.builds(_siblings, hash_pairs, group_pairs, st.booleans())


def key_lists(
    pool: Sequence[OffloadKey] | None = None,
    *,
    min_size: int = 1,
    max_size: int | None = 3,
    unique: bool = True,
) -> st.SearchStrategy[list[OffloadKey]]:
    """Lists of keys for one job: drawn from ``pool`` (so jobs meet on the same blocks), or
    from :func:`keys` without one; ``unique`` keeps a key from appearing twice in a list;
    ``max_size=None`` bounds a list by the pool alone."""
    element = keys() if pool is None else st.sampled_from(tuple(pool))
    return st.lists(element, min_size=min_size, max_size=max_size, unique=unique)


def blocks(block_bytes: int) -> st.SearchStrategy[bytes]:
    """The bytes of one block: exactly ``block_bytes`` bytes, any value."""
    return st.binary(min_size=block_bytes, max_size=block_bytes)


@dataclass(frozen=True, slots=True)
class StoreOp:
    """Store ``keys`` (one store job: the primary's rows for the keys copied into the tier)."""

    keys: tuple[OffloadKey, ...]


@dataclass(frozen=True, slots=True)
class LoadOp:
    """Load ``keys`` (one load job: the tier's blocks copied into primary rows)."""

    keys: tuple[OffloadKey, ...]


@dataclass(frozen=True, slots=True)
class LookupOp:
    """Look ``key`` up."""

    key: OffloadKey


@dataclass(frozen=True, slots=True)
class StepOp:
    """End a scheduler step: ``on_step_end`` then ``get_finished_jobs``."""


JobOp = StoreOp | LoadOp | LookupOp | StepOp
"""One operation of a job sequence."""


def _ops(pool: Sequence[OffloadKey], min_size: int, max_size: int, max_keys: int) -> st.SearchStrategy[list[JobOp]]:
    batch = key_lists(pool, max_size=max_keys).map(tuple)
    op: st.SearchStrategy[JobOp] = st.one_of(
        batch.map(StoreOp),
        batch.map(LoadOp),
        st.sampled_from(tuple(pool)).map(LookupOp),
        st.just(StepOp()),
    )
    return st.lists(op, min_size=min_size, max_size=max_size)


def job_sequences(
    pool: Sequence[OffloadKey] | None = None,
    *,
    min_size: int = 1,
    max_size: int = 20,
    max_keys: int = 3,
) -> st.SearchStrategy[list[JobOp]]:
    """Sequences of store, load, lookup and step operations over a key pool.

    ``pool``: the keys the operations use; without one, each sequence draws its
    own pool of two to eight :func:`keys`. A store or load names one to
    ``max_keys`` distinct keys. Loads may name keys never stored (the tier must
    fail them), lookups any key of the pool.
    """
    if pool is not None:
        return _ops(tuple(pool), min_size, max_size, max_keys)
    pools = st.lists(keys(), min_size=2, max_size=8, unique=True)
    return pools.flatmap(lambda drawn: _ops(drawn, min_size, max_size, max_keys))
