"""kvproto-vllm: a bridge between kvproto and vLLM 0.33's KV-offload tiering.

* Direction 1, :class:`KvprotoTier`: any kvproto secondary tier as a vLLM secondary tier, loaded
  from vLLM's tier configuration ``{"type": "KvprotoTier", "module_path": "kvproto_vllm",
  "tier": "<kvproto tier>", "options": {...}}``.
* Direction 2, :class:`VllmSecondaryTier` and :class:`VllmPrimaryTier`: vLLM's own tiers as kvproto
  tiers, registered as ``vllm-example``, ``vllm-fs``, ``vllm-fs-direct``, ``vllm-cpu`` and
  ``vllm-cpu-arc`` so ``kvproto conform vllm-fs`` runs the conformance kit on vLLM's code.

See ``docs/kvproto-and-vllm.md`` in kvproto's repository.
"""

from __future__ import annotations

from kvproto import PrimaryTier, SecondaryTier

from kvproto_vllm._imports import MODULE_LEVEL, import_vllm

for _module in MODULE_LEVEL:  # before the modules below import them: a missing one named, with the remedy
    import_vllm(_module, "kvproto-vllm")

from kvproto_vllm._as_kvproto import VllmPrimaryTier, VllmSecondaryTier  # noqa: E402 (after the check above)
from kvproto_vllm._as_vllm import KvprotoTier, as_slot_buffer, build_kvproto_tier  # noqa: E402

__all__ = ["KvprotoTier", "VllmPrimaryTier", "VllmSecondaryTier", "as_slot_buffer", "build_kvproto_tier"]


def _protocols_hold(secondary: VllmSecondaryTier, primary: VllmPrimaryTier) -> tuple[SecondaryTier, PrimaryTier]:
    """Never called: strict mypy proves here that the wrappers satisfy kvproto's protocols (TIER-1)."""
    return secondary, primary
