"""What a tier declares it can do, so the conformance kit runs only the checks that apply."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Capabilities"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """A tier's declared abilities (TIER-18).

    A declaration is a claim, never a way to be checked less: an ability
    declared must hold, and one not declared is a promise never to do it
    (CAP-1..CAP-5: no eviction means no block is ever dropped, no
    ``async_lookup`` no RETRY, no ``partial_jobs`` whole jobs), which the kit
    checks. A check that only applies with (or only without) an ability is
    skipped with that ability named, and ``kvproto conform`` names the clause
    left unchecked. ``reasons`` says, per
    ability name, why the tier lacks it (or anything an author wants a
    report to show), e.g. ``{"persistence": "in-memory by design"}``.

    * ``async_lookup``: lookups may answer RETRY while a check is pending;
      every RETRY resolves within ``max_retry_steps`` end-of-step hooks.
    * ``persistence``: a new instance over the same storage sees stored blocks.
    * ``eviction``: the tier may drop stored blocks on its own.
    * ``sharing``: several processes may use one storage at once.
    * ``partial_jobs``: a job may finish with only some of its keys done.
    * ``lru``: with ``eviction``, the least recently used block goes first, and ``touch`` makes a
      block recently used (CAP-6).
    * ``holds_hits``: a key answered HIT loads its bytes within
      ``max_hold_steps`` end-of-step hooks even if another instance on the
      same storage deleted or replaced the block meanwhile; the tier exposes
      ``held_hits`` (read handles held now), 0 once the load that used one is
      reported, every request that asked finished, after ``reset_cache`` or
      ``shutdown``, and ``max_hold_steps`` hooks after the HIT (TIER-26; BlobTier: TIERKIT-6).
    """

    async_lookup: bool = False
    max_retry_steps: int = 0
    persistence: bool = False
    eviction: bool = False
    sharing: bool = False
    partial_jobs: bool = False
    lru: bool = False
    holds_hits: bool = False
    max_hold_steps: int = 0
    reasons: Mapping[str, str] = field(default_factory=dict)

    def has(self, ability: str) -> bool:
        """True if the tier declares ``ability`` (a field name above)."""
        value = getattr(self, ability, None)
        return value is True
