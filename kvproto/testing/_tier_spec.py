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
from kvproto.testing._data import make_buffer
from kvproto.testing._settings import KitLimits

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

    def build(self) -> object:
        """One tier built by ``factory`` (on a fresh buffer for a secondary tier)."""
        if self.kind == "primary":
            return self.factory()
        return self.factory(make_buffer(SECONDARY_NUM_SLOTS, SECONDARY_BLOCK_BYTES))

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


