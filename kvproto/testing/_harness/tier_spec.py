"""How a tier presents itself to the kit: :class:`TierSpec` (KIT-9).

A tier's distribution registers a callable returning a TierSpec under the
``kvproto.tiers`` entry-point group; ``kvproto conform NAME`` builds the kit
from it. Importing this module imports neither pytest nor Hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from kvproto._capabilities import Capabilities
from kvproto._protocols import PrimaryTier, SecondaryTier
from kvproto.testing._harness.data import make_buffer
from kvproto.testing._harness.settings import KitLimits

__all__ = ["SECONDARY_BLOCK_BYTES", "SECONDARY_NUM_SLOTS", "TierKind", "TierSpec", "shut_down_probe"]

#: The primary buffer the kit gives a secondary tier: this many slots...
SECONDARY_NUM_SLOTS = 32
#: ...of this many bytes.
SECONDARY_BLOCK_BYTES = 64

TierKind = Literal["primary", "secondary"]


@dataclass(frozen=True)
class TierSpec:
    """One tier as the kit sees it (KIT-9).

    * ``factory``: builds an EMPTY tier: ``factory(buffer)`` for a secondary
      tier (``buffer`` is the primary slot buffer), ``factory()`` for a primary.
    * ``capabilities``: ``None`` reads the tier's ``capabilities`` attribute.
    * ``hooks``: backdoor hooks by name (``seed_block``, ``read_block``,
      ``fail_next_jobs``, ``fail_keys``, ``corrupt_on_read``, ``reopen``),
      each called with the tier first.
    * ``expected_failures``: ``{check name: reason}``.
    * ``tier_class``: the class ``kvproto typecheck`` checks; ``None`` takes
      the class of a built tier.
    * ``block_bytes``: the row length of a secondary tier's primary buffer (default 64); a multiple
      of 4,096 gives page-aligned rows (a tier's O_DIRECT path, KIT-9).
    """

    name: str
    kind: TierKind
    factory: Callable[..., Any]
    capabilities: Capabilities | None = None
    hooks: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    expected_failures: Mapping[str, str] = field(default_factory=dict)
    limits: KitLimits = field(default_factory=KitLimits)
    tier_class: type | None = None
    description: str = ""
    block_bytes: int = SECONDARY_BLOCK_BYTES

    def build(self) -> object:
        """One tier built by ``factory`` (on a fresh buffer for a secondary tier)."""
        if self.kind == "primary":
            return self.factory()
        return self.factory(make_buffer(SECONDARY_NUM_SLOTS, self.block_bytes))

    @property
    def protocol(self) -> type:
        """The protocol a tier of this kind satisfies: ``PrimaryTier`` or ``SecondaryTier`` (TIER-1)."""
        return PrimaryTier if self.kind == "primary" else SecondaryTier

    def missing_members(self, tier: object) -> list[str]:
        """The members of :attr:`protocol` that ``tier`` lacks, in alphabetical order (TIER-1)."""
        return [name for name in _members(self.protocol) if not _has(tier, name)]

    def not_a_tier(self, tier: object, *, brief: bool = False) -> str | None:
        """Why ``tier``, as the factory built it, cannot be checked at all: it is not a tier, or
        it lacks members of its protocol (TIER-1); None when it has them all. ``brief``: in a
        few words (for the checks skipped because of it)."""
        missing = self.missing_members(tier)
        if not missing:
            return None
        protocol = self.protocol.__name__
        kind = type(tier)
        named = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        if len(missing) == len(_members(self.protocol)) or not any(
            callable(getattr(tier, m, None)) for m in ("lookup", "shutdown")
        ):
            if brief:
                return f"what the factory returned (of type {named}) is not a {protocol}"
            shown = repr(tier)
            shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
            return f"the factory returned {shown}, of type {named}, not a {protocol}: it lacks {', '.join(missing)}"
        if brief:
            return f"{kind.__name__} lacks {', '.join(missing)}"
        return f"{kind.__name__} lacks {protocol} member(s): {', '.join(missing)}"

    def resolved_class(self) -> type:
        """``tier_class``, else the class of a tier built and shut down at once."""
        if self.tier_class is not None:
            return self.tier_class
        tier = self.build()
        shut_down_probe(tier)
        return type(tier)


def shut_down_probe(tier: object) -> None:
    """Shut down a tier built only to be looked at (its class, its capabilities), if it can be."""
    shutdown = getattr(tier, "shutdown", None)
    if callable(shutdown):
        shutdown()




def _members(protocol: type) -> list[str]:
    return sorted(name for name in dir(protocol) if not name.startswith("_"))


def _has(tier: object, name: str) -> bool:
    """Whether ``tier`` has member ``name``; a property that raises something else still exists."""
    try:
        getattr(tier, name)
    except AttributeError:
        return False
    except Exception:
        return True
    return True
