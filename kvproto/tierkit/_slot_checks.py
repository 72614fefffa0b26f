"""Configuration checks of :class:`~kvproto.tierkit.SlotTable` (CPU-1, CPU-6, MEM-10).

Bad configuration is a :class:`~kvproto.errors.ConfigurationError` naming the
argument. The key-batch rules (a single key where a batch is expected, a
non-bytes key) are :mod:`kvproto._key_batches`, below both the tiers and the
tiering manager.
"""

from __future__ import annotations

from typing import cast

from kvproto.errors import ConfigurationError
from kvproto.tierkit._eviction import ArcPolicy, EvictionPolicy, LruPolicy

__all__ = ["check_config", "make_policy_of"]

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
