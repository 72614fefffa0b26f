"""The key-batch rules every batch-taking method shares (MGR-11, MGR-20, CPU-8, MEM-10).

A single key or ``str`` where a batch is expected is an
:class:`~kvproto.errors.InvalidArgumentError` naming the method and the culprit,
and a non-bytes key an :class:`~kvproto.errors.InvalidKeyError` naming it, both
raised before anything changes. They sit below both the tiers built from
:mod:`kvproto.tierkit` and the tiering manager (:mod:`kvproto._tiering`), which
use them alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from kvproto._keys import OffloadKey
from kvproto.errors import InvalidArgumentError, InvalidKeyError

__all__ = ["check_not_a_single_key", "key_batch"]

# A single key passed where a batch is expected iterates as characters or ints.
_NOT_A_BATCH = (str, bytes, bytearray, memoryview)


def check_not_a_single_key(tier: str, method: str, keys: object) -> None:
    """InvalidArgumentError if ``keys`` is one key or a ``str`` (it would iterate as ints or characters)."""
    if isinstance(keys, _NOT_A_BATCH):
        raise InvalidArgumentError(
            f"{tier}: {method} takes a sequence of keys, got a single {type(keys).__name__} {keys!r}; pass one key as [key]"
        )


def key_batch(tier: str, method: str, keys: Iterable[object]) -> tuple[OffloadKey, ...]:
    """``keys`` read once, as a tuple, each checked to be ``bytes``; InvalidKeyError naming the culprit."""
    given: object = keys
    if type(given) is tuple and len(given) == 1 and type(given[0]) is bytes:
        return given  # the common single-key call, already checked (no cast: this is the promotion path)
    check_not_a_single_key(tier, method, given)
    batch = tuple(keys)
    for position, key in enumerate(batch):
        if not isinstance(key, bytes):
            raise InvalidKeyError(
                f"{tier}: {method}: key #{position} is {key!r} of type {type(key).__name__}, not bytes"
            )
    return cast(tuple[OffloadKey, ...], batch)
