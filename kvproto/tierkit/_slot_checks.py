"""Argument checks of :class:`~kvproto.tierkit.SlotTable`: configuration and key batches (CPU-1, CPU-8, MEM-10).

Bad configuration is a :class:`~kvproto.errors.ConfigurationError` naming the
argument; a single key or ``str`` where a batch is expected, or a non-bytes
key, an :class:`~kvproto.errors.InvalidArgumentError` naming the method and
the culprit, raised before anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from kvproto._keys import OffloadKey
from kvproto.errors import ConfigurationError, InvalidArgumentError, InvalidKeyError
from kvproto.tierkit._eviction import ArcPolicy, EvictionPolicy, LruPolicy

__all__ = ["check_config", "check_not_a_single_key", "key_batch", "make_policy_of"]

# A single key passed where a batch is expected iterates as characters or ints.
_NOT_A_BATCH = (str, bytes, bytearray, memoryview)
_POLICY_METHODS = ("admit", "touch", "evict", "remove", "clear", "select_victims")


def check_config(owner: str, num_slots: object, pending_deadline_s: object, name: object, clock: object) -> None:
    """Raise ConfigurationError naming the first bad argument."""
    if type(num_slots) is not int or num_slots < 1:
        raise ConfigurationError(f"{owner}: num_slots must be an int >= 1, got {num_slots!r}")
    if pending_deadline_s is not None and (
        type(pending_deadline_s) not in (int, float) or not cast(float, pending_deadline_s) > 0.0  # NaN fails too
    ):
        raise ConfigurationError(
            f"{owner}: pending_deadline_s must be None or a number > 0, got {pending_deadline_s!r}"
        )
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"{owner}: name must be a non-empty str, got {name!r}")
    if not callable(clock):
        raise ConfigurationError(f"{owner}: clock must be callable, got {clock!r}")


def make_policy_of(owner: str, policy: object, num_slots: int) -> EvictionPolicy:
    """The policy named by ``policy``, or ``policy`` itself if it has an EvictionPolicy's methods (CPU-6)."""
    if policy == "lru":
        return LruPolicy()
    if policy == "arc":
        return ArcPolicy(num_slots)
    if not isinstance(policy, str) and all(callable(getattr(policy, m, None)) for m in _POLICY_METHODS):
        return cast(EvictionPolicy, policy)
    raise ConfigurationError(f"{owner}: policy must be 'lru', 'arc' or an EvictionPolicy, got {policy!r}")


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
