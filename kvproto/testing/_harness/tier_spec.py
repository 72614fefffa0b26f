"""How a tier presents itself to the kit: :class:`TierSpec` (KIT-9).

Defined below the kit, in :mod:`kvproto._tier_spec`, since an engine adapter hosting a tier by
name resolves the same specs (:mod:`kvproto.hosting`); the kit's modules import it from here.
Importing this module imports neither pytest nor Hypothesis.
"""

from __future__ import annotations

from kvproto._tier_spec import SECONDARY_BLOCK_BYTES, SECONDARY_NUM_SLOTS, TierKind, TierSpec, shut_down_probe

__all__ = ["SECONDARY_BLOCK_BYTES", "SECONDARY_NUM_SLOTS", "TierKind", "TierSpec", "shut_down_probe"]
